"""The landing sensor: every new batch file becomes a partition and a run of the ladder."""

import logging
import time
from datetime import UTC, datetime
from pathlib import Path

import dagster as dg

from dedup_pipeline import environment
from dedup_pipeline.defs.jobs import dedup_ladder_job
from dedup_pipeline.defs.partitions import crawl_batches_partitions
from dedup_pipeline.defs.resources import LandingResource
from dedup_pipeline.landing import SOURCE_TAG, LandingScan, batch_key, batch_source, scan_landing

#: The alert logger the run-failure alert writes to (defs/alerts.py): a handler on it pages someone.
alerts = logging.getLogger("dedup_pipeline.alerts")


def overdue_notices(folder: Path, scan: LandingScan, after_seconds: float) -> list[str]:
    """The files that are no batch, or share a batch key, and have sat in the landing folder longer than
    `after_seconds`: nobody renamed or removed them, so a crawl is waiting on an operator."""
    now = time.time()
    names = [name for name, _ in scan.ignored] + [
        path.name for path in sorted(folder.iterdir()) if batch_key(path) in scan.ambiguous
    ]
    overdue = []
    for name in dict.fromkeys(names):
        try:
            age = now - (folder / name).stat().st_mtime
        except OSError:
            continue  # gone since the scan
        if age > after_seconds:
            overdue.append(f"{name} has been set aside for {age / 60:.0f} min (longer than {after_seconds:g} s)")
    return overdue


def automation_status() -> dg.DefaultSensorStatus:
    """Sensors start running when DEDUP_AUTOMATION=on, else they wait to be switched on in the UI."""
    return dg.DefaultSensorStatus.RUNNING if environment.automation_enabled() else dg.DefaultSensorStatus.STOPPED


@dg.sensor(
    job=dedup_ladder_job,
    minimum_interval_seconds=30,
    default_status=automation_status(),
    description="Adds a partition for each new, fully written batch file in the landing folder and requests its "
    "run, tagged with the batch's source. Files still being written, files that are no batch and keys that two "
    "files map to are left alone: named in the tick's log, and in the skip reason of a tick that requests no run; "
    "one set aside longer than the landing "
    "resource's `alert_after_seconds` raises an alert. Creates the landing folder when it is missing.",
)
def landing_sensor(context: dg.SensorEvaluationContext, landing: LandingResource) -> dg.SensorResult:
    """Adds a partition for each new, fully written batch file in the landing folder and requests its run.

    A run key is the batch key and the time of the tick that registers it: the daemon never runs a run key of
    this sensor twice, so a partition deleted (to reprocess it) and added again by a later tick gets a new run,
    while a tick that finds nothing new requests nothing (its batches are registered already).
    """
    folder = landing.path()
    created = ""
    if not folder.is_dir():
        try:  # the first tick of a fresh checkout or deployment: an empty landing folder, not a failed tick
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            return dg.SensorResult(skip_reason=f"landing folder {folder} does not exist and cannot be created: {exc}")
        created = f"created the landing folder {folder}; "
    known = set(context.instance.get_dynamic_partitions(crawl_batches_partitions.name))
    scan = scan_landing(folder, landing.settle_seconds)
    set_aside = scan.notices(landing.settle_seconds)
    for name, reason in scan.ignored:  # a file a crawler meant as a batch must not vanish without a word
        context.log.warning(f"landing file {name} ignored: {reason}")
    for key, reason in scan.ambiguous.items():  # the other batches go on; this one waits for a single file
        context.log.warning(f"landing batch {key} set aside: {reason}")
    for notice in overdue_notices(folder, scan, landing.alert_after_seconds):
        alerts.error("ALERT dedup landing: %s", notice)
        context.log.error(f"ALERT {notice}")
    new_keys = [batch.key for batch in scan.batches if batch.key not in known]
    if not new_keys:
        # The tick list shows the skip reason, not the tick's log: what was left alone, and why, goes there.
        return dg.SensorResult(skip_reason=created + "no new batch files" + "".join(f"; {n}" for n in set_aside))
    registered = datetime.now(UTC).isoformat()
    return dg.SensorResult(
        dynamic_partitions_requests=[crawl_batches_partitions.build_add_request(new_keys)],
        run_requests=[
            dg.RunRequest(partition_key=key, run_key=f"{key}@{registered}", tags={SOURCE_TAG: batch_source(key)})
            for key in new_keys
        ],
    )
