"""The code location: everything Dagster loads (`dg dev`, `dg check defs`, workspace.yaml)."""

import dagster as dg

from dedup_pipeline.defs.assets import ladder_assets
from dedup_pipeline.defs.jobs import dedup_ladder_job
from dedup_pipeline.defs.resources import default_resources
from dedup_pipeline.defs.sensors import landing_sensor

defs = dg.Definitions(
    assets=ladder_assets,
    jobs=[dedup_ladder_job],
    sensors=[landing_sensor],
    resources=default_resources(),
)
