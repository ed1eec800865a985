"""The code location: everything Dagster loads (`dg dev`, `dg check defs`, workspace.yaml)."""

import dagster as dg

from dedup_pipeline.defs.alerts import ladder_failure_alert
from dedup_pipeline.defs.assets import ladder_assets
from dedup_pipeline.defs.checks import ladder_checks
from dedup_pipeline.defs.erasure import erasure_jobs, erasure_schedules
from dedup_pipeline.defs.executors import dedup_ladder_celery_job
from dedup_pipeline.defs.jobs import dedup_ladder_job
from dedup_pipeline.defs.rehash import rehash_definitions
from dedup_pipeline.defs.resources import default_resources
from dedup_pipeline.defs.schedules import ladder_catch_up
from dedup_pipeline.defs.sensors import landing_sensor

defs = dg.Definitions(
    assets=ladder_assets,
    asset_checks=ladder_checks,
    jobs=[dedup_ladder_job, dedup_ladder_celery_job, *erasure_jobs],
    schedules=[ladder_catch_up, *erasure_schedules],
    sensors=[landing_sensor, ladder_failure_alert],
    resources=default_resources(),
)

# The rehash migration: sharded backfill, comparison, switch and retire (dedup_pipeline/defs/rehash.py).
defs = dg.Definitions.merge(defs, rehash_definitions())
