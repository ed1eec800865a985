"""Sources side by side: `dedup-pipeline run --workers N` runs each source's lane of batches in a worker process
(`core.parallel.ordered_map`, each worker taking the next lane when it is free).

A source's batches always run one after the other, in landing order (the exact
rung's history and the production lanes' rule); batches of different sources
share nothing but the warehouse, whose rungs take no cross-worker lock, so
their lanes may run at once. The warehouse comes out the same as one process
running every batch in landing order (the near rung's order independence is
tested on PostgreSQL). SQLite holds one writer at a time, so an SQLite
warehouse, like an in-memory Dagster instance, runs one lane at a time.
"""

from __future__ import annotations

from collections.abc import Sequence

from dedup_pipeline.core.parallel import available_cpus
from dedup_pipeline.landing import batch_source

#: Worker processes `run` uses by default: 0, one per CPU (at most one per source).
DEFAULT_WORKERS = 0


def source_lanes(keys: Sequence[str]) -> list[list[str]]:
    """The batch keys grouped by source, each group in the order given; the longest lanes first.

    Longest first, so that a pool with fewer workers than lanes does not start
    the longest one last.
    """
    lanes: dict[str, list[str]] = {}
    for key in keys:
        lanes.setdefault(batch_source(key), []).append(key)
    return sorted(lanes.values(), key=len, reverse=True)


def lane_workers(requested: int, lanes: int, dialect: str, persistent_instance: bool) -> int:
    """Worker processes for `lanes` lanes: `requested` (0: one per CPU), at most one per lane; 1 (this process
    alone) on an SQLite warehouse or an in-memory instance."""
    if requested < 0:
        raise ValueError("--workers must be 0 (one per CPU) or more")
    if dialect != "postgresql" or not persistent_instance:
        return 1
    return max(1, min(requested or available_cpus(), lanes))
