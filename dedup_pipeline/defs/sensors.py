"""The landing sensor: every new batch file becomes a partition and a run of the ladder."""

from datetime import UTC, datetime

import dagster as dg

from dedup_pipeline import environment
from dedup_pipeline.defs.jobs import dedup_ladder_job
from dedup_pipeline.defs.partitions import crawl_batches_partitions
from dedup_pipeline.defs.resources import LandingResource
from dedup_pipeline.landing import SOURCE_TAG, batch_source, scan_landing


def automation_status() -> dg.DefaultSensorStatus:
    """Sensors start running when DEDUP_AUTOMATION=on, else they wait to be switched on in the UI."""
    return dg.DefaultSensorStatus.RUNNING if environment.automation_enabled() else dg.DefaultSensorStatus.STOPPED


@dg.sensor(
    job=dedup_ladder_job,
    minimum_interval_seconds=30,
    default_status=automation_status(),
    description="Adds a partition for each new, fully written batch file in the landing folder and requests its "
    "run, tagged with the batch's source. Files still being written, files that are no batch and keys that two "
    "files map to are left alone and named in the tick's log.",
)
def landing_sensor(context: dg.SensorEvaluationContext, landing: LandingResource) -> dg.SensorResult:
    """Adds a partition for each new, fully written batch file in the landing folder and requests its run.

    A run key is the batch key and the time of the tick that registers it: the daemon never runs a run key of
    this sensor twice, so a partition deleted (to reprocess it) and added again by a later tick gets a new run,
    while a tick that finds nothing new requests nothing (its batches are registered already).
    """
    known = set(context.instance.get_dynamic_partitions(crawl_batches_partitions.name))
    scan = scan_landing(landing.path(), landing.settle_seconds)
    for name, reason in scan.ignored:  # a file a crawler meant as a batch must not vanish without a word
        context.log.warning(f"landing file {name} ignored: {reason}")
    for key, reason in scan.ambiguous.items():  # the other batches go on; this one waits for a single file
        context.log.warning(f"landing batch {key} set aside: {reason}")
    new_keys = [batch.key for batch in scan.batches if batch.key not in known]
    if not new_keys:
        return dg.SensorResult(skip_reason="no new batch files")
    registered = datetime.now(UTC).isoformat()
    return dg.SensorResult(
        dynamic_partitions_requests=[crawl_batches_partitions.build_add_request(new_keys)],
        run_requests=[
            dg.RunRequest(partition_key=key, run_key=f"{key}@{registered}", tags={SOURCE_TAG: batch_source(key)})
            for key in new_keys
        ],
    )
