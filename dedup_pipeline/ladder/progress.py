"""Progress of a rung that works a chunk at a time, for the step's log: records done, rate and time left.

A rung calls `advance` after each chunk and `finish` at its end; a line goes to the callable it was given
(the asset passes `context.log.info`, so it lands in the step's log in the Dagster UI). A line after the
first chunk says the step is under way, then at most one every `PROGRESS_EVERY` seconds, and one for the
last chunk: a batch of a million lines logs a line every ten seconds, not one per chunk (each is an event
in the run's event log).
"""

from __future__ import annotations

import time
from collections.abc import Callable

ProgressLog = Callable[[str], None]
#: Seconds between two progress lines of a rung.
PROGRESS_EVERY = 10.0


class ChunkProgress:
    """`canonical: 4,000 / 10,000 records (40%), 2,100 records/s, about 3 s left`: after the first chunk, then
    at most every `every` seconds, and after the last (the chunk that reaches `total`, or `finish`)."""

    def __init__(
        self,
        rung: str,
        total: int | None,
        log: ProgressLog | None,
        clock: Callable[[], float] = time.monotonic,
        every: float = PROGRESS_EVERY,
    ):
        self.rung, self.total, self.log, self.clock, self.every = rung, total, log, clock, every
        self.done = 0
        self.started = clock()
        self.logged_at: float | None = None
        self.unlogged = False  # chunks done since the last line

    def advance(self, records: int) -> None:
        self.done += records
        if self.log is None:
            return
        now = self.clock()
        last = self.total is not None and self.done >= self.total
        if last or self.logged_at is None or now - self.logged_at >= self.every:
            self._line(now)
        else:
            self.unlogged = True

    def finish(self) -> None:
        """The last line, where the last chunk's was held back."""
        if self.log is not None and self.unlogged:
            self._line(self.clock())

    def _line(self, now: float) -> None:
        self.logged_at, self.unlogged = now, False
        rate = self.done / max(now - self.started, 1e-9)
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
