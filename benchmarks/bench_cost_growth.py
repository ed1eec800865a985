"""Cost growth: the same batch against warehouses of growing size, one worker against two, per-row footprint.

    python benchmarks/bench_cost_growth.py [--batch 100000] [--sizes 100000,1000000] [--repeat 3]
                                           [--speedup-batch 50000] [--speedup-repeat 2] [--skip-speedup]

1. Cost growth. One base warehouse (PostgreSQL) is grown step by step to each
   size: first a seed crawl through the real ladder (raw -> canonical -> exact
   -> near), then filler records canonicalised, hashed and MinHash-sketched by
   the project's own code and COPYed into records, record_hashes and
   near_index (a Zipf vocabulary, so LSH band keys collide as real text does). At each size, every repeat copies
   the base
   (CREATE DATABASE ... TEMPLATE) and times the same batch through raw,
   canonical, exact (no seen-set: every digest is looked up in the warehouse)
   and near-duplicate rungs: 30% exact re-crawls, 10% changed prices, 5% near
   duplicates of stored records under new URLs, 55% new. Medians per rung and
   the ratio to the smallest warehouse are printed (target: total within 1.2x).
2. One worker against two. Two such batches (disjoint new records) on a copy of
   the smallest warehouse: one process running both, one after the other,
   against two processes running one each at the same time (started on a
   shared clock, after their imports). Prints medians and the speedup.
3. Footprint for capacity planning: bytes per row of every table and index
   (pg_total_relation_size and pg_relation_size over the largest warehouse),
   Redis memory per seen-set key (SET NX EX, the project's key format: MEMORY
   USAGE and used_memory delta), and a Bloom filter's bits per element at 0.1%.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402
from sqlalchemy import create_engine, func, select, text  # noqa: E402

from benchmarks.common import PG_ADMIN_URL, REDIS_URL, at_least_one, median, scratch_database, write_jsonl  # noqa: E402
from dedup_pipeline.core.hashing import INITIAL_ACTIVE_VERSION  # noqa: E402
from dedup_pipeline.core.records import canonicalise_records  # noqa: E402
from dedup_pipeline.defs.resources import LadderResource, NearDupResource  # noqa: E402
from dedup_pipeline.ladder.canonical import canonicalise_batch  # noqa: E402
from dedup_pipeline.ladder.exact import deduplicate_batch  # noqa: E402
from dedup_pipeline.ladder.near import cluster_batch, near_text, sketch  # noqa: E402
from dedup_pipeline.ladder.raw import ingest_raw_batch  # noqa: E402
from dedup_pipeline.landing import find_batch  # noqa: E402
from dedup_pipeline.store import near as near_index  # noqa: E402
from dedup_pipeline.store.bulk import copy_rows  # noqa: E402
from dedup_pipeline.store.schema import RECORD_COLUMNS, record_hashes, records  # noqa: E402
from dedup_pipeline.store.warehouse import Warehouse  # noqa: E402

SETTINGS = LadderResource().settings()  # the code location's defaults
NEAR = NearDupResource()
PARAMS = NEAR.params()
VERSIONS = SETTINGS.hash_versions
ACTIVE = INITIAL_ACTIVE_VERSION
T0 = 1_790_000_000.0  # seed crawl landing time; batches land a day later
RUNGS = ("raw", "canonical", "exact", "near")
FILLER_CHUNK = 20_000


# -- synthetic crawl ---------------------------------------------------------------------------------


class Texts:
    """Product text from a Zipf-distributed vocabulary of pseudo-words (common words shared, as in real text)."""

    def __init__(self, seed: int, vocabulary: int = 30_000):
        rng = np.random.default_rng(12345)  # the vocabulary is the same in every process
        syllables = np.array([a + b for a in "bcdfgklmnprstvz" for b in "aeiou"])
        parts = rng.integers(0, syllables.size, size=(vocabulary, 3))
        self.words = np.array(["".join(syllables[p]) for p in parts])
        weights = 1.0 / np.arange(1, vocabulary + 1) ** 1.05
        self.cdf = np.cumsum(weights / weights.sum())
        self.rng = np.random.default_rng(seed)

    def words_of(self, n: int) -> list[str]:
        picks = np.minimum(np.searchsorted(self.cdf, self.rng.random(n)), self.words.size - 1)
        return self.words[picks].tolist()

    def text(self, low: int, high: int) -> str:
        return " ".join(self.words_of(int(self.rng.integers(low, high))))


def listing(n: int, texts: Texts, host: str = "shop") -> dict:
    rng = texts.rng
    return {
        "url": f"https://{host}{n % 50}.example.com/p/{n}",
        "title": texts.text(4, 9),
        "description": texts.text(30, 61),
        "price": f"{int(rng.integers(1, 500))}.{int(rng.integers(0, 100)):02d}",
        "currency": "EUR",
        "seller_id": f"seller-{n % 997}",
        "sku": f"SKU-{n}",
        "scraped_at": "2026-11-01T10:00:00Z",
        "crawl_id": "seed",
        "proxy_ip": "10.0.0.1",
        "response_ms": int(rng.integers(40, 900)),
        "etag": f"e{n}",
    }


def edited(text: str, texts: Texts, share: float = 0.05) -> str:
    """The same text with about `share` of its words replaced: a near duplicate."""
    words = text.split()
    for i in texts.rng.choice(len(words), size=max(1, int(len(words) * share)), replace=False):
        words[i] = texts.words_of(1)[0]
    return " ".join(words)


@dataclass(frozen=True)
class Plan:
    batch: int

    @property
    def exact(self) -> int:
        return int(self.batch * 0.30)

    @property
    def changed(self) -> int:
        return int(self.batch * 0.10)

    @property
    def near(self) -> int:
        return int(self.batch * 0.05)

    @property
    def new(self) -> int:
        return self.batch - self.exact - self.changed - self.near

    def seed_size(self, batches: int) -> int:
        """Seed records: the exact-duplicate targets plus distinct changed targets for each batch."""
        return self.exact + self.changed * batches


def seed_records(count: int) -> list[dict]:
    texts = Texts(seed=1)
    return [listing(n, texts) for n in range(count)]


def batch_records(plan: Plan, seeds: list[dict], which: int) -> list[dict]:
    """Batch `which` (0, 1, ...): same composition, its own changed targets and new records."""
    texts = Texts(seed=100 + which)
    again = {"scraped_at": "2026-11-02T10:00:00Z", "crawl_id": f"batch-{which}", "proxy_ip": "10.0.0.9"}
    out = [{**seeds[i], **again} for i in range(plan.exact)]
    start = plan.exact + which * plan.changed
    for i in range(start, start + plan.changed):
        out.append({**seeds[i], **again, "price": f"{int(texts.rng.integers(500, 900))}.00"})
    base = 10_000_000 * (which + 1)
    for i in range(plan.near):
        original = seeds[i]
        copy = listing(base + i, texts, host="mirror")
        copy.update(title=original["title"], description=edited(original["description"], texts))
        out.append(copy)
    out += [listing(base + plan.near + i, texts, host="shop") for i in range(plan.new)]
    texts.rng.shuffle(out)
    return out


def write_batch(folder: Path, key: str, rows: list[dict], landed: float) -> None:
    path = write_jsonl(rows, folder / f"{key}.jsonl")
    os.utime(path, (landed, landed))


# -- building warehouses -----------------------------------------------------------------------------


def run_ladder(url: str, landing: Path, key: str) -> dict[str, float]:
    """The four rungs over one registered batch file; seconds per rung."""
    warehouse = Warehouse(url).create_schema()
    seconds = {}
    start = time.perf_counter()
    ingest_raw_batch(warehouse, find_batch(landing, key))
    seconds["raw"] = time.perf_counter() - start
    start = time.perf_counter()
    canonicalise_batch(warehouse, key, SETTINGS)
    seconds["canonical"] = time.perf_counter() - start
    start = time.perf_counter()
    report = deduplicate_batch(warehouse, key, f"bench-{uuid.uuid4().hex[:8]}", SETTINGS)
    seconds["exact"] = time.perf_counter() - start
    start = time.perf_counter()
    near = cluster_batch(warehouse, key, NEAR.settings())
    seconds["near"] = time.perf_counter() - start
    seconds["total"] = sum(seconds[r] for r in RUNGS)
    seconds["decisions"] = dict(report.decisions)
    seconds["candidate_pairs"] = near.candidate_pairs
    warehouse.dispose()
    return seconds


_BULK_TABLES = ("records", "record_hashes", "near_index")


def _drop_indexes(conn) -> list[str]:
    """Drop the four tables' foreign keys, unique keys and secondary indexes (not records' primary key).

    Returns the statements that recreate them, in a valid order. Bulk loading
    into bare tables and indexing once is what makes millions of rows cheap.
    """
    tables = ", ".join(f"'{t}'::regclass" for t in _BULK_TABLES)
    constraints = conn.execute(
        text(f"""
        SELECT conrelid::regclass::text, conname, contype, pg_get_constraintdef(oid)
        FROM pg_constraint WHERE conrelid IN ({tables}) AND contype IN ('p', 'u', 'f')
          AND NOT (conrelid = 'records'::regclass AND contype = 'p')
        ORDER BY CASE contype WHEN 'f' THEN 0 ELSE 1 END""")
    ).all()
    indexes = conn.execute(
        text(f"""
        SELECT indexname, indexdef FROM pg_indexes i
        WHERE tablename IN {tuple(_BULK_TABLES)} AND NOT EXISTS (
            SELECT 1 FROM pg_constraint c WHERE c.conname = i.indexname)""")
    ).all()
    for table, name, _kind, _ in constraints:
        conn.execute(text(f'ALTER TABLE {table} DROP CONSTRAINT "{name}"'))
    for name, _ in indexes:
        conn.execute(text(f'DROP INDEX "{name}"'))
    recreate = [definition for _, definition in indexes]
    recreate += [f'ALTER TABLE {t} ADD CONSTRAINT "{n}" {d}' for t, n, kind, d in reversed(constraints) if kind != "f"]
    recreate += [f'ALTER TABLE {t} ADD CONSTRAINT "{n}" {d}' for t, n, kind, d in constraints if kind == "f"]
    return recreate


def add_filler(url: str, count: int, first_number: int) -> float:
    """`count` filler records, canonicalised, hashed and sketched by the project's code, COPYed into bare tables."""
    warehouse = Warehouse(url)
    texts = Texts(seed=first_number)
    landed = time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime(T0 - 365 * 86400))
    start = time.perf_counter()
    with warehouse.engine.begin() as conn:
        next_id = conn.execute(select(func.coalesce(func.max(records.c.record_id), 0))).scalar_one() + 1
        recreate = _drop_indexes(conn)
    done = 0
    while done < count:
        n = min(FILLER_CHUNK, count - done)
        raw = [listing(first_number + done + i, texts, host="old") for i in range(n)]
        canon = canonicalise_records(raw, list(range(1, n + 1)), VERSIONS, ACTIVE)
        ids = list(range(next_id, next_id + n))
        sketches = sketch([near_text(c.payload) for c in canon], PARAMS)
        batch_id = f"filler-{first_number + done}"
        with warehouse.engine.begin() as conn:
            copy_rows(
                conn,
                records,
                RECORD_COLUMNS,
                (
                    (
                        rid,
                        c.natural_key,
                        c.canonical_url,
                        "url/1",
                        ACTIVE,
                        bytes.fromhex(c.hashes[ACTIVE]),
                        c.payload,
                        landed,
                        landed,
                        batch_id,
                        batch_id,
                        landed,
                        line,
                    )
                    for line, (rid, c) in enumerate(zip(ids, canon), start=1)
                ),
            )
            copy_rows(
                conn,
                record_hashes,
                ("record_id", "hash_version", "content_hash", "error"),
                (
                    (rid, version, bytes.fromhex(digest), None)
                    for rid, c in zip(ids, canon)
                    for version, digest in c.hashes.items()
                ),
            )
            order = near_index.order_of(datetime.fromisoformat(landed), datetime.fromisoformat(landed), "filler")
            rows = near_index.IndexRows(
                np.array(ids, dtype=np.int64),
                sketches.signatures,
                np.array([order] * n, dtype=np.int64),
                sketches.keys,
                sketches.indexable,
            )
            near_index.write_rows(conn, rows, [bytes.fromhex(c.hashes[ACTIVE]) for c in canon], pending=False)
        next_id += n
        done += n
    with warehouse.engine.begin() as conn:
        conn.execute(text("SET LOCAL maintenance_work_mem = '1GB'"))
        for statement in recreate:
            conn.execute(text(statement))
        conn.execute(
            text("SELECT setval(pg_get_serial_sequence('records', 'record_id'), (SELECT max(record_id) FROM records))")
        )
    warehouse.dispose()
    vacuum_analyze(url)
    return time.perf_counter() - start


