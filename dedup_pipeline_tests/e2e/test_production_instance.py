"""The production instance (deploy/dagster.yaml) booted for real: PostgreSQL storage, the queue, the daemon.

A fresh PostgreSQL database holds the instance's run, event-log and schedule
storage; the code location is served by a gRPC code server, the daemon
dequeues runs, and `dagster job launch` submits partitions of `dedup_ladder`
exactly as an operator would, with no tag of their own. Two batches of one
source must be tagged `dedup/source` by the run coordinator and go through the
queue one at a time (the tag limit), and the warehouse steps claim slots of the
`warehouse` pool.
"""

from __future__ import annotations

import pytest
from sqlalchemy import create_engine, func, select

from dedup_pipeline.defs.partitions import crawl_batches_partitions
from dedup_pipeline.store.schema import crawl_batches, records
from dedup_pipeline_tests.e2e.deployment import (
    Deployment,
    assert_no_overlap,
    database_url,
    fresh_database,
    wait_until,
)
from dedup_pipeline_tests.helpers import listing, write_batch

pytestmark = [pytest.mark.slow, pytest.mark.postgres]


def test_partitions_run_through_the_queue_and_the_daemon(tmp_path):
    landing = tmp_path / "landing"
    older, newer = "2026-11-01-shop", "2026-11-02-shop"  # one source, "shop"
    write_batch(
        landing, older, [listing(n) for n in range(60)] + [listing(n, crawl_id="again") for n in range(10)], landed=1e9
    )
    write_batch(landing, newer, [listing(n) for n in range(40, 100)], landed=1e9 + 60)

    with fresh_database("dagster_instance") as instance_db, fresh_database("dedup_wh") as warehouse_db:
        deployment = Deployment(tmp_path / "deploy", instance_db, database_url(warehouse_db), landing)
        try:
            instance = deployment.instance()
            assert type(instance.run_storage).__name__ == "PostgresRunStorage"
            assert type(instance.event_log_storage).__name__ == "PostgresEventLogStorage"
            assert type(instance.schedule_storage).__name__ == "PostgresScheduleStorage"
            assert type(instance.run_coordinator).__name__ == "LaneTaggingRunCoordinator"  # a QueuedRunCoordinator
            assert instance.run_retries_enabled and instance.run_retries_max_retries == 1
            instance.add_dynamic_partitions(crawl_batches_partitions.name, [older, newer])

            deployment.start_code_server()
            deployment.start_daemon()
            deployment.wait_for_code_server()
            deployment.launch_all("dedup_ladder", {older: {}, newer: {}})
            done = wait_until(lambda: deployment.runs_done(2), 300, "two runs to finish through the daemon")

            assert {r.dagster_run.tags["dagster/partition"] for r in done} == {older, newer}
            # launched without it, tagged by the run coordinator; one run per source at a time
            assert [r.dagster_run.tags.get("dedup/source") for r in done] == ["shop", "shop"]
            assert_no_overlap(done)
            for record in done:
                events = set(deployment.event_types(record.dagster_run.run_id))
                assert {"PIPELINE_ENQUEUED", "PIPELINE_STARTING", "PIPELINE_SUCCESS"} <= events, sorted(events)
            assert "QUEUED_RUN_COORDINATOR" in instance.get_daemon_heartbeats()
            assert "warehouse" in instance.event_log_storage.get_concurrency_keys()
        finally:
            deployment.stop()

        engine = create_engine(database_url(warehouse_db))
        with engine.connect() as conn:
            assert conn.execute(select(func.count()).select_from(records)).scalar_one() == 100
            assert conn.execute(select(func.count()).select_from(crawl_batches)).scalar_one() == 2
        engine.dispose()
