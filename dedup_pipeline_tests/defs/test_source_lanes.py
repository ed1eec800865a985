"""One run per crawl source on the production instance, however a batch's run was launched.

The instance is deploy/dagster.yaml itself (PostgreSQL storage in a fresh
database, its run coordinator and tag limits), with Dagster's test run launcher
(`MockedRunLauncher`, which records a launch and runs nothing) in place of
run workers. Runs are launched the ways the landing sensor does not: a backfill
from the UI (GraphQL `launchPartitionBackfill`, of the assets and of the job),
submitted by one iteration of the daemon's backfill loop, and the launchpad
(GraphQL `launchPipelineExecution`). Then iterations of the daemon's run queue
(`QueuedRunCoordinatorDaemon`) decide which queued runs start: a source's
newer batch waits while its older one runs, another source's batch does not. A rehash migration's runs take
its `dedup/migration` lane instead, launched from the asset's page as well as from its jobs.
"""

from __future__ import annotations

import logging
from pathlib import Path

import dagster as dg
import pytest
from dagster._core.remote_origin import InProcessCodeLocationOrigin
from dagster._core.test_utils import create_test_daemon_workspace_context
from dagster._core.types.loadable_target_origin import LoadableTargetOrigin
from dagster._core.workspace.load_target import InProcessWorkspaceLoadTarget
from dagster._daemon.backfill import execute_backfill_iteration
from dagster._daemon.run_coordinator import QueuedRunCoordinatorDaemon
from dagster_graphql.client.query import LAUNCH_PARTITION_BACKFILL_MUTATION, LAUNCH_PIPELINE_EXECUTION_MUTATION
from dagster_graphql.test.utils import execute_dagster_graphql

from dedup_pipeline.defs.partitions import crawl_batches_partitions
from dedup_pipeline.defs.rehash import MIGRATION_TAG, MIGRATIONS
from dedup_pipeline.landing import SOURCE_TAG
from dedup_pipeline_tests.helpers import fresh_database

pytestmark = pytest.mark.postgres

REPO = Path(__file__).resolve().parents[2]
LOCATION = "dedup_pipeline"
REPOSITORY = "__repository__"
LADDER = ["raw_crawl_batches", "canonical_records", "deduplicated_records", "near_duplicate_clusters"]
OLDER, NEWER, OTHER = "2026-11-01-shop-a", "2026-11-02-shop-a", "2026-11-01-shop-b"
#: Runs that are launched and not finished hold their source's lane.
IN_PROGRESS = (dg.DagsterRunStatus.STARTING, dg.DagsterRunStatus.STARTED)


@pytest.fixture(params=["deploy/dagster.yaml", "dagster.yaml"])
def workspace_context(request, tmp_path, monkeypatch):
    """An instance and the code location, in process: the production instance (deploy/dagster.yaml, a fresh
    PostgreSQL database), and the checkout's local one (`make dev`'s, SQLite), whose lanes must be the same."""
    home = tmp_path / "dagster_home"
    home.mkdir()
    config = (REPO / request.param).read_text()
    launcher = "\nrun_launcher:\n  module: dagster._core.test_utils\n  class: MockedRunLauncher\n"
    (home / "dagster.yaml").write_text(config + launcher)
    with fresh_database("dagster_instance") as instance_db:
        for key, value in {
            "DAGSTER_PG_HOST": "127.0.0.1",
            "DAGSTER_PG_PORT": "5432",
            "DAGSTER_PG_USER": "postgres",
            "DAGSTER_PG_PASSWORD": "unused-with-trust-auth",
            "DAGSTER_PG_DB": instance_db,
        }.items():
            monkeypatch.setenv(key, value)
        with dg.DagsterInstance.from_config(str(home)) as instance:
            instance.add_dynamic_partitions(crawl_batches_partitions.name, [OLDER, NEWER, OTHER])
            target = LoadableTargetOrigin(module_name="dedup_pipeline.definitions")
            origin = InProcessCodeLocationOrigin(target, location_name=LOCATION)
            with create_test_daemon_workspace_context(InProcessWorkspaceLoadTarget(origin), instance) as context:
                yield context