def vacuum_analyze(url: str) -> None:
    engine = create_engine(url, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.execute(text("VACUUM ANALYZE"))
    engine.dispose()


def database_name(url: str) -> str:
    return url.rsplit("/", 1)[1]


class Copies:
    """Databases copied from a template (file copy), dropped afterwards."""

    def __init__(self):
        self.admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT", pool_pre_ping=True)

    def copy(self, template_url: str) -> str:
        name = f"dedup_bench_copy_{uuid.uuid4().hex[:10]}"
        with self.admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}" TEMPLATE "{database_name(template_url)}" STRATEGY FILE_COPY'))
        return PG_ADMIN_URL.rsplit("/", 1)[0] + f"/{name}"

    def drop(self, url: str) -> None:
        with self.admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{database_name(url)}" WITH (FORCE)'))


def timed_copy(copies: Copies, base: str, landing: Path, attempts: int = 3) -> dict:
    """The batch on a fresh copy of `base`; a repeat whose connections were killed from outside is run again."""
    from sqlalchemy.exc import OperationalError

    for attempt in range(1, attempts + 1):
        url = copies.copy(base)
        try:
            return run_ladder(url, landing, "batch-0")
        except OperationalError as exc:
            if attempt == attempts:
                raise
            print(f"  (repeat lost its database connection, run again: {str(exc).splitlines()[0][:100]})", flush=True)
        finally:
            copies.drop(url)
    raise AssertionError("unreachable")


