"""The rehash backfill through a real `dagster dev` (webserver and daemon) on a temporary instance.

A warehouse written before `content/2` existed, in a PostgreSQL database of
its own; the backfill is launched over GraphQL the way the UI's "Launch
backfill…" does (`launchPartitionBackfill` on the job's partition set); the
daemon runs the sixteen shard runs one at a time (the `dedup/migration` tag
limit of the repository's dagster.yaml); the sensor then runs the
comparison, and its check result is read back over GraphQL.
"""

from __future__ import annotations

import os
import shutil
import time

import pytest
from sqlalchemy import func, select

from dedup_pipeline.defs.rehash import SHARDS_PER_RUN
from dedup_pipeline.store.rehash import SHARDS
from dedup_pipeline.store.schema import record_hashes
from dedup_pipeline_tests.e2e.dagster_dev import LOCATION, REPO, Server, start_server, wait_until
from dedup_pipeline_tests.rehash_helpers import load_legacy_rows, migration_listing

pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.timeout(1800)]
JOB = "rehash_content_v2"
COMPARISON = ["rehash_comparison_content_v2"]


def backfill_status(server: Server, backfill_id: str) -> str:
    data = server.graphql(
        "query($id: String!) { partitionBackfillOrError(backfillId: $id) { ... on PartitionBackfill { status } } }",
        {"id": backfill_id},
    )
    return data["partitionBackfillOrError"]["status"]


def latest_check(server: Server):
    data = server.graphql(
        """query($key: AssetKeyInput!) {
           assetCheckExecutions(assetKey: $key, checkName: "collapse_change_in_band", limit: 1) {
             status evaluation { success metadataEntries { label ... on FloatMetadataEntry { floatValue }
                                                         ... on IntMetadataEntry { intValue } } } } }""",
        {"key": {"path": COMPARISON}},
    )["assetCheckExecutions"]
    return data[0] if data and data[0]["evaluation"] else None


@pytest.mark.parametrize("warehouse_url", ["postgresql"], indirect=True)
def test_backfill_launched_over_graphql_runs_every_shard_then_the_comparison(warehouse_url, warehouse, tmp_path):
    want = load_legacy_rows(warehouse, [migration_listing(n) for n in range(3000)])
    home = tmp_path / "dagster_home"
    home.mkdir()
    shutil.copy(REPO / "dagster.yaml", home / "dagster.yaml")  # the tag concurrency limit under test
    env = {k: v for k, v in os.environ.items() if k != "DEDUP_AUTOMATION"}
    env.update(
        DAGSTER_HOME=str(home),
        DEDUP_DATABASE_URL=warehouse_url,
        DEDUP_LANDING_DIR=str(tmp_path / "landing"),
        DEDUP_DATA_DIR=str(tmp_path / "data"),
        PYTHONWARNINGS="ignore",
    )
    server = start_server(env, tmp_path / "dagster-dev.log")
    try:
        sets = server.graphql(
            """query($r: RepositorySelector!, $job: String!) {
               partitionSetsOrError(repositorySelector: $r, pipelineName: $job) {
                 ... on PartitionSets { results { name } } } }""",
            {"r": LOCATION, "job": JOB},
        )["partitionSetsOrError"]["results"]
        [partition_set] = [s["name"] for s in sets]
        launched = server.graphql(
            """mutation($p: LaunchBackfillParams!) { launchPartitionBackfill(backfillParams: $p) {
                 __typename ... on LaunchBackfillSuccess { backfillId } ... on PythonError { message } } }""",
            {
                "p": {
                    "selector": {"partitionSetName": partition_set, "repositorySelector": LOCATION},
                    "allPartitions": True,
                }
            },
        )["launchPartitionBackfill"]
        assert launched["__typename"] == "LaunchBackfillSuccess", launched
        backfill_id = launched["backfillId"]

        started = time.monotonic()
        status = wait_until(
            "the backfill to finish",
            lambda: (
                (s := backfill_status(server, backfill_id))
                in ("COMPLETED", "COMPLETED_SUCCESS", "COMPLETED_FAILED", "FAILED", "CANCELED")
                and s
            ),
            timeout=900,
            every=3,
        )
        assert status in ("COMPLETED", "COMPLETED_SUCCESS"), (status, server.log.name)
        runs = server.graphql(
            """query($id: String!) { runsOrError(filter: {tags: [{key: "dagster/backfill", value: $id}]}) {
                 ... on Runs { results { status startTime endTime tags { key value } } } } }""",
            {"id": backfill_id},
        )["runsOrError"]["results"]
        # BackfillPolicy.multi_run: a run per SHARDS_PER_RUN shards, not one per shard
        assert len(runs) == len(SHARDS) // SHARDS_PER_RUN and {r["status"] for r in runs} == {"SUCCESS"}
        assert all({"key": "dedup/migration", "value": "content/2"} in r["tags"] for r in runs)
        spans = sorted((r["startTime"], r["endTime"]) for r in runs)
        assert all(later[0] >= earlier[1] - 0.5 for earlier, later in zip(spans, spans[1:])), "shards overlapped"

        with warehouse.engine.connect() as conn:
            hashed = conn.execute(
                select(func.count()).select_from(record_hashes).where(record_hashes.c.hash_version == "content/2")
            ).scalar_one()
        assert hashed == want["rows"]

        check = wait_until("the comparison check", lambda: latest_check(server), timeout=300, every=3)
        entries = {e["label"]: e.get("floatValue", e.get("intValue")) for e in check["evaluation"]["metadataEntries"]}
        assert check["status"] == "SUCCEEDED" and check["evaluation"]["success"]
        assert entries["rows_merged_away"] == want["rows_merged_away"] and entries["rows_left"] == 0
        assert entries["collapse_rate_change"] == pytest.approx(want["rows_merged_away"] / want["hashable"])
        print(f"backfill ({len(runs)} runs) + comparison through dagster dev: {time.monotonic() - started:.0f} s")
    finally:
        server.stop()
