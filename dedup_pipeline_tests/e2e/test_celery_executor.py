"""Distributed execution for real: several batches at once on two celery workers, same result as a serial run.

The deployment of deploy/README.md on this machine: the production instance
(PostgreSQL storage, queued runs, the daemon), the code location on a gRPC
code server, RabbitMQ as the broker (a queue of this test's own) and two
celery worker processes. Four batches from three crawl sources are launched
as `dedup_ladder_celery` runs; runs of different sources go in parallel, the
two batches of one source one after the other (the `dedup/source` tag limit).
Every step runs as a celery task, and the steps share nothing but PostgreSQL
(the warehouse, its LSH index and active hash version) and Redis (the
seen-set). The warehouse they leave must equal the one a serial in-process run
of the same batches, in landing order, leaves in a second database.
"""

from __future__ import annotations

import dagster as dg
import pytest
from sqlalchemy import create_engine, select

from dedup_pipeline.definitions import defs
from dedup_pipeline.defs.partitions import crawl_batches_partitions
from dedup_pipeline.store.schema import dedup_decisions
from dedup_pipeline_tests.e2e.deployment import (
    Deployment,
    assert_no_overlap,
    database_url,
    fresh_database,
    wait_until,
)
from dedup_pipeline_tests.helpers import listing, snapshot, write_batch

pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.redis]

T0 = 1.7e9
WORKERS = ["w1", "w2"]


def shop(host: str, n: int, **overrides) -> dict:
    return listing(n, url=f"https://{host}.example.com/p/{n}", **overrides)


def syndicated(host: str, original: dict, n: int) -> dict:
    """The same article on another site, lightly edited: a near duplicate, never an exact one."""
    return shop(
        host,
        n,
        title=original["title"],
        description=original["description"] + " reposted",
        seller_id=f"{host}-syndication",
    )


def write_crawl(landing) -> dict[str, str]:
    """Four batches from three sources; returns batch -> source, in landing order."""
    shop_a = [shop("shop-a", n) for n in range(80)]
    shop_b = [shop("shop-b", n) for n in range(200, 260)]
    write_batch(
        landing,
        "shop-a-day1",
        shop_a + [shop("shop-a", n, crawl_id="again") for n in range(10)] + ["{broken"],
        landed=T0,
    )
    write_batch(
        landing, "shop-b-day1", shop_b + [syndicated("shop-b", shop_a[n], 1000 + n) for n in range(15)], landed=T0 + 10
    )
    write_batch(
        landing,
        "shop-c-day1",
        [shop("shop-c", n) for n in range(400, 460)] + [syndicated("shop-c", shop_b[n], 2000 + n) for n in range(15)],
        landed=T0 + 20,
    )
    recrawl = (
        [shop("shop-a", n, crawl_id="day2") for n in range(60)]  # unchanged: exact duplicates
        + [shop("shop-a", n, price=f"{n}.49") for n in range(60, 70)]  # changed: old content to history
        + [shop("shop-a", n) for n in range(500, 510)]  # new
        + [shop("shop-a", 70, price="1.00"), shop("shop-a", 70, price="2.00")]  # twice in a batch: the last wins
    )
    write_batch(landing, "shop-a-day2", recrawl, landed=T0 + 30)
    return {"shop-a-day1": "shop-a", "shop-b-day1": "shop-b", "shop-c-day1": "shop-c", "shop-a-day2": "shop-a"}


def decisions(url: str) -> list[tuple]:
    engine = create_engine(url)
    with engine.connect() as conn:
        rows = sorted(
            conn.execute(select(dedup_decisions.c.batch_id, dedup_decisions.c.line_no, dedup_decisions.c.decision))
        )
    engine.dispose()
    return [tuple(row) for row in rows]


def warehouse_state(url: str) -> dict:
    engine = create_engine(url)
    state = snapshot(engine)
    engine.dispose()
    return state


