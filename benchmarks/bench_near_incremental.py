"""Incremental near-duplicate clustering on PostgreSQL: per-batch time and peak memory as the index grows.

    .venv/bin/python benchmarks/bench_near_incremental.py                       # 1,000,000 docs, batches of 100,000
    .venv/bin/python benchmarks/bench_near_incremental.py --docs 100000 --batch 10000   # 1/10 scale

A scratch PostgreSQL database (benchmarks/common.py `scratch_database`, dropped
at the end) receives ``--docs`` synthetic documents of about 2 KB in batches
of ``--batch``. For each batch, two fresh child processes run one after the
other:

1. ``load``: the batch's records are generated and COPYed into ``records``
   (``last_batch_id`` = the batch), not through the whole ladder; then
   ``ANALYZE`` (as autovacuum would after a 10% change). Not part of the
   near-duplicate figures. Checkpoints are left to the server, as in a
   deployment: forcing one before each clustering would make every batch
   pay full-page writes for every index page it touches.
2. ``cluster``: ``ladder.near.cluster_batch`` with the default parameters
   (MinHash, `auto` shingles: word 3-grams for these long texts, 128
   permutations, 26 bands x 3 rows, auto verification, ``max_candidates``
   1000, chunks of 2000): sketch, store the
   index rows, find candidates in every earlier batch, verify,
   link, cluster. Its wall time and its peak RSS (``VmHWM`` of the child)
   are the figures.

Documents: words drawn from a seeded Zipf-like vocabulary of pseudo-words, so
unrelated documents share a few common word 3-grams, as real text does. Every
``--copy-every``-th document is a planted near duplicate: a copy of an
earlier original (any earlier batch or its own) with 5% of its words
replaced (word 3-gram Jaccard about 0.75). Recall: the share of planted
(original, copy) pairs linked directly and the share in one cluster.

Also printed: EXPLAIN (ANALYZE, BUFFERS) of the candidate statement for one chunk of
the last batch against the full index, to show that it is index lookups per
bucket key and does not scan the index.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import at_least_one, median, scratch_database  # noqa: E402
from dedup_pipeline.core.hashing import INITIAL_ACTIVE_VERSION  # noqa: E402
from dedup_pipeline.core.near import NearDupParams  # noqa: E402
from dedup_pipeline.ladder.near import cluster_batch
from dedup_pipeline.ladder.settings import NearSettings  # noqa: E402
from dedup_pipeline.store.bulk import copy_rows  # noqa: E402
from dedup_pipeline.store.near import _candidate_sql  # noqa: E402
from dedup_pipeline.store.schema import RECORD_COLUMNS, records  # noqa: E402
from dedup_pipeline.store.warehouse import Warehouse  # noqa: E402

SEED = 20261130
WORDS_PER_DOC = (270, 320)  # about 2 KB of text with the vocabulary below
EDIT_SHARE = 0.05
LANDED = "2026-11-01T00:00:00+00:00"


class Corpus:
    """Document i is a pure function of (SEED, i): any process can regenerate any document."""

    def __init__(self, copy_every: int, vocabulary: int = 60_000):
        rng = np.random.default_rng(SEED)
        syllables = np.array([a + b for a in "bcdfgklmnprstvz" for b in "aeiou"])
        parts = rng.integers(0, syllables.size, size=(vocabulary, 3))
        self.words = np.array(["".join(syllables[p]) for p in parts])
        weights = 1.0 / np.arange(1, vocabulary + 1) ** 0.9
        self.cdf = np.cumsum(weights / weights.sum())
        self.copy_every = copy_every

    def is_copy(self, i: int) -> bool:
        return i % self.copy_every == self.copy_every - 1

    def source(self, i: int) -> int:
        """The original a planted copy was made from (an earlier document that is not a copy)."""
        s = int(np.random.default_rng([SEED, i, 1]).integers(0, i))
        return s - 1 if self.is_copy(s) else s

    def _words(self, i: int) -> list[str]:
        rng = np.random.default_rng([SEED, i])
        n = int(rng.integers(*WORDS_PER_DOC))
        return self.words[np.minimum(np.searchsorted(self.cdf, rng.random(n)), self.words.size - 1)].tolist()

    def text(self, i: int) -> str:
        if not self.is_copy(i):
            return " ".join(self._words(i))
        words = self._words(self.source(i))
        rng = np.random.default_rng([SEED, i, 2])
        picks = rng.choice(len(words), size=int(len(words) * EDIT_SHARE), replace=False)
        fresh = self.words[rng.integers(0, self.words.size, size=picks.size)]
        for k, w in zip(picks.tolist(), fresh.tolist()):
            words[k] = w
        return " ".join(words)


def batch_key(b: int) -> str:
    return f"bench-{b:03d}"


def peak_rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def child_load(url: str, b: int, batch: int, copy_every: int) -> dict:
    corpus = Corpus(copy_every)
    warehouse = Warehouse(url)
    start = time.perf_counter()
    key = batch_key(b)
    for low in range(b * batch, (b + 1) * batch, 10_000):
        high = min(low + 10_000, (b + 1) * batch)
        rows = []
        for i in range(low, high):
            url_i = f"https://site{i % 50}.example.com/doc/{i}"
            payload = {"url": url_i, "title": f"Document {i}", "description": corpus.text(i)}
            digest = hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).digest()
            rows.append(
                (
                    i + 1,
                    url_i,
                    url_i,
                    "url/1",
                    INITIAL_ACTIVE_VERSION,
                    digest,
                    payload,
                    LANDED,
                    LANDED,
                    key,
                    key,
                    LANDED,
                    i - low + 1,
                )
            )
        with warehouse.engine.begin() as conn:
            copy_rows(
                conn,
                records,
                RECORD_COLUMNS,
                rows,
            )
    with warehouse.engine.connect() as conn:
        conn.exec_driver_sql("ANALYZE records")
        conn.exec_driver_sql("ANALYZE near_index")
        conn.commit()
    warehouse.dispose()
    return {"load_s": time.perf_counter() - start}


def child_cluster(url: str, b: int) -> dict:
    warehouse = Warehouse(url)
    start = time.perf_counter()
    report = cluster_batch(warehouse, batch_key(b), NearSettings())
    seconds = time.perf_counter() - start
    warehouse.dispose()
    return {
        "cluster_s": seconds,
        "peak_rss_mb": peak_rss_mb(),
        "sketched": report.sketched,
        "candidate_pairs": report.candidate_pairs,
        "pairs": report.pairs,
        "capped": len(report.capped),
    }


def run_child(*args: str) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    out = subprocess.run(
        [sys.executable, __file__, "--child", *args], check=True, capture_output=True, text=True, env=env
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def recall(url: str, docs: int, copy_every: int) -> tuple[int, float, float]:
    corpus = Corpus(copy_every)
    planted = [(corpus.source(i) + 1, i + 1) for i in range(docs) if corpus.is_copy(i)]
    warehouse = Warehouse(url)
    with warehouse.engine.connect() as conn:
        links = set(conn.exec_driver_sql("SELECT record_a, record_b FROM near_duplicate_links").all())
        cluster = dict(conn.exec_driver_sql("SELECT record_id, cluster_id FROM near_duplicate_clusters").all())
    warehouse.dispose()
    linked = sum((a, b) in links or (b, a) in links for a, b in planted)
    together = sum(a in cluster and cluster.get(a) == cluster.get(b) for a, b in planted)
    return len(planted), linked / len(planted), together / len(planted)


def explain(url: str, b: int, batch: int) -> str:
    ids = list(range(b * batch + 1, b * batch + 2001))
    warehouse = Warehouse(url)
    with warehouse.engine.connect() as conn:
        sql = _candidate_sql(NearDupParams().bands, True)  # what candidate_pairs runs on PostgreSQL
        plan = (
            conn.exec_driver_sql(
                "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) "
                + sql.replace(":ids", "%(ids)s").replace(":limit", "%(limit)s"),
                {"ids": ids, "limit": NearSettings.max_candidates + 1},
            )
            .scalars()
            .all()
        )
        sizes = conn.exec_driver_sql(
            "SELECT pg_size_pretty(pg_total_relation_size('near_index')), (SELECT count(*) FROM near_index)"
        ).one()
    warehouse.dispose()
    shown = [line if len(line) < 160 else line[:150] + " ...]))" for line in plan]  # the 2000 ids left out
    return f"near_index: {sizes[1]:,} rows, {sizes[0]} with indexes\n" + "\n".join(shown)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--docs", type=at_least_one, default=1_000_000)
    parser.add_argument("--batch", type=at_least_one, default=100_000)
    parser.add_argument(
        "--copy-every", type=at_least_one, default=10, help="every n-th document is a planted near copy"
    )
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        mode, url, b = args.child[0], args.child[1], int(args.child[2])
        result = child_load(url, b, args.batch, args.copy_every) if mode == "load" else child_cluster(url, b)
        print(json.dumps(result))
        return
    batches = args.docs // args.batch
    print(
        f"{batches} batches of {args.batch:,} documents (~2 KB), every {args.copy_every}th a planted near copy; "
        f"PostgreSQL scratch database; cluster_batch defaults (max_candidates {NearSettings.max_candidates})"
    )
    print(
        f"{'batch':>5} {'index before':>12} {'load s':>7} {'cluster s':>9} {'docs/s':>7} {'peak RSS MB':>11} "
        f"{'candidates':>10} {'pairs':>7} {'capped':>6}"
    )
    rows = []
    started = time.perf_counter()
    with scratch_database() as url:
        Warehouse(url).create_schema().dispose()
        for b in range(batches):
            load = run_child("load", url, str(b), "--batch", str(args.batch), "--copy-every", str(args.copy_every))
            result = {**load, **run_child("cluster", url, str(b), "--batch", str(args.batch))}
            rows.append(result)
            print(
                f"{b:>5} {b * args.batch:>12,} {result['load_s']:>7.1f} {result['cluster_s']:>9.1f} "
                f"{result['sketched'] / result['cluster_s']:>7.0f} {result['peak_rss_mb']:>11.0f} "
                f"{result['candidate_pairs']:>10,} {result['pairs']:>7,} {result['capped']:>6}",
                flush=True,
            )
        planted, linked, together = recall(url, batches * args.batch, args.copy_every)
        plan = explain(url, batches - 1, args.batch)
    times = [r["cluster_s"] for r in rows]
    rss = [r["peak_rss_mb"] for r in rows]
    print(
        f"\nper-batch cluster time: first {times[0]:.1f} s, last {times[-1]:.1f} s, median {median(times):.1f} s; "
        f"last/first {times[-1] / times[0]:.2f}x (target <= 1.2x)"
    )
    if len(times) >= 10:
        print(f"tenth batch / second batch: {times[9] / times[1]:.2f}x (target <= 1.2x)")
    if len(times) >= 6:
        first, last = median(times[:3]), median(times[-3:])
        print(f"median of the first three batches {first:.1f} s, of the last three {last:.1f} s: {last / first:.2f}x")
    print(f"peak RSS per batch: first {rss[0]:.0f} MB, last {rss[-1]:.0f} MB, max {max(rss):.0f} MB")
    print(f"planted pairs: {planted:,}; recall linked {linked:.4f}, same cluster {together:.4f}")
    print(f"total wall time {time.perf_counter() - started:.0f} s")
    print(
        "\nEXPLAIN (ANALYZE, BUFFERS) of the candidate statement, one chunk (2000 records) of the last batch:\n" + plan
    )


if __name__ == "__main__":
    main()
