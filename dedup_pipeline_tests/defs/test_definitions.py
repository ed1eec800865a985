"""The Dagster layer in process: the ladder over two overlapping batches, the check, the sensor."""

from __future__ import annotations

import dagster as dg
import pytest
from sqlalchemy import func, select

from dedup_pipeline.definitions import defs
from dedup_pipeline.defs.assets import COLLAPSE_CHECK, ladder_assets
from dedup_pipeline.defs.checks import ladder_checks
from dedup_pipeline.defs.partitions import crawl_batches_partitions
from dedup_pipeline.defs.resources import (
    LandingResource,
)
from dedup_pipeline.defs.sensors import landing_sensor
from dedup_pipeline.landing import SOURCE_TAG, batch_source
from dedup_pipeline.store.schema import records
from dedup_pipeline.store.warehouse import Warehouse
from dedup_pipeline_tests.defs.common import ladder_resources
from dedup_pipeline_tests.helpers import listing, write_batch


def test_definitions_load():
    dg.Definitions.validate_loadable(defs)
    keys = {key.to_user_string() for key in defs.resolve_asset_graph().get_all_asset_keys()}
    assert keys == {
        "raw_crawl_batches",
        "canonical_records",
        "deduplicated_records",
        "near_duplicate_clusters",
        "content_v2_hashes",
        "rehash_comparison_content_v2",  # the rehash migration (defs/rehash.py)
    }
    assert defs.resolve_job_def("dedup_ladder") is not None


def test_everything_the_ui_lists_says_what_it_does():
    """Breaks: `landing_sensor` showed no description (Dagster's @sensor does not read docstrings)."""
    repository = defs.get_repository_def()
    described = {
        **{f"asset {node.key.to_user_string()}": node.description for node in defs.resolve_asset_graph().asset_nodes},
        **{f"sensor {sensor.name}": sensor.description for sensor in repository.sensor_defs},
        **{f"schedule {schedule.name}": schedule.description for schedule in repository.schedule_defs},
        **{f"job {job.name}": job.description for job in repository.get_all_jobs() if not job.name.startswith("__")},
    }
    assert not [name for name, text in described.items() if not (text or "").strip()]


def materialize(instance, url, folder, key, checks=None, **ladder):
    return dg.materialize(
        [*ladder_assets, *ladder_checks],
        partition_key=key,
        instance=instance,
        resources=ladder_resources(url, folder, checks=checks, **ladder),
    )


def collapse_check(result):
    [check] = [e for e in result.get_asset_check_evaluations() if e.check_name == COLLAPSE_CHECK]
    return check


def meta(result, asset):
    return {k: v.value for k, v in result.asset_materializations_for_node(asset)[0].metadata.items()}


def test_whole_ladder_in_process(warehouse_url, tmp_path):
    folder = tmp_path / "landing"
    write_batch(
        folder, "day1", [listing(n) for n in range(150)] + [listing(n, crawl_id="again") for n in range(30)], landed=1e9
    )
    write_batch(folder, "day2", [listing(n) for n in range(100, 200)] + ["not json"], landed=1e9 + 86400, gz=True)
    instance = dg.DagsterInstance.ephemeral()
    instance.add_dynamic_partitions(crawl_batches_partitions.name, ["day1", "day2"])

    first = materialize(instance, warehouse_url, folder, "day1")
    assert first.success
    exact = meta(first, "deduplicated_records")
    assert (exact["records_in"], exact["new"], exact["exact_duplicate"]) == (180, 150, 30)
    assert exact["collapse_rate"] == pytest.approx(30 / 180, abs=1e-4)  # rounded
    check = collapse_check(first)
    assert check.asset_key.to_user_string() == "deduplicated_records" and check.passed

    second = materialize(instance, warehouse_url, folder, "day2")
    exact = meta(second, "deduplicated_records")
    assert (exact["records_in"], exact["new"], exact["exact_duplicate"]) == (100, 50, 50)
    assert meta(second, "raw_crawl_batches")["quarantined"] == 1
    assert meta(second, "near_duplicate_clusters")["sketched"] == 50

    with Warehouse(warehouse_url).engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(records)).scalar_one() == 200


