"""What `heap.settle` saves a run's process: a rung's work with the imports' objects in the garbage collector's
reach, and settled out of it, in one process, taking turns.

    python benchmarks/bench_heap.py [--lines 20000] [--rounds 7]

The process first imports what a run's process holds (Dagster, pandas, Great Expectations, the project's
definitions), then canonicalises the lines of a generated crawl (`bench_e2e.write_crawl`, the typical density)
chunk by chunk, as the canonical rung's pure part does (`canonicalise_lines`: parse, canonical URL and payload,
both digests), once per round on each side:
- as imported: Python's collector as it starts (its own thresholds, 700 new containers a young collection
  on CPython 3.11; every object tracked);
- settled: after `heap.settle()` (the objects alive frozen out of every collection, young collections every
  `heap.YOUNG_THRESHOLD`).
Printed: objects the collector tracks on each side, and per side the median over the rounds of the CPU time of
this process (`time.process_time`) and of the time spent in the collector (`gc.callbacks`), with the median
of the per-round ratios.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.bench_e2e import write_crawl  # noqa: E402
from benchmarks.common import at_least_one  # noqa: E402
from dedup_pipeline import environment, heap  # noqa: E402
from dedup_pipeline.core.hashing import INITIAL_ACTIVE_VERSION  # noqa: E402
from dedup_pipeline.core.url import URL_VERSION  # noqa: E402
from dedup_pipeline.ladder.canonical_lines import canonicalise_lines  # noqa: E402
from dedup_pipeline.ladder.settings import LadderSettings  # noqa: E402

CHUNK = 2_000


class CollectorClock:
    """Seconds spent in the cyclic garbage collector since `reset`."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._started = 0.0
        gc.callbacks.append(self._tick)

    def _tick(self, phase: str, _info: dict) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._started

    def reset(self) -> None:
        self.seconds = 0.0


#: The collector's thresholds as this interpreter starts them, before anything settles.
PYTHON_THRESHOLDS = gc.get_threshold()


def as_imported() -> None:
    gc.unfreeze()
    gc.set_threshold(*PYTHON_THRESHOLDS)


def load_lines(count: int) -> list[tuple[int, bytes]]:
    with tempfile.TemporaryDirectory(prefix="bench-heap-") as folder:
        (path,) = write_crawl(Path(folder), count, 1, "typical")
        return list(enumerate(path.read_bytes().splitlines(), start=1))


def canonicalise(lines: list[tuple[int, bytes]]) -> int:
    """The canonical rung's pure part over `lines`, with the ladder's default settings; the lines staged."""
    settings = LadderSettings()
    versions = tuple(dict.fromkeys((INITIAL_ACTIVE_VERSION, *settings.hash_versions)))
    staged = 0
    for start in range(0, len(lines), CHUNK):
        chunk = lines[start : start + CHUNK]
        out = canonicalise_lines(chunk, "bench", versions, INITIAL_ACTIVE_VERSION, settings.natural_key, URL_VERSION)
        staged += len(out.rows)
    return staged


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lines", type=at_least_one, default=20_000)
    parser.add_argument("--rounds", type=at_least_one, default=7)
    args = parser.parse_args()

    environment.quiet_great_expectations()
    import dagster  # noqa: F401
    import great_expectations.expectations  # noqa: F401
    import pandas  # noqa: F401

    import dedup_pipeline.definitions  # noqa: F401

    lines = load_lines(args.lines)
    clock = CollectorClock()
    sides = {"as imported": as_imported, "settled": heap.settle}
    tracked = {}
    cpu: dict[str, list[float]] = {name: [] for name in sides}
    collector: dict[str, list[float]] = {name: [] for name in sides}
    for round_no in range(args.rounds):
        order = list(sides) if round_no % 2 == 0 else list(reversed(sides))
        for name in order:
            sides[name]()
            tracked[name] = len(gc.get_objects())
            clock.reset()
            started = time.process_time()
            staged = canonicalise(lines)
            cpu[name].append(time.process_time() - started)
            collector[name].append(clock.seconds)
    as_imported()
    print(f"{staged:,} lines canonicalised a round, {args.rounds} rounds, chunks of {CHUNK:,}")
    for name in sides:
        print(
            f"  {name:12s} {tracked[name]:>9,} objects tracked   CPU {statistics.median(cpu[name]):6.2f} s   "
            f"in the collector {statistics.median(collector[name]):5.2f} s"
        )
    ratios = [a / b for a, b in zip(cpu["settled"], cpu["as imported"])]
    spread = f"rounds {min(ratios):.2f} to {max(ratios):.2f}"
    print(f"  settled / as imported, CPU: {statistics.median(ratios):.2f}x ({spread})")


if __name__ == "__main__":
    main()
