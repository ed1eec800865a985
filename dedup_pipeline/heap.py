"""A process's long-lived objects, kept out of the cyclic garbage collector's full collections.

A run's process holds, for its whole life, the objects its imports made: Dagster, pandas, SQLAlchemy and
Great Expectations leave about half a million that the collector tracks. A rung allocates enough containers
a chunk to set off a full collection every few seconds, and each full collection walks every tracked object:
on the typical crawl of `benchmarks/bench_e2e.py` (100,000 lines, one process), 14 full collections of about
0.2 s each, 3 s of the run's 34 s of CPU, for objects that are never garbage.

`settle` moves the objects alive now to the collector's permanent generation (`gc.freeze`), which no
collection walks. They are still freed when their last reference goes; only a reference cycle among them that
becomes garbage later stays until the process ends. So a process settles right after its large imports, when
what is alive is what it keeps: the command line after its own, a run's process after Great Expectations'
(`quality.expectations`), a lanes' fork server after all of them; a process forked after it (a lane of
`dedup-pipeline run`) inherits the permanent generation.
"""

from __future__ import annotations

import gc


def settle() -> None:
    """Collect the garbage there is, then freeze what is alive (after the first, a settle walks only what came
    since)."""
    gc.collect()
    gc.freeze()


__all__ = ["settle"]
