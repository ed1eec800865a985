"""A process's long-lived objects, kept out of the cyclic garbage collector's full collections.

A run's process holds, for its whole life, the objects its imports made: Dagster, pandas, SQLAlchemy and
Great Expectations leave several hundred thousand that the collector tracks. A rung allocates enough containers
a chunk to set off a full collection every few seconds, and each full collection walks every tracked object,
for objects that are never garbage (`benchmarks/bench_heap.py` measures what that costs a rung).

`settle` moves the objects alive now to the collector's permanent generation (`gc.freeze`), which no
collection walks. They are still freed when their last reference goes; only a reference cycle among them that
becomes garbage later stays until the process ends. So a process settles right after its large imports, when
what is alive is what it keeps: the command line after its own and after each batch (what the batch imported
on first use), a run's process after Great Expectations' (`quality.expectations`), a lanes' fork server after
all of them; a process forked after it (a lane of `dedup-pipeline run`) inherits the permanent generation.

A settled process also collects its youngest generation less often: after `YOUNG_THRESHOLD` new containers
rather than Python's 700. A chunk allocates them by the hundred thousand, most of them freed by reference
counting within the chunk; a young collection walks those still alive, so collecting ten times less often walks
fewer of them.
"""

from __future__ import annotations

import gc

#: New container objects between two collections of the youngest generation, in a settled process.
YOUNG_THRESHOLD = 10_000


def settle() -> None:
    """Collect the garbage there is, then freeze what is alive (after the first, a settle walks only what came
    since), and collect the youngest generation every `YOUNG_THRESHOLD` new containers."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(YOUNG_THRESHOLD, *gc.get_threshold()[1:])


__all__ = ["settle"]
