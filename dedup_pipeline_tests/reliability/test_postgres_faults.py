"""PostgreSQL connections dropped mid-batch (`pg_terminate_backend` from another connection), made deterministic.

Either every backend of the warehouse is terminated right after a chunk
commits, or a rung is made to wait on a lock the test holds in the middle of
its transaction and its backend is terminated while it waits. The step must
fail cleanly (a database error, nothing half-written) or retry, and after the
retry the tables must equal one clean run.
"""

from __future__ import annotations

import threading
import time

import dagster as dg
import pytest
from sqlalchemy import and_, create_engine, func, select, text
from sqlalchemy.exc import DBAPIError

from dedup_pipeline.defs.assets import COLLAPSE_CHECK, ladder_assets
from dedup_pipeline.defs.checks import ladder_checks
from dedup_pipeline.defs.partitions import crawl_batches_partitions
from dedup_pipeline.defs.resources import (
    ChecksResource,
    NearDupResource,
    SeenSetResource,
)
from dedup_pipeline.ladder.canonical import canonicalise_batch
from dedup_pipeline.ladder.exact import deduplicate_batch
from dedup_pipeline.ladder.near import cluster_batch
from dedup_pipeline.ladder.raw import ingest_raw_batch
from dedup_pipeline.ladder.settings import NearSettings
from dedup_pipeline.landing import find_batch
from dedup_pipeline.quality.history import first_decision_counts
from dedup_pipeline.store.schema import canonical_records, crawl_batches, dedup_decisions, quarantine, records
from dedup_pipeline.store.seen_set import NoSeenSet
from dedup_pipeline_tests.defs.common import ladder_resources
from dedup_pipeline_tests.helpers import listing, snapshot, write_batch
from dedup_pipeline_tests.reliability.ladder_run import (
    NEAR,
    SETTINGS,
    assert_one_row_per_key_and_content,
    clean_run,
    count,
)

pytestmark = pytest.mark.parametrize("warehouse_url", ["postgresql"], indirect=True)

CHUNK = SETTINGS.chunk_size


def terminate_other_backends(url: str) -> list[int]:
    """pg_terminate_backend for every other connection to the warehouse database."""
    admin = create_engine(url, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            pids = (
                conn.execute(
                    text(
                        "SELECT pid FROM pg_stat_activity "
                        "WHERE datname = current_database() AND pid <> pg_backend_pid()"
                    )
                )
                .scalars()
                .all()
            )
            return [
                pid for pid in pids if conn.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid}).scalar()
            ]
    finally:
        admin.dispose()


class TerminateWhenBlocked:
    """Hold a lock in an open transaction; when a backend waits on it, terminate that backend, then release.

    Deterministic: the victim is caught in the middle of its transaction, at
    the statement that needs the lock, whatever the timing.
    """

    def __init__(self, url: str, lock_sql: str, release_at_once: bool = False):
        self.release_at_once = release_at_once  # let the victim's retry through, without waiting for `release`
        self.engine = create_engine(url)
        self.conn = self.engine.connect()
        self.conn.execute(text(lock_sql))  # the transaction stays open: the lock is held
        self.victim: tuple[int, str] | None = None
        self.thread = threading.Thread(target=self._watch, daemon=True)
        self.thread.start()

    def _watch(self) -> None:
        watcher = self.engine.connect().execution_options(isolation_level="AUTOCOMMIT")
        try:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                row = watcher.execute(
                    text(
                        "SELECT pid, query FROM pg_stat_activity WHERE datname = current_database() "
                        "AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()"
                    )
                ).first()
                if row:
                    watcher.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": row.pid})
                    self.victim = (row.pid, row.query)
                    if self.release_at_once:
                        self.conn.rollback()
                    return
                time.sleep(0.01)
        finally:
            watcher.close()

    def release(self) -> tuple[int, str] | None:
        self.thread.join(timeout=60)
        self.conn.rollback()
        self.conn.close()
        self.engine.dispose()
        return self.victim


class AfterFirstCommit(NoSeenSet):
    """No fast path; after the first chunk of the exact rung commits (its `remember` call), run `fault` once."""

    def __init__(self, fault):
        self.fault, self.commits, self.result = fault, 0, None

    def remember(self, version, digests):
        self.commits += 1
        if self.commits == 1:
            self.result = self.fault()