def test_collapse_check_fails_outside_its_band(tmp_path):
    folder = tmp_path / "landing"
    write_batch(folder, "b", [listing(n) for n in range(120)], landed=1e9)  # no duplicates at all
    instance = dg.DagsterInstance.ephemeral()
    instance.add_dynamic_partitions(crawl_batches_partitions.name, ["b"])
    result = materialize(
        instance, f"sqlite:///{tmp_path / 'w.sqlite'}", folder, "b", checks={"min_collapse_rate": 0.05}
    )
    check = collapse_check(result)
    assert not check.passed and check.metadata["collapse_rate"].value == 0.0
    assert result.success  # reported, not blocking: the run goes on


def test_landing_sensor_adds_partitions_and_requests_runs(tmp_path):
    folder = tmp_path / "landing"
    write_batch(folder, "2026-11-01", [listing(1)], landed=1e9)
    write_batch(folder, "2026-11-02", [listing(2)], landed=1e9, gz=True)
    (folder / "notes.txt").write_text("not a batch")
    instance = dg.DagsterInstance.ephemeral()
    context = dg.build_sensor_context(
        instance=instance,
        definitions=defs,
        resources={"landing": LandingResource(folder=str(folder), settle_seconds=0)},
    )
    result = landing_sensor(context)
    assert [r.partition_key for r in result.run_requests] == ["2026-11-01", "2026-11-02"]
    assert [r.tags[SOURCE_TAG] for r in result.run_requests] == ["2026-11-01", "2026-11-02"]  # undated: own source
    assert result.dynamic_partitions_requests[0].partition_keys == ["2026-11-01", "2026-11-02"]

    instance.add_dynamic_partitions(crawl_batches_partitions.name, ["2026-11-01", "2026-11-02"])
    write_batch(folder, "2026-11-03", [listing(3)])  # still being written: too fresh to take
    context = dg.build_sensor_context(
        instance=instance,
        definitions=defs,
        resources={"landing": LandingResource(folder=str(folder), settle_seconds=60)},
    )
    assert not landing_sensor(context).run_requests


def test_a_partition_deleted_and_added_again_by_the_sensor_is_run_again(tmp_path):
    """Breaks: a user deletes a batch's partition in the UI (to reprocess it) while its file is still landed.

    Must hold: the sensor's next tick adds the partition again with a run the sensor daemon does not skip (it
    skips a request whose run key a run of the same sensor already carries), while a tick that finds nothing
    new requests nothing.
    """
    import uuid

    key = "2026-11-01-shop-a"
    write_batch(tmp_path / "landing", key, [listing(1)], landed=1e9)
    resources = {"landing": LandingResource(folder=str(tmp_path / "landing"), settle_seconds=0)}
    with dg.instance_for_test() as instance:

        def tick() -> list[str]:
            """One evaluation, carried out as the daemon does: partitions added, then each run not skipped."""
            with dg.build_sensor_context(instance=instance, definitions=defs, resources=resources) as context:
                result = landing_sensor(context)
            for request in result.dynamic_partitions_requests:
                instance.add_dynamic_partitions(request.partitions_def_name, request.partition_keys)
            launched = []
            for request in result.run_requests:
                tags = {"dagster/run_key": request.run_key, "dagster/sensor_name": landing_sensor.name}
                if instance.get_runs(dg.RunsFilter(tags=tags)):
                    continue  # the daemon: "already completed with run keys ..."
                instance.add_run(
                    dg.DagsterRun(
                        job_name="dedup_ladder",
                        run_id=str(uuid.uuid4()),
                        status=dg.DagsterRunStatus.SUCCESS,
                        tags={**tags, **request.tags, "dagster/partition": request.partition_key},
                    )
                )
                launched.append(request.partition_key)
            return launched

        assert tick() == [key]
        assert tick() == []  # nothing new: nothing requested
        instance.delete_dynamic_partition(crawl_batches_partitions.name, key)
        assert tick() == [key]
        assert instance.get_dynamic_partitions(crawl_batches_partitions.name) == [key]
        assert len(instance.get_runs(dg.RunsFilter(tags={"dagster/partition": key}))) == 2


