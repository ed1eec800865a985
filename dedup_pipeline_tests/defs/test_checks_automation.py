"""Automation: the catch-up schedule and the one setting that turns every instigator on."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime

import dagster as dg

from dedup_pipeline.definitions import defs
from dedup_pipeline.defs.partitions import crawl_batches_partitions
from dedup_pipeline.defs.resources import LandingResource
from dedup_pipeline.defs.schedules import ladder_catch_up
from dedup_pipeline_tests.helpers import listing, write_batch

TICK = datetime(2026, 11, 3, 10, 17, tzinfo=UTC)


def schedule_context(instance, folder):
    return dg.build_schedule_context(
        instance=instance,
        scheduled_execution_time=TICK,
        resources={"landing": LandingResource(folder=str(folder), settle_seconds=0)},
    )


def test_catch_up_registers_new_files_and_runs_only_batches_not_done(tmp_path):
    folder = tmp_path / "landing"
    for key in ("a-done", "b-running", "c-failed", "d-new", "e-celery", "f-asset-page"):
        write_batch(folder, key, [listing(1)], landed=1e9)
    with dg.instance_for_test() as instance:  # schedules need an instance with a ref, not an ephemeral one
        instance.add_dynamic_partitions(crawl_batches_partitions.name, ["a-done", "b-running", "c-failed", "gone"])
        # A batch is in flight whichever job runs it: the Celery twin, or an asset page's materialisation.
        for job, key, status in (
            ("dedup_ladder_celery", "e-celery", dg.DagsterRunStatus.STARTED),
            ("__ASSET_JOB", "f-asset-page", dg.DagsterRunStatus.NOT_STARTED),
        ):
            tags = {"dagster/partition": key}
            instance.add_run(dg.DagsterRun(job_name=job, run_id=f"r-{key}", status=status, tags=tags))
        instance.report_runless_asset_event(dg.AssetMaterialization("near_duplicate_clusters", partition="a-done"))
        instance.add_run(
            dg.DagsterRun(
                job_name="dedup_ladder",
                run_id="r-b",
                status=dg.DagsterRunStatus.STARTED,
                tags={"dagster/partition": "b-running"},
            )
        )
        instance.add_run(
            dg.DagsterRun(
                job_name="dedup_ladder",
                run_id="r-c",
                status=dg.DagsterRunStatus.FAILURE,
                tags={"dagster/partition": "c-failed"},
            )
        )

        requests = ladder_catch_up(schedule_context(instance, folder))
        assert [(r.partition_key, r.run_key) for r in requests] == [
            ("c-failed", f"c-failed@{TICK.isoformat()}"),
            ("d-new", f"d-new@{TICK.isoformat()}"),
        ]
        assert [(r.tags["dedup/trigger"], r.tags["dedup/source"]) for r in requests] == [
            ("catch-up", "c-failed"),
            ("catch-up", "d-new"),
        ]
        assert "d-new" in instance.get_dynamic_partitions(
            crawl_batches_partitions.name
        )  # "gone" has no file: left alone

        for key in ("c-failed", "d-new"):
            instance.report_runless_asset_event(dg.AssetMaterialization("near_duplicate_clusters", partition=key))
        instance.add_run(
            dg.DagsterRun(
                job_name="dedup_ladder",
                run_id="r-b2",
                status=dg.DagsterRunStatus.SUCCESS,
                tags={"dagster/partition": "b-running"},
            )
        )
        skip = ladder_catch_up(schedule_context(instance, folder))
        assert isinstance(skip, dg.SkipReason) and "6 landed batches" in skip.skip_message  # 3 still in flight

        missing = ladder_catch_up(schedule_context(instance, tmp_path / "nowhere"))
        assert isinstance(missing, dg.SkipReason) and "cannot read the landing folder" in missing.skip_message


def test_schedule_targets_the_ladder_job():
    schedule = defs.resolve_schedule_def("ladder_catch_up")
    assert schedule.job_name == "dedup_ladder" and schedule.cron_schedule == "17 * * * *"
    assert defs.resolve_sensor_def("ladder_failure_alert").name == "ladder_failure_alert"


def test_one_setting_turns_the_sensors_and_the_schedule_on():
    probe = (
        "import json; from dedup_pipeline.definitions import defs;"
        "print(json.dumps({i.name: i.default_status.value for i in [defs.resolve_schedule_def('ladder_catch_up'),"
        " defs.resolve_sensor_def('landing_sensor'), defs.resolve_sensor_def('ladder_failure_alert')]}))"
    )

    def statuses(value):
        env = {**os.environ, "DEDUP_AUTOMATION": value}
        out = subprocess.run(
            [sys.executable, "-W", "ignore", "-c", probe], env=env, capture_output=True, text=True, check=True
        )
        return json.loads(out.stdout.strip().splitlines()[-1])

    names = ["ladder_catch_up", "landing_sensor", "ladder_failure_alert"]
    assert statuses("on") == dict.fromkeys(names, "RUNNING")
    assert statuses("") == dict.fromkeys(names, "STOPPED")
