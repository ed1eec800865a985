"""The landing sensor: every new batch file becomes a partition and a run of the ladder."""

import json
import logging
import time
from datetime import UTC, datetime
from pathlib import Path

import dagster as dg

from dedup_pipeline import environment
from dedup_pipeline.defs.assets import raw_crawl_batches
from dedup_pipeline.defs.jobs import dedup_ladder_job
from dedup_pipeline.defs.partitions import crawl_batches_partitions
from dedup_pipeline.defs.resources import LandingResource
from dedup_pipeline.landing import (
    SOURCE_TAG,
    BatchFile,
    LandingScan,
    batch_key,
    batch_source,
    file_sha256,
    scan_landing,
)

#: The alert logger the run-failure alert writes to (defs/alerts.py): a handler on it pages someone.
alerts = logging.getLogger("dedup_pipeline.alerts")


def overdue_notices(folder: Path, scan: LandingScan, after_seconds: float) -> dict[str, tuple[float, str]]:
    """The files that are no batch, or share a batch key, and have sat in the landing folder longer than
    `after_seconds`: nobody renamed or removed them, so a crawl is waiting on an operator. By file name: its
    modification time and the notice."""
    now = time.time()
    names = [name for name, _ in scan.ignored] + [
        path.name for path in sorted(folder.iterdir()) if batch_key(path) in scan.ambiguous
    ]
    overdue = {}
    for name in dict.fromkeys(names):
        try:
            mtime = (folder / name).stat().st_mtime
        except OSError:
            continue  # gone since the scan
        if now - mtime > after_seconds:
            overdue[name] = (
                mtime,
                f"{name} has been set aside for {(now - mtime) / 60:.0f} min (longer than {after_seconds:g} s)",
            )
    return overdue


def redelivered(instance: dg.DagsterInstance, batches: list[BatchFile]) -> list[str]:
    """The keys among `batches` (known batches whose file changed since the sensor last looked) whose file is not
    the one their raw rung last read: another size or digest, or no successful read at all (its run failed,
    say on a corrupt file since replaced)."""
    keys = []
    for batch in batches:
        latest = instance.fetch_materializations(
            dg.AssetRecordsFilter(raw_crawl_batches.key, asset_partitions=[batch.key]), limit=1
        ).records
        metadata = latest[0].asset_materialization.metadata if latest else {}
        read = {name: metadata[name].value for name in ("file_bytes", "file_sha256") if name in metadata}
        if read.get("file_bytes") != batch.size or read.get("file_sha256") != file_sha256(batch.path):
            keys.append(batch.key)
    return keys


def automation_status() -> dg.DefaultSensorStatus:
    """Sensors start running when DEDUP_AUTOMATION=on, else they wait to be switched on in the UI."""
    return dg.DefaultSensorStatus.RUNNING if environment.automation_enabled() else dg.DefaultSensorStatus.STOPPED


@dg.sensor(
    job=dedup_ladder_job,
    minimum_interval_seconds=30,
    default_status=automation_status(),
    description="Adds a partition for each new, fully written batch file in the landing folder and requests its "
    "run, tagged with the batch's source; requests a run again for a batch whose file is re-delivered with other "
    "bytes. Files still being written, files that are no batch and keys that two "
    "files map to are left alone: named in the tick's log, and in the skip reason of a tick that requests no run; "
    "one set aside longer than the landing "
    "resource's `alert_after_seconds` raises an alert, once. Creates the landing folder when it is missing.",
)
def landing_sensor(context: dg.SensorEvaluationContext, landing: LandingResource) -> dg.SensorResult:
    """Adds a partition for each new, fully written batch file in the landing folder and requests its run.

    A run key is the batch key and the time of the tick that registers it: the daemon never runs a run key of
    this sensor twice, so a partition deleted (to reprocess it) and added again by a later tick gets a new run,
    while a tick that finds nothing new requests nothing (its batches are registered already).

    The cursor keeps the newest modification time among the settled batch files the sensor has seen (`since`):
    a known batch's file modified after it is re-delivered when its bytes are not the ones its raw rung last
    read, and runs again; a file only touched does not. Its first tick re-runs nothing. The cursor also keeps
    the set-aside files already alerted (`alerted`, with their modification times), so each raises its alert
    once, and again only if it changes.
    """
    folder = landing.path()
    created = ""
    if not folder.is_dir():
        try:  # the first tick of a fresh checkout or deployment: an empty landing folder, not a failed tick
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            return dg.SensorResult(skip_reason=f"landing folder {folder} does not exist and cannot be created: {exc}")
        created = f"created the landing folder {folder}; "
    cursor = json.loads(context.cursor) if context.cursor else {}
    known = set(context.instance.get_dynamic_partitions(crawl_batches_partitions.name))
    scan = scan_landing(folder, landing.settle_seconds)
    set_aside = scan.notices(landing.settle_seconds)
    for name, reason in scan.ignored:  # a file a crawler meant as a batch must not vanish without a word
        context.log.warning(f"landing file {name} ignored: {reason}")
    for key, reason in scan.ambiguous.items():  # the other batches go on; this one waits for a single file
        context.log.warning(f"landing batch {key} set aside: {reason}")
    alerted = cursor.get("alerted", {})
    overdue = overdue_notices(folder, scan, landing.alert_after_seconds)
    for name, (mtime, notice) in overdue.items():
        if alerted.get(name) != mtime:  # a pager hears of a file once, not on every tick
            alerts.error("ALERT dedup landing: %s", notice)
            context.log.error(f"ALERT {notice}")
    since = cursor.get("since")
    new_keys = [batch.key for batch in scan.batches if batch.key not in known]
    changed = [b for b in scan.batches if since is not None and b.key in known and b.mtime > since]
    again = redelivered(context.instance, changed)
    for key in again:
        context.log.warning(f"landing batch {key} re-delivered with other bytes: its run is requested again")
    next_cursor = json.dumps(
        {
            "since": max([since or 0.0] + [batch.mtime for batch in scan.batches]),
            "alerted": {name: mtime for name, (mtime, _) in overdue.items()},
        }
    )
    if not new_keys and not again:
        # The tick list shows the skip reason, not the tick's log: what was left alone, and why, goes there.
        return dg.SensorResult(
            skip_reason=created + "no new batch files" + "".join(f"; {n}" for n in set_aside), cursor=next_cursor
        )
    registered = datetime.now(UTC).isoformat()
    return dg.SensorResult(
        dynamic_partitions_requests=[crawl_batches_partitions.build_add_request(new_keys)] if new_keys else [],
        run_requests=[
            dg.RunRequest(partition_key=key, run_key=f"{key}@{registered}", tags={SOURCE_TAG: batch_source(key)})
            for key in new_keys + again
        ],
        cursor=next_cursor,
    )
