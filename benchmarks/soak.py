"""Soak: millions of records through the whole ladder on PostgreSQL and Redis, batch after batch.

    python benchmarks/soak.py [--records 2000000] [--batches 20] [--chunk 2000]

The crawl is generated deterministically with its ground truth known up
front: every product's content is a pure function of (product id, price
version), so the generator knows, line by line, what each decision must be:
- new products (first sighting);
- exact re-crawls of earlier products (only volatile fetch fields differ);
- changed prices of earlier products (same key, new content: `changed`, old
  content to history);
- tracking-parameter variants of a product new in the same batch (same key,
  same content: `exact_duplicate`);
- near duplicates: copies of a product on a mirror host with two words of the
  description replaced (a new key; the near-duplicate rung must link them);
- a few broken lines (quarantined).

Each batch runs in a fresh process (the four rungs the assets run: raw,
canonical, exact with a Redis seen-set, near), so its peak RSS is its own:
VmHWM from /proc/self/status, reset before each rung through
/proc/self/clear_refs. Printed per batch: throughput of each rung (input
records per second) and peak RSS; then the first batches against the last
(medians, ratios: memory must stay flat, throughput should), and the warehouse
counts against the ground truth (they must match exactly; near-duplicate
recall is reported against the planted copies).

Redis is a private redis-server started for the run (no persistence) and the
PostgreSQL database is a scratch one, both removed at the end.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from array import array
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from statistics import median

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import at_least_one  # noqa: E402

RUNGS = ("raw", "canonical", "exact", "near")
DAY = 86400.0
T0 = 1_790_000_000.0
SYLLABLES = [a + b for a in "bcdfgklmnprstvz" for b in "aeiou"]
VOCABULARY = [a + b + c for a in SYLLABLES for b in SYLLABLES[:40] for c in SYLLABLES[:8]]  # 24,000 words
DESCRIPTION_WORDS = 28


# ------------------------------------------------------------------ the crawl and its ground truth


def _numbers(seed: bytes, n: int) -> list[int]:
    """`n` pseudo-random 16-bit numbers, a pure function of `seed`."""
    digest = hashlib.blake2b(seed, digest_size=64).digest()
    while len(digest) < 2 * n:
        digest += hashlib.blake2b(digest, digest_size=64).digest()
    return [int.from_bytes(digest[2 * i : 2 * i + 2], "little") for i in range(n)]


def _words(seed: bytes, n: int) -> list[str]:
    return [VOCABULARY[x % len(VOCABULARY)] for x in _numbers(seed, n)]


def product(p: int, version: int, batch: int, url: str | None = None, description: str | None = None) -> dict:
    """Product `p` at price version `version`, as a crawler fetching it in `batch` writes it."""
    words = _words(b"p%d" % p, DESCRIPTION_WORDS + 2)
    return {
        "url": url or f"https://shop{p % 50}.example.com/p/{p}",
        "title": f"{words[0].title()} {words[1]} kettle {p}",
        "description": description or " ".join(words[2:]),
        "price": f"{5 + p % 400 + version}.{p % 100:02d}",
        "currency": "EUR",
        "seller_id": f"seller-{p % 997}",
        "sku": f"SKU-{p}",
        "scraped_at": f"2026-11-{1 + batch % 28:02d}T10:00:00Z",
        "crawl_id": f"crawl-{batch}",
        "proxy_ip": f"10.{batch % 256}.{p % 256}.{p % 250 + 1}",
        "response_ms": 40 + (p * 7 + batch) % 900,
        "etag": f"e{p}-{batch}",
    }


def mirror(p: int, version: int, batch: int, k: int) -> dict:
    """Mirror copy `k` of product `p`: another host, two description words replaced (a near duplicate)."""
    words = product(p, version, batch)["description"].split()
    for position, word in zip(_numbers(b"m%d" % k, 2), _words(b"w%d" % k, 2)):
        words[position % len(words)] = word
    return product(p, version, batch, url=f"https://mirror{k % 7}.example.net/item/{k}", description=" ".join(words))


@dataclass
class Truth:
    """What one batch must produce."""

    batch: str
    lines: int = 0
    broken: int = 0
    decisions: Counter = field(default_factory=Counter)
    mirrored_products: set = field(default_factory=set)


@dataclass
class Crawl:
    """The generator's state: the current price version of every product seen, and mirror copies made."""

    per_batch: int
    versions: array = field(default_factory=lambda: array("I"))
    mirrors_of: dict = field(default_factory=dict)  # product -> mirror copies made
    next_mirror: int = 0
    broken_total: int = 0
    lines_total: int = 0

    def batch(self, b: int, folder: Path) -> tuple[Path, Truth]:
        """Write batch `b` (plain JSON Lines) and return its ground truth."""
        import random

        rng = random.Random(b)
        key = f"soak-{b:04d}"
        truth = Truth(key)
        seen = len(self.versions)
        if seen:
            plan = {"new": 0.50, "recrawl": 0.25, "changed": 0.10, "mirror": 0.10, "variant": 0.05}
        else:
            plan = {"new": 0.85, "recrawl": 0.0, "changed": 0.0, "mirror": 0.10, "variant": 0.05}
        count = {name: int(self.per_batch * share) for name, share in plan.items()}
        count["new"] += self.per_batch - sum(count.values())
        earlier = rng.sample(range(seen), count["recrawl"] + count["changed"]) if seen else []
        first_new = seen
        self.versions.extend([0] * count["new"])
        lines: list[dict] = []
        for p in earlier[: count["recrawl"]]:
            lines.append(product(p, self.versions[p], b))
            truth.decisions["exact_duplicate"] += 1
        for p in earlier[count["recrawl"] :]:
            self.versions[p] += 1
            lines.append(product(p, self.versions[p], b))
            truth.decisions["changed"] += 1
        new_ids = range(first_new, first_new + count["new"])
        for p in new_ids:
            lines.append(product(p, 0, b))
            truth.decisions["new"] += 1
        rng.shuffle(lines)
        # Variants and mirrors of this batch's new products come after their originals (at the end).
        for p in rng.sample(new_ids, count["variant"]):
            variant = product(p, 0, b)
            variant["url"] += "?utm_source=newsletter&utm_medium=email"
            lines.append(variant)
            truth.decisions["exact_duplicate"] += 1
        for p in rng.sample(range(first_new + count["new"]), count["mirror"]):
            lines.append(mirror(p, self.versions[p], b, self.next_mirror))
            self.mirrors_of[p] = self.mirrors_of.get(p, 0) + 1
            truth.mirrored_products.add(p)
            self.next_mirror += 1
            truth.decisions["new"] += 1
        path = folder / f"{key}.jsonl"
        with open(path, "w", encoding="utf-8") as handle:
            for i, line in enumerate(lines):
                handle.write(json.dumps(line, ensure_ascii=False) + "\n")
                if i % 20_000 == 7:
                    handle.write('{"url": "https://shop.example.com/broken", "title": "cut off\n')
                    truth.broken += 1
        truth.lines = len(lines) + truth.broken
        self.broken_total += truth.broken
        self.lines_total += truth.lines
        landed = T0 + b * DAY
        os.utime(path, (landed, landed))
        return path, truth

    def expected_totals(self) -> dict:
        mirrors = sum(self.mirrors_of.values())
        return {
            "records": len(self.versions) + mirrors,
            "history": sum(self.versions),
            "clustered": len(self.mirrors_of) + mirrors,
            "clusters": len(self.mirrors_of),
        }