@pytest.mark.parametrize(
    ("key", "source"),
    [
        ("2026-11-30-shop-a", "shop-a"),
        ("2026-11-02-syndication", "syndication"),
        ("20261130_shop", "shop"),
        ("2026-11-30T06:00Z_shop-a", "shop-a"),
        ("2026-11-30T06_shop-a", "shop-a"),  # the hour alone, as docs/cli.md names it
        ("2026-11-30T0600_shop-a", "shop-a"),
        ("20261130_0600_shop", "shop"),
        ("2026-11-30_10-pack", "10-pack"),  # after "_", two digits are the source's, not an hour
        ("shop-a", "shop-a"),
        ("2026-11-30", "2026-11-30"),
        ("2024-model-1", "2024-model-1"),
    ],
)
def test_a_batch_source_is_its_key_without_the_landing_date(key, source):
    assert batch_source(key) == source


def test_sensor_runs_carry_their_source_so_one_source_runs_in_landing_order(tmp_path):
    folder = tmp_path / "landing"
    for key in ("2026-11-01-shop-a", "2026-11-02-shop-a", "2026-11-02-shop-b"):
        write_batch(folder, key, [listing(1)], landed=1e9)
    context = dg.build_sensor_context(
        instance=dg.DagsterInstance.ephemeral(),
        definitions=defs,
        resources={"landing": LandingResource(folder=str(folder), settle_seconds=0)},
    )
    tags = {r.partition_key: r.tags[SOURCE_TAG] for r in landing_sensor(context).run_requests}
    assert tags == {"2026-11-01-shop-a": "shop-a", "2026-11-02-shop-a": "shop-a", "2026-11-02-shop-b": "shop-b"}


def test_the_landing_sensor_s_first_tick_creates_a_missing_landing_folder(tmp_path):
    """Breaks: the first tick on a fresh checkout failed with `landing folder … does not exist`."""
    folder = tmp_path / ".dedup" / "landing"
    context = dg.build_sensor_context(
        instance=dg.DagsterInstance.ephemeral(),
        definitions=defs,
        resources={"landing": LandingResource(folder=str(folder), settle_seconds=0)},
    )
    result = landing_sensor(context)
    assert folder.is_dir() and not result.run_requests
    assert result.skip_reason.skip_message == f"created the landing folder {folder}; no new batch files"


def test_files_the_sensor_sets_aside_are_in_the_tick_s_skip_reason_and_alert_when_overdue(tmp_path, caplog):
    """Breaks: "ignored" and "two files map to one batch" were only in each tick's log; the tick list showed a
    grey "0 runs requested", and a file could sit set aside for ever without anyone being told."""
    import logging
    import os

    folder = tmp_path / "landing"
    write_batch(folder, "2026-11-07-g", [listing(40)], landed=1e9)
    write_batch(folder, "2026-11-07-g", [listing(41)], landed=1e9, gz=True)
    (folder / "crawl 1.jsonl").write_text("{}\n")
    os.utime(folder / "crawl 1.jsonl", (1e9, 1e9))
    (folder / "fresh.txt").write_text("just landed\n")
    context = dg.build_sensor_context(
        instance=dg.DagsterInstance.ephemeral(),
        definitions=defs,
        resources={"landing": LandingResource(folder=str(folder), settle_seconds=0, alert_after_seconds=600)},
    )
    with caplog.at_level(logging.ERROR, logger="dedup_pipeline.alerts"):
        result = landing_sensor(context)
    reason = result.skip_reason.skip_message
    assert reason.startswith("no new batch files; ")
    assert "ignored: crawl 1.jsonl: its name (less the suffix) is not a batch key" in reason
    assert "ignored: fresh.txt: not a batch file" in reason
    assert "ambiguous: batch '2026-11-07-g': 2 files map to it" in reason
    alerted = sorted(r.getMessage() for r in caplog.records if r.name == "dedup_pipeline.alerts")
    assert [a.split(" has been set aside")[0] for a in alerted] == [
        "ALERT dedup landing: 2026-11-07-g.jsonl",
        "ALERT dedup landing: 2026-11-07-g.jsonl.gz",
        "ALERT dedup landing: crawl 1.jsonl",
    ]  # not fresh.txt: it has not sat there long