@pytest.fixture
def staged(warehouse, tmp_path):
    """Batch a stored; batch b (re-crawls, price changes, new products) registered and canonicalised."""
    folder = tmp_path / "landing"
    write_batch(folder, "a", [listing(n) for n in range(40)], landed=1e9)
    write_batch(
        folder,
        "b",
        [listing(n, crawl_id="b", price="1.25" if n % 4 == 0 else f"{10 + n}.90") for n in range(20, 70)],
        landed=1e9 + 60,
    )
    for key in ("a", "b"):
        ingest_raw_batch(warehouse, find_batch(folder, key))
        canonicalise_batch(warehouse, key, SETTINGS)
    deduplicate_batch(warehouse, "a", "run-a", SETTINGS)
    cluster_batch(warehouse, "a", NearSettings(params=NEAR, chunk_size=CHUNK))
    return folder


def _finish_and_compare(warehouse, folder, tmp_path, run_id="run-b"):
    """Retry the exact rung (as Dagster's retry does), run the near rung, compare with one clean run."""
    report = deduplicate_batch(warehouse, "b", run_id, SETTINGS)
    cluster_batch(warehouse, "b", NearSettings(params=NEAR, chunk_size=CHUNK))
    assert snapshot(warehouse.engine) == clean_run(tmp_path, folder, ["a", "b"])
    assert_one_row_per_key_and_content(warehouse.engine)
    clean = first_decision_counts_of_clean(tmp_path)
    with warehouse.engine.connect() as conn:
        assert first_decision_counts(conn, ["b"])["b"] == clean  # the batch's real figures survive the crash
    return report


def first_decision_counts_of_clean(tmp_path):
    from dedup_pipeline.store.warehouse import Warehouse

    wh = Warehouse(f"sqlite:///{tmp_path / 'clean.sqlite'}")
    with wh.engine.connect() as conn:
        counts = first_decision_counts(conn, ["b"])["b"]
    wh.dispose()
    return counts


def test_exact_rung_connection_dropped_between_chunks(warehouse, warehouse_url, staged, tmp_path):
    """Breaks: every connection of the exact rung (its chunk reader and its writer) is terminated right after
    its first chunk commits.

    Must hold: the rung fails with a database error; exactly the first chunk
    is in the warehouse (its rows and its decisions, nothing of the second);
    re-running the rung finishes the batch, the tables equal one clean run and
    the batch's first decisions equal the clean run's.
    """
    fault = AfterFirstCommit(lambda: terminate_other_backends(warehouse_url))
    with pytest.raises(DBAPIError):
        deduplicate_batch(warehouse, "b", "run-b", SETTINGS, fault)
    assert fault.result  # backends were terminated
    logged = count(warehouse.engine, dedup_decisions, dedup_decisions.c.batch_id == "b")
    assert logged == CHUNK  # one whole chunk, no partial one
    report = _finish_and_compare(warehouse, staged, tmp_path)
    assert sum(report.decisions.values()) == 50


def test_exact_rung_connection_dropped_inside_a_chunk_transaction(warehouse, warehouse_url, staged, tmp_path):
    """Breaks: the exact rung's writer is terminated in the middle of its second chunk's transaction, after that
    chunk has inserted and updated rows (it waits for a lock on `dedup_decisions` the test holds).

    Must hold: the rung fails with a database error; the half-done chunk is
    rolled back entirely (rows of the warehouse are those of the first chunk
    only, and every row has its decision); re-running gives one clean run's tables.
    """
    holder = {}
    fault = AfterFirstCommit(
        lambda: holder.setdefault(
            "lock", TerminateWhenBlocked(warehouse_url, "LOCK TABLE dedup_decisions IN EXCLUSIVE MODE")
        )
    )
    try:
        with pytest.raises(DBAPIError):
            deduplicate_batch(warehouse, "b", "run-b", SETTINGS, fault)
    finally:
        victim = holder["lock"].release()
    assert victim and "dedup_decisions" in victim[1]  # it was waiting to log the second chunk's decisions
    with warehouse.engine.connect() as conn:
        logged_b = conn.execute(
            select(func.count()).select_from(dedup_decisions).where(dedup_decisions.c.batch_id == "b")
        ).scalar()
        rows_b = conn.execute(select(func.count()).select_from(records).where(records.c.last_batch_id == "b")).scalar()
        new_or_changed = conn.execute(
            select(func.count())
            .select_from(dedup_decisions)
            .where(dedup_decisions.c.batch_id == "b", dedup_decisions.c.decision.in_(["new", "changed"]))
        ).scalar()
        # every row dated b (written, or re-crawled unchanged) has b's logged decision for its key and line
        decided = dedup_decisions.join(
            records,
            and_(
                records.c.natural_key == dedup_decisions.c.natural_key,
                records.c.last_line_no == dedup_decisions.c.line_no,
            ),
        )
        backed_b = conn.execute(
            select(func.count())
            .select_from(decided)
            .where(records.c.last_batch_id == "b", dedup_decisions.c.batch_id == "b")
        ).scalar()
    assert logged_b == CHUNK  # the first chunk, whole; nothing of the second
    assert rows_b == backed_b >= new_or_changed
    _finish_and_compare(warehouse, staged, tmp_path)