# ------------------------------------------------------------------ one batch, in its own process


def _reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")
        return True
    except OSError:
        return False


def _peak_mib() -> float:
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def child(args: argparse.Namespace) -> None:
    """Run the four rungs over one batch; print one JSON object with seconds, peaks and figures per rung."""
    from dedup_pipeline.ladder.canonical import canonicalise_batch
    from dedup_pipeline.ladder.exact import deduplicate_batch
    from dedup_pipeline.ladder.near import cluster_batch
    from dedup_pipeline.ladder.raw import ingest_raw_batch
    from dedup_pipeline.ladder.settings import LadderSettings, NearSettings
    from dedup_pipeline.landing import find_batch
    from dedup_pipeline.store.seen_set import RedisSeenSet
    from dedup_pipeline.store.warehouse import Warehouse

    warehouse = Warehouse(args.url)
    settings = LadderSettings(chunk_size=args.chunk)
    seen = RedisSeenSet(args.redis, ttl_seconds=6 * 3600, prefix="soak")
    out: dict = {"seconds": {}, "peak_mib": {}, "records_in": {}}
    steps = {
        "raw": lambda: ingest_raw_batch(warehouse, find_batch(Path(args.landing), args.key)),
        "canonical": lambda: canonicalise_batch(warehouse, args.key, settings),
        "exact": lambda: deduplicate_batch(warehouse, args.key, "soak", settings, seen),
        "near": lambda: cluster_batch(warehouse, args.key, NearSettings(chunk_size=args.chunk)),
    }
    resettable = True
    for rung in RUNGS:
        resettable = _reset_peak() and resettable
        started = time.perf_counter()
        report = steps[rung]()
        out["seconds"][rung] = time.perf_counter() - started
        out["peak_mib"][rung] = _peak_mib()
        if rung == "raw":
            out["records_in"][rung], out["quarantined"] = report.lines, report.quarantined
        elif rung == "canonical":
            out["records_in"][rung] = report.records_in
            out["quarantined"] += report.quarantined
        elif rung == "exact":
            out["records_in"][rung] = report.records_in
            out["decisions"] = dict(report.decisions)
            out["seen_set"] = {
                "hits": report.seen_set_hits,
                "fallbacks": report.seen_set_fallbacks,
                "cold_misses": report.seen_set_cold_misses,
            }
        else:
            out["records_in"][rung] = report.sketched
            out["near_duplicates"] = len(report.near_duplicates)
    out["peak_resettable"] = resettable
    warehouse.dispose()
    print(json.dumps(out))