def count_records(url: str) -> int:
    engine = create_engine(url)
    with engine.connect() as conn:
        n = conn.execute(select(func.count()).select_from(records)).scalar_one()
    engine.dispose()
    return n


# -- one worker against two --------------------------------------------------------------------------


def worker_main(args) -> None:
    """A worker process: wait for the shared start time, run its batches one after the other, print JSON."""
    landing = Path(args.landing)
    while time.time() < args.start_at:
        time.sleep(0.005)
    start = time.time()
    per_batch = [run_ladder(args.url, landing, key)["total"] for key in args.batches.split(",")]
    print(json.dumps({"start": start, "end": time.time(), "per_batch": per_batch}))


def run_workers(url: str, landing: Path, groups: list[list[str]]) -> float:
    """Wall-clock seconds from the common start to the last worker's end."""
    start_at = time.time() + 15  # after every worker has imported the project
    processes = [
        subprocess.Popen(
            [
                sys.executable,
                __file__,
                "--worker",
                "--url",
                url,
                "--landing",
                str(landing),
                "--batches",
                ",".join(group),
                "--start-at",
                str(start_at),
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        for group in groups
    ]
    results = []
    for process in processes:
        out, _ = process.communicate()
        if process.returncode:
            raise RuntimeError(f"worker failed ({process.returncode})")
        results.append(json.loads(out.strip().splitlines()[-1]))
    return max(r["end"] for r in results) - min(r["start"] for r in results)


# -- footprint -----------------------------------------------------------------------------------------


def table_footprint(url: str) -> list[tuple[str, int, float, float]]:
    """(table, rows, bytes per row for the heap+TOAST, bytes per row of each index summed)."""
    engine = create_engine(url)
    out = []
    with engine.connect() as conn:
        for table in (
            "records",
            "record_hashes",
            "near_index",
            "near_duplicate_links",
            "canonical_records",
            "dedup_decisions",
            "record_history",
        ):
            rows = conn.execute(text(f"SELECT count(*) FROM {table}")).scalar_one()
            total = conn.execute(text(f"SELECT pg_total_relation_size('{table}')")).scalar_one()
            indexes = conn.execute(text(f"SELECT pg_indexes_size('{table}')")).scalar_one()
            if rows:
                out.append((table, rows, (total - indexes) / rows, indexes / rows))
    engine.dispose()
    return out


def redis_footprint(keys: int = 50_000) -> tuple[int, float]:
    """(MEMORY USAGE of one seen-set key, used_memory delta per key) for SET NX EX keys of the project's format."""
    import hashlib

    import redis

    from dedup_pipeline.store.seen_set import RedisSeenSet

    prefix = f"dedup-bench:{uuid.uuid4().hex[:8]}"
    client = redis.Redis.from_url(REDIS_URL)
    seen = RedisSeenSet(REDIS_URL, ttl_seconds=3600, prefix=prefix)
    digests = [hashlib.sha256(str(i).encode()).digest() for i in range(keys)]
    before = client.info("memory")["used_memory"]
    for start in range(0, keys, 5000):
        seen.remember(ACTIVE, digests[start : start + 5000])
    after = client.info("memory")["used_memory"]
    one = client.memory_usage(seen.key(ACTIVE, digests[0]))
    names = [seen.key(ACTIVE, d) for d in digests]
    for start in range(0, keys, 5000):
        client.delete(*names[start : start + 5000])
    return one, (after - before) / keys


def bloom_bits_per_element(capacity: int = 10_000_000, error_rate: float = 0.001) -> float:
    from rbloom import Bloom

    return Bloom(capacity, error_rate).size_in_bits / capacity


# -- main ----------------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=at_least_one, default=100_000)
    parser.add_argument("--sizes", default="100000,1000000")
    parser.add_argument("--repeat", type=at_least_one, default=3)
    parser.add_argument("--speedup-batch", type=at_least_one, default=50_000)
    parser.add_argument("--speedup-repeat", type=at_least_one, default=2)
    parser.add_argument("--skip-speedup", action="store_true")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--landing", help=argparse.SUPPRESS)
    parser.add_argument("--batches", help=argparse.SUPPRESS)
    parser.add_argument("--start-at", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker_main(args)

    sizes = sorted(int(s) for s in args.sizes.split(","))
    plan = Plan(args.batch)
    speed = Plan(args.speedup_batch)
    seeds_needed = max(plan.seed_size(1), speed.seed_size(2))
    print(
        f"batch {plan.batch:,} records: {plan.exact:,} exact re-crawls, {plan.changed:,} changed, "
        f"{plan.near:,} near duplicates under new URLs, {plan.new:,} new; no seen-set (every lookup in the warehouse)"
    )
    copies = Copies()
    with tempfile.TemporaryDirectory() as folder, scratch_database() as base:
        landing = Path(folder)
        seeds = seed_records(seeds_needed)
        write_batch(landing, "seed", seeds, T0)
        write_batch(landing, "batch-0", batch_records(plan, seeds, 0), T0 + 86400)
        if not args.skip_speedup:
            for which in (1, 2):  # speedup batches: their own changed targets
                rows = batch_records(speed, seeds, which - 1)
                write_batch(landing, f"pair-{which}", rows, T0 + 86400 + which)
        start = time.perf_counter()
        run_ladder(base, landing, "seed")
        print(f"seed crawl of {len(seeds):,} records through the ladder: {time.perf_counter() - start:.1f} s")

        results: dict[int, list[dict]] = {}
        stored = count_records(base)
        for size in sizes:
            if size > stored:
                seconds = add_filler(base, size - stored, first_number=100_000_000 + stored)
                print(
                    f"warehouse grown to {size:,} records (COPY, sketches included): {seconds:.1f} s "
                    f"({(size - stored) / seconds:,.0f} records/s)"
                )
                stored = size
            results[size] = []
            for repeat in range(args.repeat):
                results[size].append(timed_copy(copies, base, landing))
                r = results[size][-1]
                print(
                    f"  {size:>11,} rows, repeat {repeat + 1}: total {r['total']:.2f} s "
                    + " ".join(f"{k} {r[k]:.2f}" for k in RUNGS)
                    + f"; candidate pairs {r['candidate_pairs']:,}"
                )
            if size == sizes[0] and not args.skip_speedup:
                print_speedup(copies, base, landing, args.speedup_repeat, speed)
        decisions = results[sizes[0]][0]["decisions"]
        print(f"\ndecisions per batch: {decisions}")
        print_growth(results, sizes)
        print_footprint(base)


def print_speedup(copies: Copies, base: str, landing: Path, repeat: int, speed: Plan) -> None:
    serial, parallel = [], []
    for _ in range(repeat):
        for mode, groups, out in (
            ("serial", [["pair-1", "pair-2"]], serial),
            ("parallel", [["pair-1"], ["pair-2"]], parallel),
        ):
            url = copies.copy(base)
            try:
                out.append(run_workers(url, landing, groups))
            finally:
                copies.drop(url)
            print(f"  two {speed.batch:,}-record batches, {mode}: {out[-1]:.2f} s")
    s, p = median(serial), median(parallel)
    print(
        f"\none worker vs two ({os.cpu_count()} cores): serial {s:.2f} s, two processes {p:.2f} s, "
        f"speedup {s / p:.2f}x\n"
    )


def print_growth(results: dict[int, list[dict]], sizes: list[int]) -> None:
    print("\nmedian seconds per batch")
    print(
        f"{'warehouse rows':>15} "
        + " ".join(f"{r:>9}" for r in (*RUNGS, "total"))
        + f" {'vs ' + format(sizes[0], ','):>12}"
    )
    base_total = median([r["total"] for r in results[sizes[0]]])
    for size in sizes:
        med = {k: median([r[k] for r in results[size]]) for k in (*RUNGS, "total")}
        print(
            f"{size:>15,} "
            + " ".join(f"{med[k]:>9.2f}" for k in (*RUNGS, "total"))
            + f" {med['total'] / base_total:>11.2f}x"
        )
    print("target: every ratio within 1.2x")


def print_footprint(url: str) -> None:
    print("\nfootprint per row (PostgreSQL, largest warehouse; heap includes TOAST)")
    print(f"{'table':>20} {'rows':>12} {'heap B/row':>11} {'index B/row':>12}")
    for table, rows, heap, index in table_footprint(url):
        print(f"{table:>20} {rows:>12,} {heap:>11.1f} {index:>12.1f}")
    one, delta = redis_footprint()
    print(f"redis seen-set key (SET NX EX, TTL): MEMORY USAGE {one} B, used_memory delta {delta:.1f} B/key")
    print(f"bloom filter at 0.1% false positives: {bloom_bits_per_element():.2f} bits/element")


if __name__ == "__main__":
    main()
