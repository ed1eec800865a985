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

# Every job runs in process unless it names its own executor (the Celery one does), the assets' own "Materialize"
# and backfills included: a run is one process, which loads the code location and Great Expectations once, where
# Dagster's default executor starts a process per step (eleven a batch), each loading them again. The ladder's steps
# form a chain, so none ran side by side; retry policies and the warehouse pool apply in process all the same.
# The figures: docs/benchmarks.md, "One run, in process".
defs = dg.Definitions(
    assets=ladder_assets,
    asset_checks=ladder_checks,
    jobs=[dedup_ladder_job, dedup_ladder_celery_job, *erasure_jobs],
    schedules=[ladder_catch_up, *erasure_schedules],
    sensors=[landing_sensor, ladder_failure_alert],
    resources=default_resources(),
    executor=dg.in_process_executor,
)

# The rehash migration: sharded backfill, comparison, switch and retire (dedup_pipeline/defs/rehash.py).
defs = dg.Definitions.merge(defs, rehash_definitions())