# ------------------------------------------------------------------ the run


def warehouse_figures(url: str) -> dict:
    from sqlalchemy import create_engine, func, select

    from dedup_pipeline.store.schema import (
        dedup_decisions,
        near_duplicate_clusters,
        quarantine,
        record_history,
        records,
    )

    engine = create_engine(url)
    with engine.connect() as conn:
        figures = {
            "records": conn.execute(select(func.count()).select_from(records)).scalar_one(),
            "distinct_keys": conn.execute(select(func.count(func.distinct(records.c.natural_key)))).scalar_one(),
            "distinct_contents": conn.execute(select(func.count(func.distinct(records.c.content_hash)))).scalar_one(),
            "history": conn.execute(select(func.count()).select_from(record_history)).scalar_one(),
            "quarantine": conn.execute(select(func.count()).select_from(quarantine)).scalar_one(),
            "decisions": conn.execute(select(func.count()).select_from(dedup_decisions)).scalar_one(),
            "clustered": conn.execute(select(func.count()).select_from(near_duplicate_clusters)).scalar_one(),
            "clusters": conn.execute(
                select(func.count(func.distinct(near_duplicate_clusters.c.cluster_id)))
            ).scalar_one(),
        }
        # Clusters that hold two different products (same sku = one product and its mirror copies).
        sku = records.c.payload["sku"].as_string()
        per_cluster = (
            select(near_duplicate_clusters.c.cluster_id, func.count(func.distinct(sku)).label("skus"))
            .join(records, records.c.record_id == near_duplicate_clusters.c.record_id)
            .group_by(near_duplicate_clusters.c.cluster_id)
            .subquery()
        )
        figures["mixed_clusters"] = conn.execute(
            select(func.count()).select_from(per_cluster).where(per_cluster.c.skus > 1)
        ).scalar_one()
    engine.dispose()
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--records", type=at_least_one, default=2_000_000, help="records in all batches together (default 2,000,000)"
    )
    parser.add_argument("--batches", type=at_least_one, default=20)
    parser.add_argument(
        "--chunk", type=at_least_one, default=2000, help="records per transaction (the ladder's chunk_size)"
    )
    parser.add_argument("--keep", action="store_true", help="keep the scratch database (its URL is printed)")
    parser.add_argument("--child", nargs=4, metavar=("URL", "REDIS", "LANDING", "KEY"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        args.url, args.redis, args.landing, args.key = args.child
        child(args)
        return 0

    from benchmarks.common import private_redis, scratch_database
    from dedup_pipeline.store.warehouse import Warehouse

    per_batch = args.records // args.batches
    crawl = Crawl(per_batch)
    rows, failures = [], []
    print(
        f"soak: {per_batch * args.batches:,} records in {args.batches} batches of {per_batch:,}, chunk {args.chunk}, "
        f"PostgreSQL + Redis seen-set, each batch in a fresh process",
        flush=True,
    )
    header = (
        f"{'batch':>9} {'lines':>8} {'raw r/s':>9} {'canon r/s':>9} {'exact r/s':>9} {'near r/s':>9} "
        f"{'total s':>8} {'peak MiB':>8} {'redis hits':>10}  decisions (new/dup/changed) vs truth"
    )
    started = time.perf_counter()
    with (
        scratch_database() as url,
        private_redis() as redis_url,
        tempfile.TemporaryDirectory(prefix="soak-") as landing,
    ):
        Warehouse(url).create_schema().dispose()
        print(header, flush=True)
        for b in range(args.batches):
            path, truth = crawl.batch(b, Path(landing))
            done = subprocess.run(
                [sys.executable, __file__, "--child", url, redis_url, landing, truth.batch, "--chunk", str(args.chunk)],
                capture_output=True,
                text=True,
            )
            path.unlink()
            if done.returncode != 0:
                print(done.stderr[-4000:], file=sys.stderr)
                return 1
            result = json.loads(done.stdout.strip().splitlines()[-1])
            decisions = Counter(result["decisions"])
            ok = decisions == truth.decisions and result["quarantined"] == truth.broken
            if not ok:
                failures.append(
                    f"{truth.batch}: decisions {dict(decisions)} quarantined {result['quarantined']}, "
                    f"truth {dict(truth.decisions)} quarantined {truth.broken}"
                )
            rates = {r: result["records_in"][r] / result["seconds"][r] for r in RUNGS}
            peak = max(result["peak_mib"].values())
            rows.append(
                {
                    "batch": truth.batch,
                    "rates": rates,
                    "seconds": result["seconds"],
                    "peak": result["peak_mib"],
                    "total": sum(result["seconds"].values()),
                    "lines": truth.lines,
                    "resettable": result["peak_resettable"],
                }
            )
            print(
                f"{truth.batch:>9} {truth.lines:>8,} {rates['raw']:>9,.0f} {rates['canonical']:>9,.0f} "
                f"{rates['exact']:>9,.0f} {rates['near']:>9,.0f} {rows[-1]['total']:>8.1f} {peak:>8.0f} "
                f"{result['seen_set']['hits']:>10,}  "
                f"{decisions['new']}/{decisions['exact_duplicate']}/{decisions['changed']} "
                f"{'= truth' if ok else 'MISMATCH'}",
                flush=True,
            )
        figures = warehouse_figures(url)
        if args.keep:
            print(f"(kept database: {url})")
    elapsed = time.perf_counter() - started

    expected = crawl.expected_totals()
    total_lines = crawl.lines_total
    print(
        f"\nwhole run: {total_lines:,} lines in {elapsed / 60:.1f} min wall "
        f"({total_lines / elapsed:,.0f} lines/s end to end, generation included)"
    )
    window = max(1, min(3, len(rows) // 3))
    first, last = rows[:window], rows[-window:]
    print(f"\nfirst {window} batches against the last {window} (medians; ratio = last / first):")
    print(f"{'':>14} {'first':>10} {'last':>10} {'ratio':>7}")
    for rung in RUNGS:
        a, z = median(r["rates"][rung] for r in first), median(r["rates"][rung] for r in last)
        print(f"{rung + ' r/s':>14} {a:>10,.0f} {z:>10,.0f} {z / a:>7.2f}")
    peak_first = median(max(r["peak"].values()) for r in first)
    peak_last = median(max(r["peak"].values()) for r in last)
    print(f"{'peak RSS MiB':>14} {peak_first:>10.0f} {peak_last:>10.0f} {peak_last / peak_first:>7.2f}")
    for rung in RUNGS:
        a, z = median(r["peak"][rung] for r in first), median(r["peak"][rung] for r in last)
        print(f"{'  ' + rung + ' MiB':>14} {a:>10.0f} {z:>10.0f} {z / a:>7.2f}")
    resettable = all(r["resettable"] for r in rows)
    how = "VmHWM reset before each rung" if resettable else "VmHWM could not be reset: cumulative within a batch"
    print(f"(peak RSS per rung: {how})")
    flat = peak_last / peak_first <= 1.25
    print(f"memory flat (last/first peak <= 1.25): {'yes' if flat else 'NO'}")

    print("\nwarehouse against the ground truth:")
    checks = [
        ("current rows (one per key)", figures["records"], expected["records"]),
        ("distinct natural keys", figures["distinct_keys"], expected["records"]),
        ("distinct contents", figures["distinct_contents"], expected["records"]),
        ("history rows (price changes)", figures["history"], expected["history"]),
        ("quarantined lines", figures["quarantine"], crawl.broken_total),
        ("decisions logged (one per canonical line)", figures["decisions"], crawl.lines_total - crawl.broken_total),
    ]
    exact_ok = True
    for name, got, want in checks:
        exact_ok &= got == want
        print(f"  {name:<44} {got:>12,} {want:>12,}  {'ok' if got == want else 'MISMATCH'}")
    recall = figures["clustered"] / expected["clustered"] if expected["clustered"] else 1.0
    print(
        f"  {'records in near-duplicate clusters':<44} {figures['clustered']:>12,} {expected['clustered']:>12,}  "
        f"recall {recall:.4f}"
    )
    print(f"  {'clusters':<44} {figures['clusters']:>12,} {expected['clusters']:>12,}")
    print(f"  {'clusters mixing two products':<44} {figures['mixed_clusters']:>12,} {0:>12,}")
    for failure in failures:
        print("MISMATCH", failure)
    ok = exact_ok and not failures and flat
    print(
        f"\nsoak {'PASSED' if ok else 'FAILED'}: decisions per batch and warehouse counts "
        f"{'match' if exact_ok and not failures else 'do NOT match'} the ground truth; "
        f"memory {'flat' if flat else 'NOT flat'}"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