def _graphql(context, query: str, variables: dict) -> dict:
    result = execute_dagster_graphql(context.create_request_context(), query, variables)
    assert not result.errors, result.errors
    return next(iter(result.data.values()))


def _runs_by_partition(instance: dg.DagsterInstance) -> dict[str, dg.DagsterRun]:
    """The runs of the three batches, by partition."""
    runs = instance.get_runs()
    return {
        run.tags["dagster/partition"]: run for run in runs if run.tags.get("dagster/partition") in (OLDER, NEWER, OTHER)
    }


def _dequeue(context, daemon: QueuedRunCoordinatorDaemon) -> set[str]:
    """One iteration of the daemon's run queue; the partitions whose runs are now in progress."""
    list(daemon.run_iteration(context))
    return {key for key, run in _runs_by_partition(context.instance).items() if run.status in IN_PROGRESS}


def _assert_one_run_per_source(context) -> None:
    """The queued runs carry their source; the newer shop-a batch starts only once the older one is done."""
    instance = context.instance
    runs = _runs_by_partition(instance)
    sources = {key: run.tags.get(SOURCE_TAG) for key, run in runs.items()}
    assert sources == {OLDER: "shop-a", NEWER: "shop-a", OTHER: "shop-b"}
    assert {run.status for run in runs.values()} == {dg.DagsterRunStatus.QUEUED}

    with QueuedRunCoordinatorDaemon(interval_seconds=1) as daemon:
        assert _dequeue(context, daemon) == {OLDER, OTHER}
        assert _dequeue(context, daemon) == {OLDER, OTHER}  # shop-a's lane is held: NEWER keeps waiting
        instance.report_run_failed(runs[OLDER])  # finished (how does not matter to the queue)
        assert _dequeue(context, daemon) == {NEWER, OTHER}


@pytest.mark.parametrize("target", ["assets", "job"])
def test_a_backfill_from_the_ui_runs_one_batch_per_source_at_a_time(workspace_context, target):
    params = {"partitionNames": [OLDER, OTHER, NEWER]}  # landing order: the queue keeps the order runs are submitted in
    if target == "assets":  # the asset graph's "Materialize" of partitions
        params["assetSelection"] = [{"path": [name]} for name in LADDER]
    else:  # the job's partitions page
        params["selector"] = {
            "partitionSetName": "dedup_ladder_partition_set",
            "repositorySelector": {"repositoryLocationName": LOCATION, "repositoryName": REPOSITORY},
        }
    launched = _graphql(workspace_context, LAUNCH_PARTITION_BACKFILL_MUTATION, {"backfillParams": params})
    assert launched["__typename"] == "LaunchBackfillSuccess", launched

    for _ in range(5):  # the daemon's backfill loop submits the runs (through the instance's run coordinator)
        list(execute_backfill_iteration(workspace_context, logging.getLogger("test_source_lanes")))
        if len(_runs_by_partition(workspace_context.instance)) == 3:
            break
    _assert_one_run_per_source(workspace_context)