def test_a_re_delivered_batch_file_runs_again_and_a_touched_one_does_not(tmp_path):
    """Breaks: a batch file overwritten with other lines (a corrected re-delivery, or a valid gzip in place of a
    corrupt one whose run failed) was never picked up again: every tick said "no new batch files".

    Must hold: the next tick requests the batch's run again (no new partition) when its bytes are not the ones
    its raw rung last read; a file only touched (same bytes, new modification time) requests nothing; the
    sensor's first tick re-runs nothing.
    """
    import gzip
    import json
    import os

    from dedup_pipeline_tests.defs.test_checks_dagster import run

    folder, url = tmp_path / "landing", f"sqlite:///{tmp_path / 'w.sqlite'}"
    write_batch(folder, "b1", [listing(n) for n in range(3)], landed=1e9)
    (folder / "b2.jsonl.gz").write_bytes(b"not gzip\n")
    os.utime(folder / "b2.jsonl.gz", (1e9, 1e9))
    instance = dg.DagsterInstance.ephemeral()
    resources = {"landing": LandingResource(folder=str(folder), settle_seconds=0)}
    cursor = None

    def tick() -> dg.SensorResult:
        nonlocal cursor
        context = dg.build_sensor_context(instance=instance, definitions=defs, resources=resources, cursor=cursor)
        result = landing_sensor(context)
        cursor = result.cursor
        return result

    first = tick()
    assert [r.partition_key for r in first.run_requests] == ["b1", "b2"]
    instance.add_dynamic_partitions(crawl_batches_partitions.name, ["b1", "b2"])
    assert run(instance, url, folder, "b1").success and not run(instance, url, folder, "b2").success
    assert not tick().run_requests

    os.utime(folder / "b1.jsonl", (1e9 + 60, 1e9 + 60))  # touched: the same bytes
    assert not tick().run_requests
    write_batch(folder, "b1", [listing(n) for n in range(4)], landed=1e9 + 120)  # re-delivered with a line more
    (folder / "b2.jsonl.gz").write_bytes(gzip.compress((json.dumps(listing(9)) + "\n").encode()))
    os.utime(folder / "b2.jsonl.gz", (1e9 + 120, 1e9 + 120))
    again = tick()
    assert sorted(r.partition_key for r in again.run_requests) == ["b1", "b2"] and not again.dynamic_partitions_requests
    assert run(instance, url, folder, "b1").success and run(instance, url, folder, "b2").success
    assert not tick().run_requests


def test_a_set_aside_file_alerts_once_until_it_changes(tmp_path, caplog):
    """Breaks: a file set aside longer than `alert_after_seconds` raised its ALERT on every tick (twice a minute),
    so a pager wired to the alert logger, as the docs advise, fired until someone moved the file."""
    import logging
    import os

    folder = tmp_path / "landing"
    folder.mkdir()
    (folder / "crawl 1.jsonl").write_text("{}\n")
    os.utime(folder / "crawl 1.jsonl", (1e9, 1e9))
    resources = {"landing": LandingResource(folder=str(folder), settle_seconds=0, alert_after_seconds=60)}
    instance, cursor, alerts = dg.DagsterInstance.ephemeral(), None, []
    for touched in (False, False, True, False):
        if touched:
            os.utime(folder / "crawl 1.jsonl", (1e9 + 1, 1e9 + 1))
        caplog.clear()
        with caplog.at_level(logging.ERROR, logger="dedup_pipeline.alerts"):
            context = dg.build_sensor_context(instance=instance, definitions=defs, resources=resources, cursor=cursor)
            cursor = landing_sensor(context).cursor
        alerts.append(sum("ALERT dedup landing: crawl 1.jsonl" in r.getMessage() for r in caplog.records))
    assert alerts == [1, 0, 1, 0]
