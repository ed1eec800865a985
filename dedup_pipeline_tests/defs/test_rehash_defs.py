"""The rehash migration's Dagster layer in process: shard partitions, progress metadata, the comparison check,
the sensor that runs it, and the switch and retire jobs with their refusals."""

from __future__ import annotations

import dagster as dg
import pytest
from sqlalchemy import create_engine, text

from dedup_pipeline.definitions import defs
from dedup_pipeline.defs.rehash import (
    COMPARISON_CHECK,
    MIGRATION_TAG,
    MIGRATIONS,
    RehashResource,
    rehash_migration,
    retire_job,
    switch_job,
    url_switch_job,
)
from dedup_pipeline.defs.resources import NearDupResource, WarehouseResource
from dedup_pipeline.store.rehash import SHARDS
from dedup_pipeline.store.warehouse import Warehouse
from dedup_pipeline_tests.rehash_helpers import load_legacy_rows, migration_listing

MIGRATION = MIGRATIONS[0]


@pytest.fixture
def legacy(tmp_path):
    url = f"sqlite:///{tmp_path / 'warehouse.sqlite'}"
    warehouse = Warehouse(url).create_schema()
    want = load_legacy_rows(warehouse, [migration_listing(n) for n in range(400)])
    yield url, want
    warehouse.dispose()


def resources(url, **rehash):
    return {"warehouse": WarehouseResource(database_url=url), "rehash": RehashResource(**rehash)}


def metadata(result, asset):
    return {k: v.value for k, v in result.asset_materializations_for_node(asset)[0].metadata.items()}


def backfill_all(instance, url, shards=SHARDS, **rehash):
    return {
        shard: metadata(
            dg.materialize(
                [MIGRATION.hashes], partition_key=shard, instance=instance, resources=resources(url, **rehash)
            ),
            MIGRATION.hashes.key.path[-1],
        )
        for shard in shards
    }


def switch(url, **config):
    return switch_job.execute_in_process(
        run_config={"ops": {"switch_active_hash_version": {"config": config}}},
        resources={"warehouse": WarehouseResource(database_url=url)},
        raise_on_error=False,
    )


def test_the_migration_jobs_are_registered_and_tagged():
    assert defs.resolve_job_def("rehash_content_v2").tags[MIGRATION_TAG] == "content/2"
    assert defs.resolve_job_def("compare_content_v2").tags[MIGRATION_TAG] == "content/2"
    assert MIGRATION_TAG in defs.resolve_job_def("switch_hash_version").tags
    assert MIGRATION_TAG in defs.resolve_job_def("retire_hash_version").tags
    assert defs.resolve_job_def("rehash_content_v2").partitions_def.get_partition_keys() == list(SHARDS)
    later = rehash_migration("content/2", "content/1")  # any registered pair builds the same way
    assert later.backfill_job.name == "rehash_content_v1" and later.hashes.key.path == ["content_v1_hashes"]


