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
from pathlib import Path

from dedup_pipeline.core.parallel import available_cpus, start_preloading
from dedup_pipeline.landing import batch_source, scan_landing

#: Worker processes `run` uses by default: 0, one per CPU (at most one per source).
DEFAULT_WORKERS = 0
#: What the lanes' worker processes are forked with, imported once (`cli/lane_preload.py`).
LANE_PRELOAD = ("dedup_pipeline.cli.lane_preload",)


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


def start_lane_imports(landing: Path, settle_seconds: float, requested: int) -> None:
    """Start the lanes' fork server (`LANE_PRELOAD`) now if `run` over `landing` will take several lanes.

    The command line calls it before it imports Dagster itself: the server's imports (seconds of CPU, which every
    lane waits for) then go on beside this process's own. A guess from the landing folder and the warehouse
    URL, for the command line's instance (always persistent); `run_landing_folder` decides, and starts the
    server itself if it is not running.
    """
    from dedup_pipeline.store.warehouse import default_database_url, parse_url

    lanes = source_lanes([batch.key for batch in scan_landing(landing, settle_seconds).batches])
    dialect = parse_url(default_database_url()).get_backend_name()
    if lane_workers(requested, len(lanes), dialect, persistent_instance=True) > 1:
        start_preloading(LANE_PRELOAD)
