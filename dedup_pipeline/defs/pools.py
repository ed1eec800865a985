"""The instance's pools: the `warehouse` pool of the canonical, exact and near rungs (and the rehash backfill),
and its limit set before any step claims a slot.

Dagster sets a pool's limit to the instance's default (`concurrency: pools: default_limit`) in the first step
that claims one of its slots, and again in every step while the stored limit differs from the default. On a
PostgreSQL instance that fails whenever the limit's row already exists: two runs starting at once on a new
instance, or every run after the default was changed. Dagster's INSERT, refused, aborts the transaction in
which it then runs its UPDATE (dagster-io/dagster#33552), and the run fails before its first warehouse step.
`ensure_pool_limits` does the same work once, beforehand: `dedup-pipeline run` before its runs start, and the
production run coordinator as it queues each run. The steps then find the limit set and leave it alone.
"""

from __future__ import annotations

from collections.abc import Iterable

import dagster as dg
from sqlalchemy.exc import SQLAlchemyError

#: The canonical, exact and near rungs (and the rehash backfill) claim a slot of this pool, so the instance bounds
#: concurrent warehouse writers across runs and workers (`concurrency: pools:` in dagster.yaml and
#: deploy/dagster.yaml).
WAREHOUSE_POOL = "warehouse"
#: Looks at a pool's limit before giving up on setting it: another process may set it between a look and a write.
_ATTEMPTS = 3


def pool_limit(instance: dg.DagsterInstance, pool: str):
    """The limit the instance holds for `pool` (Dagster's `PoolLimit`: limit, from_default), or None."""
    return next((limit for limit in instance.event_log_storage.get_pool_limits() if limit.name == pool), None)


def _needs_default(limit, default: int | None) -> bool:
    """Whether a step would set the pool's limit to `default` (Dagster's own test, in its step's slot claim)."""
    if limit is None:
        return default is not None
    return limit.from_default and limit.limit != default


def ensure_pool_limits(instance: dg.DagsterInstance, pools: Iterable[str] = (WAREHOUSE_POOL,)) -> None:
    """Set each of `pools` to the instance's default limit where a run's step would, so that no step does.

    A limit set by an operator (`dagster instance concurrency set`, the UI) is kept. A default limit that no
    longer matches the instance's default is deleted and set again, which Dagster's own update cannot do on
    PostgreSQL; slots held by running steps stay theirs until released.
    """
    storage = instance.event_log_storage
    if not storage.supports_global_concurrency_limits:
        return
    default = storage.get_pool_config().default_pool_limit
    for pool in pools:
        for attempt in range(_ATTEMPTS):
            limit = pool_limit(instance, pool)
            if not _needs_default(limit, default):
                break
            try:
                if limit is not None:
                    storage.delete_concurrency_limit(pool)
                storage.initialize_concurrency_limit_to_default(pool)
            except SQLAlchemyError:  # another process set it meanwhile: look again
                if attempt == _ATTEMPTS - 1:
                    raise  # not a race: the error itself, not a run failing on it later