def test_backfill_compare_switch_retire_in_dagster(legacy):
    url, want = legacy
    instance = dg.DagsterInstance.ephemeral()
    context = dg.build_sensor_context(
        instance=instance, definitions=defs, resources={"warehouse": WarehouseResource(database_url=url)}
    )
    assert isinstance(MIGRATION.sensor(context), dg.SkipReason)  # no shard yet

    refused = switch(url, target="content/2")
    assert not refused.success
    assert (
        "rows have no content/2 digest yet" in refused.failure_data_for_node("switch_active_hash_version").error.message
    )

    first = dg.materialize(
        [MIGRATION.hashes],
        partition_key="3",
        instance=instance,
        resources=resources(url, chunk_size=5, max_chunks_per_run=2),
    )
    partial = metadata(first, "content_v2_hashes")
    assert (partial["rows_hashed"] + partial["rows_unhashable"], partial["complete"]) == (10, False)
    assert (
        partial["shard_rows_left"] == partial["shard_rows"] - 10 and partial["warehouse_rows_left"] == want["rows"] - 10
    )

    others = backfill_all(instance, url, [s for s in SHARDS if s != "3"], chunk_size=50)
    waiting = MIGRATION.sensor(context)  # every shard materialised, but shard 3 stopped with rows left
    assert isinstance(waiting, dg.SkipReason) and "shards 3 stopped at max_chunks_per_run" in waiting.skip_message
    shards = {**others, **backfill_all(instance, url, ["3"], chunk_size=50)}
    assert all(m["complete"] and m["shard_rows_left"] == 0 for m in shards.values())
    assert shards["3"]["warehouse_rows_left"] == 0
    assert sum(m["rows_unhashable"] for m in shards.values()) + partial["rows_unhashable"] == want["unhashable"]
    # Keys and reasons stay in the warehouse (an erasure reaches them there, never in Dagster's event log);
    # the metadata gives the query that lists them.
    assert "https://" not in str(shards) and "price: not a decimal number" not in str(shards)
    query = shards["f"]["unhashable_rows"].split("```sql\n")[1].split(";")[0]
    with create_engine(url).connect() as conn:
        assert "price: not a decimal number" in {error for _, error in conn.execute(text(query))}

    # Rows written since without the target (a batch run with hash_versions [content/1]): every shard's latest
    # run says complete, and the warehouse says otherwise; the sensor waits for a backfill, not a comparison of part.
    with create_engine(url).begin() as conn:
        kept = conn.execute(text("SELECT * FROM record_hashes WHERE hash_version = 'content/2' LIMIT 2")).all()
        conn.execute(
            text("DELETE FROM record_hashes WHERE record_id IN (:a, :b) AND hash_version = 'content/2'"),
            {"a": kept[0].record_id, "b": kept[1].record_id},
        )
    behind = MIGRATION.sensor(context)
    assert isinstance(behind, dg.SkipReason) and "2 rows have no content/2 digest" in behind.skip_message
    backfill_all(instance, url, chunk_size=50)

    request = MIGRATION.sensor(context)
    assert isinstance(request, dg.SensorResult) and len(request.run_requests) == 1
    context.update_cursor(request.cursor)
    assert isinstance(MIGRATION.sensor(context), dg.SkipReason)  # compared after the latest shard already

    strict = dg.materialize(
        [MIGRATION.comparison], instance=instance, resources=resources(url, max_collapse_change=0.0)
    )
    [failed] = strict.get_asset_check_evaluations()
    assert strict.success and failed.check_name == COMPARISON_CHECK and not failed.passed
    assert "failed" in switch(url, target="content/2").failure_data_for_node("switch_active_hash_version").error.message

    compared = dg.materialize([MIGRATION.comparison], instance=instance, resources=resources(url))
    [check] = compared.get_asset_check_evaluations()
    figures = metadata(compared, "rehash_comparison_content_v2")
    assert check.passed and figures["rows_merged_away"] == want["rows_merged_away"]
    assert "https://" not in str(figures) and f"comparison_id {figures['comparison_id']}" in figures["examples"]
    assert check.metadata["collapse_rate_change"].value == pytest.approx(want["rows_merged_away"] / want["hashable"])

    switched = switch(url, target="content/2", overlap_hours=24)
    assert switched.success and Warehouse(url).active_hash_version() == "content/2"
    [event] = [e for e in switched.all_events if e.event_type_value == "STEP_OUTPUT"]
    switch_meta = {k: v.value for k, v in event.event_specific_data.metadata.items()}
    assert (switch_meta["kept_merged"], switch_meta["kept_unhashable"]) == (
        want["rows_merged_away"],
        want["unhashable"],
    )
    assert "https://" not in str(switch_meta)

    def retire(**config):
        return retire_job.execute_in_process(
            run_config={"ops": {"retire_old_hash_version": {"config": config}}},
            resources={"warehouse": WarehouseResource(database_url=url), "near_dup": NearDupResource()},
            raise_on_error=False,
        )

    assert (
        "overlap window" in retire(version="content/1").failure_data_for_node("retire_old_hash_version").error.message
    )
    assert not retire(version="content/1", force=True).success  # a forced retire needs a reason
    retired = retire(version="content/1", force=True, reason="crawl cycle finished early")
    assert retired.success


def test_launchpad_mistakes_fail_the_step_with_what_to_change_not_a_traceback(legacy):
    """Breaks: an unknown version or a force without a reason failed with a ValueError's traceback."""
    url, _ = legacy
    for config, says in (
        ({"target": "content/9"}, "unknown hash version 'content/9'"),
        ({"target": "content/2", "force": True}, "needs a reason"),
    ):
        failed = switch(url, **config)
        failure = failed.failure_data_for_node("switch_active_hash_version")
        assert not failed.success and failure.user_failure_data is not None, failure.error.message
        assert says in failure.user_failure_data.description