@pytest.mark.parametrize(
    "rung, lock_sql",
    [
        ("raw", "SELECT * FROM crawl_batches WHERE batch_id = 'b' FOR UPDATE"),
        ("canonical", "SELECT * FROM quarantine WHERE batch_id = 'b' FOR UPDATE"),
    ],
    ids=["raw", "canonical"],
)
def test_staging_rung_connection_dropped_mid_transaction(warehouse, warehouse_url, staged, tmp_path, rung, lock_sql):
    """Breaks: re-materialising batch b's raw (or canonical) rung, its connection is terminated in the middle of
    its one transaction (after it deleted and rewrote part of the partition, waiting on a row lock the test holds).

    Must hold: the rung fails with a database error and the partition is
    exactly as it was before (registration, quarantine and canonical rows);
    running the rung again and the rest of the ladder gives one clean run's tables.
    """
    with open(staged / "b.jsonl", "ab") as handle:  # a bad line so both rungs have quarantine rows to rewrite
        handle.write(b'{"url": "javascript:void(0)"}\n{"broken\n')
    ingest_raw_batch(warehouse, find_batch(staged, "b"))
    canonicalise_batch(warehouse, "b", SETTINGS)

    def partition():
        with warehouse.engine.connect() as conn:
            return [
                sorted(tuple(r) for r in conn.execute(select(*t.c).where(t.c.batch_id == "b")))
                for t in (crawl_batches, quarantine, canonical_records)
            ]

    before = partition()
    lock = TerminateWhenBlocked(warehouse_url, lock_sql)
    try:
        with pytest.raises(DBAPIError):
            if rung == "raw":
                ingest_raw_batch(warehouse, find_batch(staged, "b"))
            else:
                canonicalise_batch(warehouse, "b", SETTINGS)
    finally:
        victim = lock.release()
    assert victim is not None
    assert partition() == before
    ingest_raw_batch(warehouse, find_batch(staged, "b"))
    canonicalise_batch(warehouse, "b", SETTINGS)
    _finish_and_compare(warehouse, staged, tmp_path)


class DroppingSeenSetResource(SeenSetResource):
    """The seen-set resource, except that the process's first chunk commit terminates the warehouse's connections."""

    def get(self):
        return _DROP_ONCE


_DROP_ONCE = AfterFirstCommit(lambda: terminate_other_backends(_DROP_URL[0]))
_DROP_URL: list[str] = []


def test_dagster_step_retries_after_the_connection_drops(warehouse, warehouse_url, tmp_path):
    """Breaks: inside a Dagster run of the ladder, every warehouse connection is terminated after the exact rung's
    first chunk commits.

    Must hold: the `deduplicated_records` step fails once and its retry
    policy runs it again; the run succeeds and the tables equal one clean run.
    """
    folder = tmp_path / "landing"
    write_batch(folder, "d", [listing(n) for n in range(30)], landed=1e9)
    _DROP_URL[:] = [warehouse_url]
    _DROP_ONCE.commits = 0
    instance = dg.DagsterInstance.ephemeral()
    instance.add_dynamic_partitions(crawl_batches_partitions.name, ["d"])
    result = dg.materialize(
        ladder_assets,
        partition_key="d",
        instance=instance,
        resources=ladder_resources(
            warehouse_url,
            folder,
            seen_set=DroppingSeenSetResource(kind="none"),
            near_dup=NearDupResource(chunk_size=CHUNK),
            chunk_size=CHUNK,
        ),
    )
    assert result.success and _DROP_ONCE.result
    retries = [e for e in result.all_events if e.event_type_value == "STEP_UP_FOR_RETRY"]
    assert [e.step_key for e in retries] == ["deduplicated_records"]
    assert snapshot(warehouse.engine) == clean_run(tmp_path, folder, ["d"])


