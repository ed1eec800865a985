"""The catch-up schedule: a periodic sweep that re-scans the landing folder and runs every batch not yet done.

The landing sensor reacts within a minute to new files; the schedule is the
safety net behind it. Every hour it registers batch files the sensor has not
(a sensor that was off, a file that settled late) and requests a run of the
ladder for each batch whose last rung (`near_duplicate_clusters`) was never
materialised: batches whose run failed, was cancelled or was never launched.
Batches with a run queued or in progress (of any job: the ladder's, its Celery
twin's, or one launched from an asset's page) are left alone, and so are
partitions whose file is no longer in the landing folder. Re-running a batch
is safe (idempotent), so the worst a sweep does is a redundant run.

Turned on with the landing sensor by `DEDUP_AUTOMATION=on`, or in the UI.
"""

import dagster as dg

from dedup_pipeline.defs.assets import near_duplicate_clusters
from dedup_pipeline.defs.jobs import dedup_ladder_job
from dedup_pipeline.defs.partitions import crawl_batches_partitions
from dedup_pipeline.defs.resources import LandingResource
from dedup_pipeline.defs.sensors import automation_status
from dedup_pipeline.landing import SOURCE_TAG, BatchFileError, batch_source, list_batches

CATCH_UP_CRON = "17 * * * *"
#: At most this many runs per tick; the rest wait for the next sweep (the run queue limits concurrency too).
MAX_RUNS_PER_TICK = 50
_UNFINISHED = [
    dg.DagsterRunStatus.QUEUED,
    dg.DagsterRunStatus.NOT_STARTED,
    dg.DagsterRunStatus.STARTING,
    dg.DagsterRunStatus.STARTED,
    dg.DagsterRunStatus.CANCELING,
]
PARTITION_TAG = "dagster/partition"


def _in_flight(instance: dg.DagsterInstance) -> set[str]:
    """Partitions with a run queued or in progress, of any job: `dedup_ladder`'s, `dedup_ladder_celery`'s, or a
    materialisation launched from an asset's page (an asset job of its own)."""
    runs = instance.get_run_records(dg.RunsFilter(statuses=_UNFINISHED))
    return {record.dagster_run.tags[PARTITION_TAG] for record in runs if PARTITION_TAG in record.dagster_run.tags}


@dg.schedule(
    job=dedup_ladder_job,
    cron_schedule=CATCH_UP_CRON,
    name="ladder_catch_up",
    default_status=dg.DefaultScheduleStatus(automation_status().value),
    description="Hourly: registers landed batch files and runs the ladder for every batch not yet materialised.",
)
def ladder_catch_up(context: dg.ScheduleEvaluationContext, landing: LandingResource):
    try:
        present = [batch.key for batch in list_batches(landing.path(), landing.settle_seconds)]
    except BatchFileError as exc:
        return dg.SkipReason(f"cannot read the landing folder: {exc}")
    instance = context.instance
    known = set(instance.get_dynamic_partitions(crawl_batches_partitions.name))
    new = [key for key in present if key not in known]
    if new:
        instance.add_dynamic_partitions(crawl_batches_partitions.name, new)
    done = instance.get_materialized_partitions(near_duplicate_clusters.key)
    busy = _in_flight(instance)
    todo = [key for key in present if key not in done and key not in busy][:MAX_RUNS_PER_TICK]
    if not todo:
        return dg.SkipReason(f"all {len(present)} landed batches are materialised or running")
    tick = context.scheduled_execution_time.isoformat() if context.scheduled_execution_time else "manual"
    return [
        dg.RunRequest(
            partition_key=key,
            run_key=f"{key}@{tick}",
            tags={"dedup/trigger": "catch-up", SOURCE_TAG: batch_source(key)},
        )
        for key in todo
    ]