def test_the_url_switch_job_moves_an_older_warehouse_to_url2(tmp_path):
    url = f"sqlite:///{tmp_path / 'warehouse.sqlite'}"
    warehouse = Warehouse(url).create_schema()
    with warehouse.engine.begin() as conn:  # a warehouse of older code: no URL version setting
        conn.execute(text("DELETE FROM dedup_settings WHERE name = :name"), {"name": "active_url_version"})
    warehouse.create_schema()
    load_legacy_rows(warehouse, [migration_listing(n) for n in range(5)])
    with warehouse.engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE records SET natural_key = 'http://[::0:1]/x', canonical_url = 'http://[::0:1]/x'"
                " WHERE record_id = 1"
            )
        )
    assert MIGRATION_TAG in defs.resolve_job_def("switch_url_version").tags

    def run(**config):
        return url_switch_job.execute_in_process(
            run_config={"ops": {"switch_active_url_version": {"config": config}}},
            resources={"warehouse": WarehouseResource(database_url=url), "near_dup": NearDupResource()},
            raise_on_error=False,
        )

    done = run()
    assert done.success
    output = next(e for e in done.all_events if e.is_successful_output)
    moved = {k: v.value for k, v in output.event_specific_data.metadata.items()}
    assert (moved["from_version"], moved["to_version"], moved["rows_rewritten"]) == ("url/1", "url/2", 1)
    with warehouse.engine.connect() as conn:
        assert conn.execute(text("SELECT natural_key FROM records WHERE record_id = 1")).scalar() == "http://[::1]/x"
        assert conn.execute(text("SELECT DISTINCT url_version FROM records")).scalars().all() == ["url/2"]
    back = run(target="url/1")
    failure = back.failure_data_for_node("switch_active_url_version")
    assert not back.success and "never moved back" in failure.user_failure_data.description
    warehouse.dispose()


def test_a_comparison_of_nothing_is_a_warning_not_a_pass(tmp_path):
    """Breaks: with no row hashed under both versions (an empty warehouse, or after a retire) the check was green."""
    url = f"sqlite:///{tmp_path / 'empty.sqlite'}"
    Warehouse(url).create_schema().dispose()
    result = dg.materialize([MIGRATION.comparison], instance=dg.DagsterInstance.ephemeral(), resources=resources(url))
    [check] = result.get_asset_check_evaluations()
    assert result.success and not check.passed and check.severity == dg.AssetCheckSeverity.WARN
    assert check.description.startswith("nothing compared")


def test_a_comparison_of_part_of_the_warehouse_is_a_warning_not_a_pass(legacy):
    """Breaks: with most rows still lacking the new digest (one shard backfilled), the check was green over the few
    rows it could compare."""
    url, _ = legacy
    instance = dg.DagsterInstance.ephemeral()
    backfill_all(instance, url, shards=SHARDS[:1])
    result = dg.materialize([MIGRATION.comparison], instance=instance, resources=resources(url))
    [check] = result.get_asset_check_evaluations()
    assert result.success and not check.passed and check.severity == dg.AssetCheckSeverity.WARN
    assert check.description.startswith("not judged: ") and "finish the backfill" in check.description


def test_a_backfill_run_hashes_several_shards_each_resumable(legacy):
    """Breaks: the backfill paid one run per shard (16 runs of ~12 s of overhead for 79 rows). With
    `BackfillPolicy.multi_run` a run takes a range of shards; each stays resumable on its own."""
    from dedup_pipeline.defs.rehash import SHARDS_PER_RUN

    url, want = legacy
    policy = MIGRATION.hashes.backfill_policy
    assert policy == dg.BackfillPolicy.multi_run(max_partitions_per_run=SHARDS_PER_RUN)
    instance = dg.DagsterInstance.ephemeral()
    first, last = SHARDS[0], SHARDS[SHARDS_PER_RUN - 1]

    def run_range(**rehash):
        return dg.materialize(
            [MIGRATION.hashes],
            instance=instance,
            resources=resources(url, **rehash),
            tags={"dagster/asset_partition_range_start": first, "dagster/asset_partition_range_end": last},
        )

    stopped = run_range(chunk_size=5, max_chunks_per_run=1)  # every shard of the range stops after one page
    meta = metadata(stopped, "content_v2_hashes")
    assert meta["shard"] == f"{first}-{last}" and not meta["complete"]
    assert (
        sorted(meta["shards"]) == list(SHARDS[:SHARDS_PER_RUN])
        and meta["rows_hashed"] + meta["rows_unhashable"] == 5 * SHARDS_PER_RUN
    )
    done = metadata(run_range(chunk_size=50), "content_v2_hashes")  # resumes each shard where it stopped
    assert done["complete"] and done["shard_rows_left"] == 0
    assert (
        done["rows_already_hashed"] == 0
        and done["rows_hashed"] + done["rows_unhashable"] == done["shard_rows"] - 5 * SHARDS_PER_RUN
    )
    materialized = instance.get_materialized_partitions(MIGRATION.hashes.key)
    assert materialized == set(SHARDS[:SHARDS_PER_RUN])