def id_free(state: dict) -> dict:
    """Links and clusters without the order of record ids (which follows who inserted first).

    A link is stored as (smaller id, larger id) and a cluster is named after its
    smallest record id, so under parallel inserts both are numbered differently
    from a serial run even when the same records are linked and clustered.
    """
    clusters: dict = {}
    for key, cluster_key, _rep in state["clusters"]:
        clusters.setdefault(cluster_key, set()).add(key)
    return {
        "links": sorted((*sorted((a, b)), s) for a, b, s in state["links"]),
        "clusters": sorted(sorted(members) for members in clusters.values()),
    }


def serial_run(monkeypatch, tmp_path, landing, url: str, batches: list[str]) -> None:
    """The reference: the default job, in process, one batch after another in landing order."""
    monkeypatch.setenv("DEDUP_DATABASE_URL", url)
    monkeypatch.setenv("DEDUP_LANDING_DIR", str(landing))
    monkeypatch.setenv("DEDUP_DATA_DIR", str(tmp_path / "serial-data"))
    monkeypatch.delenv("DEDUP_REDIS_URL", raising=False)
    instance = dg.DagsterInstance.ephemeral()
    instance.add_dynamic_partitions(crawl_batches_partitions.name, batches)
    job = defs.resolve_job_def("dedup_ladder")
    for batch in batches:
        assert job.execute_in_process(partition_key=batch, instance=instance).success


def celery_workers_of(deployment: Deployment, run_id: str) -> set[str]:
    """The celery workers that executed the run's steps (dagster-celery's engine events)."""
    found = set()
    for entry in deployment.instance().all_logs(run_id, of_type=dg.DagsterEventType.ENGINE_EVENT):
        metadata = entry.dagster_event.engine_event_data.metadata or {}
        if "Celery worker" in metadata:
            found.add(str(metadata["Celery worker"].value).split("@")[0])
    return found


def test_batches_in_parallel_on_celery_workers_match_a_serial_run(tmp_path, monkeypatch):
    landing = tmp_path / "landing"
    sources = write_crawl(landing)
    batches = list(sources)

    with (
        fresh_database("dagster_instance") as instance_db,
        fresh_database("dedup_wh_parallel") as parallel_db,
        fresh_database("dedup_wh_serial") as serial_db,
    ):
        deployment = Deployment(tmp_path / "deploy", instance_db, database_url(parallel_db), landing)
        try:
            deployment.instance().add_dynamic_partitions(crawl_batches_partitions.name, batches)
            deployment.start_code_server()
            deployment.start_daemon()
            for worker in WORKERS:
                deployment.start_celery_worker(worker)
            deployment.wait_for_code_server()
            deployment.wait_for_workers(WORKERS)

            # The first batch of a source is queued first, so the source's later batch waits for it.
            deployment.launch_all("dedup_ladder_celery", {batches[0]: {"dedup/source": sources[batches[0]]}})
            deployment.launch_all(
                "dedup_ladder_celery", {batch: {"dedup/source": sources[batch]} for batch in batches[1:]}
            )
            done = wait_until(lambda: deployment.runs_done(len(batches)), 420, "the celery runs")

            by_batch = {r.dagster_run.tags["dagster/partition"]: r for r in done}
            assert set(by_batch) == set(batches)
            workers = set().union(*(celery_workers_of(deployment, r.dagster_run.run_id) for r in done))
            assert workers == set(WORKERS), workers  # steps ran in both worker processes, none in the run worker
            assert_no_overlap([by_batch["shop-a-day1"], by_batch["shop-a-day2"]])  # one source: in order
            spans = sorted((r.start_time, r.end_time) for r in done)
            assert any(later[0] < earlier[1] for earlier, later in zip(spans, spans[1:])), spans  # ran in parallel
        finally:
            deployment.stop()

        serial_run(monkeypatch, tmp_path, landing, database_url(serial_db), batches)

        parallel, serial = warehouse_state(database_url(parallel_db)), warehouse_state(database_url(serial_db))
        assert (
            len(serial["records"]) == 80 + 75 + 75 + 10 and serial["history"] and serial["links"]
        )  # the crawl as designed
        assert parallel["records"] == serial["records"]
        assert parallel["history"] == serial["history"]
        assert id_free(parallel) == id_free(serial)
        assert decisions(database_url(parallel_db)) == decisions(database_url(serial_db))
