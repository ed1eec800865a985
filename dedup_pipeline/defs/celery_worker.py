"""The Celery app the ladder's workers run: `celery -A dedup_pipeline.defs.celery_worker worker -Q <queue>`.

It is dagster-celery's step task bound to the same broker, backend and queue
as `dedup_ladder_celery` (`dedup_pipeline.defs.executors.celery_settings`), so
a worker started with the same environment as the code location takes exactly
that job's steps. Each task loads the run's instance from its reference and
the job from the code location, then executes one step.
"""

from __future__ import annotations

from dagster_celery.executor import CeleryExecutor
from dagster_celery.make_app import make_app
from dagster_celery.tasks import create_task

from dedup_pipeline.defs.executors import celery_settings

_settings = celery_settings()
app = make_app(
    CeleryExecutor.for_cli(
        broker=_settings["broker"], backend=_settings["backend"], config_source=_settings["config_source"]
    ).app_args()
)
execute_plan = create_task(app)