def test_runs_from_the_launchpad_are_tagged_by_partition_and_others_left_alone(workspace_context):
    def launch(job: str, tags: dict[str, str], assets: list[dg.AssetKey] | None = None) -> dict:
        selector = {"repositoryLocationName": LOCATION, "repositoryName": REPOSITORY, "pipelineName": job}
        if assets is not None:  # an asset's own page: "Materialize"
            selector["assetSelection"] = [{"path": key.path} for key in assets]
        params = {
            "selector": selector,
            "executionMetadata": {"tags": [{"key": k, "value": v} for k, v in tags.items()]},
        }
        launched = _graphql(workspace_context, LAUNCH_PIPELINE_EXECUTION_MUTATION, {"executionParams": params})
        assert launched["__typename"] == "LaunchRunSuccess", launched
        return launched["run"]

    for key in (OLDER, NEWER):
        launch("dedup_ladder", {"dagster/partition": key})
    launch("dedup_ladder_celery", {"dagster/partition": OTHER})
    unpartitioned = launch("prune_retention", {"team": "ops"})
    own_lane = launch("dedup_ladder", {"dagster/partition": "shop-a-day9", SOURCE_TAG: "shop-a"})  # an operator's tag
    migration = MIGRATIONS[0]
    comparison = launch("__ASSET_JOB", {}, assets=[migration.comparison.key])
    shard = launch("rehash_content_v2", {"dagster/partition": "3"})  # the job's own tag, no source lane

    instance = workspace_context.instance
    for run_id in (comparison["runId"], shard["runId"]):
        tags = instance.get_run_by_id(run_id).tags
        assert (tags.get(MIGRATION_TAG), tags.get(SOURCE_TAG)) == (migration.target, None)
    prune = instance.get_run_by_id(unpartitioned["runId"])
    assert prune.status == dg.DagsterRunStatus.QUEUED and SOURCE_TAG not in prune.tags
    assert instance.get_run_by_id(own_lane["runId"]).tags[SOURCE_TAG] == "shop-a"  # kept, not re-derived
    _assert_one_run_per_source(workspace_context)


def test_an_asset_backfill_of_migration_shards_runs_one_shard_at_a_time(workspace_context):
    """The asset page's "Materialize" of shard partitions carries none of the rehash job's tags: the run coordinator
    gives each run its migration's lane, not a source lane named after the shard. A run takes a range of
    `SHARDS_PER_RUN` shards (the asset's BackfillPolicy); the lane runs one range at a time."""
    from dedup_pipeline.defs.rehash import SHARDS_PER_RUN

    migration = MIGRATIONS[0]
    shards = [f"{n:x}" for n in range(2 * SHARDS_PER_RUN)]
    ranges = [f"{shards[0]}-{shards[SHARDS_PER_RUN - 1]}", f"{shards[SHARDS_PER_RUN]}-{shards[-1]}"]
    params = {"partitionNames": shards, "assetSelection": [{"path": migration.hashes.key.path}]}
    launched = _graphql(workspace_context, LAUNCH_PARTITION_BACKFILL_MUTATION, {"backfillParams": params})
    assert launched["__typename"] == "LaunchBackfillSuccess", launched

    instance = workspace_context.instance

    def shard_runs() -> dict[str, dg.DagsterRun]:
        start, end = "dagster/asset_partition_range_start", "dagster/asset_partition_range_end"
        return {f"{run.tags[start]}-{run.tags[end]}": run for run in instance.get_runs() if start in run.tags}

    for _ in range(5):
        list(execute_backfill_iteration(workspace_context, logging.getLogger("test_source_lanes")))
        if len(shard_runs()) == len(ranges):
            break
    runs = shard_runs()
    assert {key: (run.tags.get(MIGRATION_TAG), run.tags.get(SOURCE_TAG)) for key, run in runs.items()} == {
        shard_range: (migration.target, None) for shard_range in ranges
    }

    def started() -> set[str]:
        list(daemon.run_iteration(workspace_context))
        return {key for key, run in shard_runs().items() if run.status in IN_PROGRESS}

    with QueuedRunCoordinatorDaemon(interval_seconds=1) as daemon:
        done: set[str] = set()
        for _ in ranges:
            running = started() - done
            assert len(running) == 1, running
            assert started() - done == running  # the lane is held: the other range keeps waiting
            instance.report_run_failed(runs[running.pop()])
            done = {key for key, run in shard_runs().items() if run.status == dg.DagsterRunStatus.FAILURE}
        assert done == set(ranges)
