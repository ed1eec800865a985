"""Per-chunk progress of a rung, for the step's log: records done, rate and time left.

A rung that works a chunk at a time calls `advance` after each one; the line goes to the callable it was
given (the asset passes `context.log.info`, so it lands in the step's log in the Dagster UI).
"""

from __future__ import annotations

import time
from collections.abc import Callable

ProgressLog = Callable[[str], None]


class ChunkProgress:
    """`canonical: 4,000 / 10,000 records (40%), 2,100 records/s, about 3 s left` after each chunk."""

    def __init__(
        self, rung: str, total: int | None, log: ProgressLog | None, clock: Callable[[], float] = time.monotonic
    ):
        self.rung, self.total, self.log, self.clock = rung, total, log, clock
        self.done = 0
        self.started = clock()

    def advance(self, records: int) -> None:
        self.done += records
        if self.log is None:
            return
        elapsed = max(self.clock() - self.started, 1e-9)
        rate = self.done / elapsed
        if self.total:
            left = max(self.total - self.done, 0) / rate if rate else 0.0
            self.log(
                f"{self.rung}: {self.done:,} / {self.total:,} records ({self.done / self.total:.0%}), "
                f"{rate:,.0f} records/s, about {_duration(left)} left"
            )
        else:
            self.log(f"{self.rung}: {self.done:,} records, {rate:,.0f} records/s")


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
