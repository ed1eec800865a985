"""The baseline of `bench_run_process.py`: the project's code location on Dagster's default executor.

The same assets, checks, resources and jobs as `dedup_pipeline.definitions`, but with a process per step
(`multiprocess_executor`, what every job ran on before the code location chose the in-process executor).
"""

import dagster as dg

from dedup_pipeline import definitions
from dedup_pipeline.defs.jobs import dedup_ladder_job

defs = dg.Definitions(
    assets=definitions.defs.assets,
    asset_checks=definitions.defs.asset_checks,
    jobs=[dedup_ladder_job],
    resources=definitions.defs.resources,
    executor=dg.multiprocess_executor,
)
