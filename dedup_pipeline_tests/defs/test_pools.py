"""The `warehouse` pool's limit on a PostgreSQL instance: set before the steps would, whatever the instance holds."""

from __future__ import annotations

import threading
from contextlib import contextmanager

import dagster as dg
import pytest

from dedup_pipeline.defs.pools import WAREHOUSE_POOL, ensure_pool_limits, pool_limit
from dedup_pipeline_tests.helpers import database_url, fresh_database

pytestmark = pytest.mark.postgres


@contextmanager
def postgres_instances(tmp_path):
    """`instance(default_limit)`: a Dagster instance on one fresh PostgreSQL database (dagster-postgres) whose
    dagster.yaml sets the pools' default limit, as an operator's edit of it would."""
    made = []
    with fresh_database("dagster_pools") as name:
        url = database_url(name).replace("postgresql+psycopg:", "postgresql+psycopg2:")

        def instance(default_limit: int) -> dg.DagsterInstance:
            home = tmp_path / f"home-{len(made)}"
            home.mkdir()
            (home / "dagster.yaml").write_text(
                f"storage:\n  postgres:\n    postgres_url: {url}\n"
                f"concurrency:\n  pools:\n    default_limit: {default_limit}\n"
            )
            made.append(dg.DagsterInstance.from_config(str(home)))
            return made[-1]

        try:
            yield instance
        finally:
            for one in made:
                one.dispose()


@dg.asset(pool=WAREHOUSE_POOL)
def writes_the_warehouse() -> int:
    return 1


def limit_of(instance: dg.DagsterInstance):
    limit = pool_limit(instance, WAREHOUSE_POOL)
    assert limit is not None, "the pool has no limit"
    return limit


def test_dagster_cannot_set_a_changed_default_limit_on_postgresql(tmp_path):
    """Breaks: the pool's default limit was set to 2 by a run; the operator changes `default_limit` to 3.

    Must hold, while dagster-io/dagster#33552 is open (the reason for `ensure_pool_limits`; when this test
    fails, Dagster sets it itself and the workaround can go): Dagster's own update of the limit fails, and so
    does every run whose step claims a slot of the pool."""
    with postgres_instances(tmp_path) as instance:
        before = instance(2)
        assert dg.materialize([writes_the_warehouse], instance=before).success
        after = instance(3)
        with pytest.raises(Exception, match="InFailedSqlTransaction"):
            after.event_log_storage.initialize_concurrency_limit_to_default(WAREHOUSE_POOL)
        assert not dg.materialize([writes_the_warehouse], instance=after, raise_on_error=False).success


def test_a_changed_default_limit_is_set_again_before_a_run(tmp_path):
    """Breaks: as above, `default_limit` changed from 2 to 3 on a PostgreSQL instance after a run set the limit.

    Must hold: `ensure_pool_limits` sets the limit to 3, still the default's, and the next run succeeds; a
    second call changes nothing."""
    with postgres_instances(tmp_path) as instance:
        before = instance(2)
        ensure_pool_limits(before)
        assert (limit_of(before).limit, limit_of(before).from_default) == (2, True)
        after = instance(3)
        ensure_pool_limits(after)
        ensure_pool_limits(after)
        assert (limit_of(after).limit, limit_of(after).from_default) == (3, True)
        assert dg.materialize([writes_the_warehouse], instance=after).success


def test_an_operators_limit_is_kept(tmp_path):
    """Breaks: an operator set the pool's limit to 5 (`dagster instance concurrency set warehouse 5`).

    Must hold: `ensure_pool_limits` leaves it at 5, the operator's, whatever the default."""
    with postgres_instances(tmp_path) as instance:
        one = instance(2)
        one.event_log_storage.set_concurrency_slots(WAREHOUSE_POOL, 5)
        ensure_pool_limits(one)
        assert (limit_of(one).limit, limit_of(one).from_default) == (5, False)


def test_processes_setting_a_new_instances_limit_at_once_all_succeed(tmp_path):
    """Breaks: four processes (an instance each) set the pool's limit of a new instance at the same moment, as
    the lanes of `dedup-pipeline run` or two runs queued together would.

    Must hold: none fails (a refused write is looked at again), and the limit is the default."""
    with postgres_instances(tmp_path) as instance:
        instances = [instance(2) for _ in range(4)]
        start, errors = threading.Barrier(len(instances)), []

        def ensure(one: dg.DagsterInstance) -> None:
            start.wait()
            try:
                ensure_pool_limits(one)
            except Exception as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        threads = [threading.Thread(target=ensure, args=(one,)) for one in instances]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        assert errors == []
        assert (limit_of(instances[0]).limit, limit_of(instances[0]).from_default) == (2, True)
