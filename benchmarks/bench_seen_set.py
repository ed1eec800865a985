"""The exact rung on a re-crawl batch with each seen-set kind, side by side, in one run.

    python benchmarks/bench_seen_set.py [--records 50000] [--repeat 5]

Batch `a` holds N new listings; batch `b`, landed after it, re-crawls half of
them unchanged (other volatile fields) and brings N/2 new ones. For each
repeat and each kind (none, bloom, redis, and redis-cold: Redis with every key
deleted after batch `a`, as after a flush or a restart without persistence),
in turn: a fresh PostgreSQL database, raw + canonical rungs for both batches
and the exact rung for `a` (untimed, which also warms the seen-set), then the
exact rung for `b`, timed (wall). Printed: the median seconds per kind and its
ratio to `none`, with the seen-set hits and the chunks replayed because the
seen-set was cold, so the cost or gain of the fast path on this machine is a
figure rather than a belief. The Bloom filter is sized for 1,000,000 digests
at 0.1%; Redis keys go to a private prefix, deleted afterwards.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import sys
import tempfile
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.bench_exact import REDIS_URL, SETTINGS, _clear  # noqa: E402
from benchmarks.common import at_least_one, median, product, scratch_database, timed, write_jsonl  # noqa: E402
from dedup_pipeline.ladder.canonical import canonicalise_batch  # noqa: E402
from dedup_pipeline.ladder.exact import ExactReport, deduplicate_batch  # noqa: E402
from dedup_pipeline.ladder.raw import ingest_raw_batch  # noqa: E402
from dedup_pipeline.landing import find_batch  # noqa: E402
from dedup_pipeline.store.seen_set import BloomSeenSet, NoSeenSet, RedisSeenSet  # noqa: E402
from dedup_pipeline.store.warehouse import Warehouse  # noqa: E402

KINDS = ("none", "bloom", "redis", "redis-cold")


def write_batches(folder: Path, n: int) -> None:
    rng = random.Random(1)
    first = [product(i, rng) for i in range(n)]
    second = [{**record, "crawl_id": "again", "etag": "e2"} for record in first[: n // 2]]
    second += [product(i, rng) for i in range(n, n + n // 2)]
    rng.shuffle(second)
    for name, records, landed in (("a", first, 1e9), ("b", second, 1e9 + 60)):
        path = write_jsonl(records, folder / f"{name}.jsonl")
        os.utime(path, (landed, landed))


def make_seen_set(kind: str, scratch: Path):
    if kind.startswith("redis"):
        return RedisSeenSet(REDIS_URL, prefix=f"bench-seen:{uuid.uuid4().hex}")
    if kind == "bloom":
        return BloomSeenSet(Path(tempfile.mkdtemp(dir=scratch)), capacity=1_000_000, error_rate=0.001)
    return NoSeenSet()


def time_recrawl(folder: Path, kind: str) -> tuple[float, ExactReport]:
    """Seconds of the exact rung on batch `b` after `a`, and its report."""
    with scratch_database() as url:
        warehouse = Warehouse(url).create_schema()
        seen = make_seen_set(kind, folder)
        for key in ("a", "b"):
            ingest_raw_batch(warehouse, find_batch(folder, key))
            canonicalise_batch(warehouse, key, SETTINGS)
        deduplicate_batch(warehouse, "a", "bench", SETTINGS, seen)
        if kind == "redis-cold":
            _clear(seen.client, seen.prefix)
        seconds, report = timed(deduplicate_batch, warehouse, "b", "bench", SETTINGS, seen)
        warehouse.dispose()
        if kind.startswith("redis"):
            _clear(seen.client, seen.prefix)
    return seconds, report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=at_least_one, default=50_000, help="listings in batch a (and in batch b)")
    parser.add_argument("--repeat", type=at_least_one, default=5)
    args = parser.parse_args()

    folder = Path(tempfile.mkdtemp(prefix="bench-seen-set-"))
    seconds: dict[str, list[float]] = {kind: [] for kind in KINDS}
    reports: dict[str, ExactReport] = {}
    try:
        write_batches(folder, args.records)
        for _ in range(args.repeat):  # kinds in turn, so drift on a shared machine hits them all alike
            for kind in KINDS:
                elapsed, reports[kind] = time_recrawl(folder, kind)
                seconds[kind].append(elapsed)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    baseline = median(seconds["none"])
    print(
        f"exact rung on a batch of {args.records:,} records ({args.records // 2:,} unchanged re-crawls, "
        f"{args.records // 2:,} new) after a stored batch, {args.repeat} repeats, median wall seconds"
    )
    for kind in KINDS:
        runs = ", ".join(f"{s:.2f}" for s in seconds[kind])
        report = reports[kind]
        print(
            f"  {kind:10s} {median(seconds[kind]):6.2f} s   {median(seconds[kind]) / baseline:5.2f}x none   "
            f"hits {report.seen_set_hits:,}   cold-miss chunks {report.seen_set_cold_misses}   (runs: {runs})"
        )


if __name__ == "__main__":
    main()