class LockingChecksResource(ChecksResource):
    """The checks resource, except that the collapse check's first start locks the table it reads the batches'
    first-decision counts from (`exact_rung_runs`), and its backend is terminated once it waits on that lock (the
    lock then goes, so a retry gets through)."""

    def collapse_rules(self):
        if _CHECK_LOCK["url"] and _CHECK_LOCK["lock"] is None:
            _CHECK_LOCK["lock"] = TerminateWhenBlocked(
                _CHECK_LOCK["url"], "LOCK TABLE exact_rung_runs IN ACCESS EXCLUSIVE MODE", release_at_once=True
            )
        return super().collapse_rules()


_CHECK_LOCK: dict = {"url": None, "lock": None}


def _ladder_run(instance, url: str, folder, checks: ChecksResource) -> dg.ExecuteInProcessResult:
    resources = ladder_resources(
        url, folder, checks=checks, near_dup=NearDupResource(chunk_size=CHUNK), chunk_size=CHUNK
    )
    return dg.materialize(
        [*ladder_assets, *ladder_checks],
        partition_key="d",
        instance=instance,
        resources=resources,
        raise_on_error=False,
    )


def _retried_steps(result) -> list[str]:
    return [e.step_key for e in result.all_events if e.event_type_value == "STEP_UP_FOR_RETRY"]


def _one_batch(tmp_path):
    folder = tmp_path / "landing"
    write_batch(folder, "d", [listing(n) for n in range(30)], landed=1e9)
    instance = dg.DagsterInstance.ephemeral()
    instance.add_dynamic_partitions(crawl_batches_partitions.name, ["d"])
    return instance, folder


def test_an_asset_check_retries_after_its_connection_drops(warehouse, warehouse_url, tmp_path):
    """Breaks: the collapse-rate check's connection is terminated in the middle of its query (it waits on a lock
    taken as it starts, and its backend is killed while it waits), after the batch's data committed.

    Must hold: the check's step is retried like an asset's, and the run succeeds with the check's result (it
    once failed the run, though nothing was wrong with the data).
    """
    instance, folder = _one_batch(tmp_path)
    _CHECK_LOCK.update(url=warehouse_url, lock=None)
    try:
        result = _ladder_run(instance, warehouse_url, folder, LockingChecksResource())
    finally:
        lock, _CHECK_LOCK["url"] = _CHECK_LOCK["lock"], None
        victim = lock.release() if lock else None
    assert victim is not None and "exact_rung_runs" in victim[1]
    assert result.success, [e.message for e in result.all_events if e.event_type_value == "STEP_FAILURE"]
    assert _retried_steps(result) == [f"deduplicated_records_{COLLAPSE_CHECK}"]
    [evaluation] = [e for e in result.get_asset_check_evaluations() if e.check_name == COLLAPSE_CHECK]
    assert evaluation.metadata["records_in"].value == 30


def test_an_asset_check_fails_at_once_on_an_error_a_retry_cannot_clear(warehouse, warehouse_url, tmp_path, monkeypatch):
    """Breaks: the collapse-rate check meets an error that is not transient (a bug, a wrong setting).

    Must hold: its step fails at once with the error itself, without the retries a dropped connection gets.
    """
    from dedup_pipeline.defs import checks

    def broken(*args, **kwargs):
        raise ValueError("window must be positive")

    monkeypatch.setattr(checks, "batch_rates", broken)
    instance, folder = _one_batch(tmp_path)
    result = _ladder_run(instance, warehouse_url, folder, ChecksResource())
    assert not result.success and _retried_steps(result) == []
    [failure] = [e for e in result.all_events if e.event_type_value == "STEP_FAILURE"]
    assert failure.step_key == f"deduplicated_records_{COLLAPSE_CHECK}"
    assert "ValueError: window must be positive" in failure.step_failure_data.error.message
