"""Distributed execution: the ladder's steps as Celery tasks on a pool of workers (dagster-celery).

`dedup_ladder_celery` is the same four assets as `dedup_ladder`, on the celery
executor: the run worker puts each step on a RabbitMQ queue and any celery
worker (`celery -A dedup_pipeline.defs.celery_worker worker`, see deploy/)
picks it up. Steps share nothing but the stores: the warehouse (records,
hashes, the active hash version, the LSH index) in PostgreSQL and the seen-set
in Redis. The default `dedup_ladder` job runs its steps in the run worker's own
process (the code location's in-process executor, `definitions.py`).

Broker, result backend and queue come from the environment, read when the
code location loads (the run worker and the celery workers must agree):
``DEDUP_CELERY_BROKER_URL``, ``DEDUP_CELERY_BACKEND_URL`` and ``DEDUP_CELERY_QUEUE``
(defaults in `dedup_pipeline.environment`).
"""

from __future__ import annotations

import dagster as dg
from dagster_celery import celery_executor

from dedup_pipeline import environment
from dedup_pipeline.defs.assets import ladder_assets


def celery_settings() -> dict:
    """The celery executor's config (broker, backend, queue) from the environment."""
    return {
        "broker": environment.celery_broker_url(),
        "backend": environment.celery_backend_url(),
        "config_source": {"task_default_queue": environment.celery_queue()},
    }


dedup_celery_executor = celery_executor.configured(celery_settings(), name="dedup_celery")

dedup_ladder_celery_job = dg.define_asset_job(
    "dedup_ladder_celery",
    selection=dg.AssetSelection.assets(*ladder_assets),
    executor_def=dedup_celery_executor,
    description=(
        "The whole dedup ladder for one crawl batch, each step a Celery task on the worker pool "
        "(RabbitMQ broker, shared PostgreSQL warehouse and Redis seen-set). Needs running celery workers."
    ),
)
