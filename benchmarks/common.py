"""Shared helpers of the benchmarks: a private PostgreSQL database, timing, synthetic crawls, real text, an in-memory
LSH index."""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import statistics
import tempfile
import time
import uuid
from collections.abc import Hashable, Iterable, Sequence
from contextlib import contextmanager
from pathlib import Path

import numpy as np
from sqlalchemy import create_engine, text

from dedup_pipeline import environment
from dedup_pipeline.core.lsh import band_keys
from dedup_pipeline.core.minhash import empty_mask
from dedup_pipeline_tests.helpers import PG_ADMIN_URL  # the server of the scratch databases: the tests' setting

#: The real third-party data (described in its SOURCES.md): $DEDUP_BENCH_DATA, else ../shared/data beside the
#: repository (a clone elsewhere names it).
DATA = Path(os.environ.get("DEDUP_BENCH_DATA") or Path(__file__).resolve().parent.parent.parent / "shared" / "data")
#: The Redis the benchmarks use ($DEDUP_REDIS_URL, else the local one); their keys have prefixes of their own
#: and are deleted afterwards.
REDIS_URL = environment.redis_url() or "redis://127.0.0.1:6379/0"
_WORDS = (
    "kettle steel whistle handle stove copper enamel lid spout base cord wooden matte glossy quiet fast boil "
    "litre compact travel family vintage modern classic induction gas electric warm cool red blue green grey"
).split()


def at_least_one(text: str) -> int:
    """An argparse type for a count of records, rounds or the like: a whole number, 1 or more (0 measures nothing
    and would only fail later, dividing by it)."""
    if not text.strip().isdecimal() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number, 1 or more, got {text!r}")
    return int(text)


@contextmanager
def scratch_database(admin_url: str = PG_ADMIN_URL):
    """A fresh PostgreSQL database for one benchmark, dropped afterwards."""
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    name = f"dedup_bench_{uuid.uuid4().hex[:10]}"
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield admin_url.rsplit("/", 1)[0] + f"/{name}"
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@contextmanager
def private_redis():
    """A redis-server of the run's own on a free port, no persistence (the tests' helper), killed at the end."""
    from dedup_pipeline_tests.reliability.redis_server import PrivateRedis

    with tempfile.TemporaryDirectory(prefix="bench-redis-") as folder:
        server = PrivateRedis(Path(folder)).start()
        try:
            yield server.url
        finally:
            server.kill()


def product(n: int, rng: random.Random, **overrides) -> dict:
    """A scraped product listing with volatile fetch metadata."""
    record = {
        "url": f"https://shop{n % 17}.example.com/p/{n}?utm_source=feed&ref=home",
        "title": f"{rng.choice(_WORDS).title()} {rng.choice(_WORDS)} kettle {n}",
        "description": " ".join(rng.choice(_WORDS) for _ in range(30)),
        "price": round(rng.uniform(3, 400), 2),
        "currency": "EUR",
        "seller_id": f"seller-{n % 97}",
        "sku": f"SKU-{n}",
        "scraped_at": f"2026-11-{1 + n % 28:02d}T10:00:00Z",
        "crawl_id": f"crawl-{n % 5}",
        "proxy_ip": f"10.0.{n % 256}.{n % 250 + 1}",
        "response_ms": rng.randint(40, 900),
        "etag": f"e{rng.getrandbits(32):08x}",
    }
    record.update(overrides)
    return record


def crawl_with_duplicates(n: int, duplicate_share: float = 0.5, seed: int = 1) -> list[dict]:
    """`n` records of which `duplicate_share` are exact re-crawls (other volatile fields) of earlier ones."""
    rng = random.Random(seed)
    unique = int(n * (1 - duplicate_share))
    records = [product(i, rng) for i in range(unique)]
    for _ in range(n - unique):
        original = records[rng.randrange(unique)]
        records.append(
            {
                **original,
                "scraped_at": "2026-11-29T08:00:00Z",
                "crawl_id": "recrawl",
                "proxy_ip": "10.9.9.9",
                "etag": "changed",
                "response_ms": 1,
            }
        )
    rng.shuffle(records)
    return records


def write_jsonl(records: list[dict], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def process_cpu(pid: int, reaped_children: bool = False) -> float:
    """utime + stime of `pid` from /proc, and with `reaped_children` those of its children that have exited and
    been waited for (by it: a fork server's workers count in the server's); 0 for a process that is gone."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
        ticks = int(fields[11]) + int(fields[12]) + (int(fields[13]) + int(fields[14]) if reaped_children else 0)
        return ticks / _CLOCK_TICKS
    except (OSError, IndexError):
        return 0.0


def descendants(pid: int) -> list[int]:
    """The live processes below `pid` (children, their children, ...), from /proc."""
    found, frontier = [], [pid]
    while frontier:
        parent = frontier.pop()
        try:
            children = Path(f"/proc/{parent}/task/{parent}/children").read_text().split()
        except OSError:
            children = []
        found += [int(c) for c in children]
        frontier += [int(c) for c in children]
    return found


def timed(function, *args, **kwargs) -> tuple[float, object]:
    start = time.perf_counter()
    result = function(*args, **kwargs)
    return time.perf_counter() - start, result


def median(values) -> float:
    return statistics.median(values)


def cpu_and_wall(fn) -> tuple[float, float]:
    """(CPU, wall) seconds of one call of ``fn()``, the garbage collector paused as timeit does."""
    gc.collect()
    gc.disable()
    try:
        start_cpu, start_wall = time.process_time(), time.perf_counter()
        fn()
        return time.process_time() - start_cpu, time.perf_counter() - start_wall
    finally:
        gc.enable()


def cpu_seconds(fn) -> float:
    """CPU time of the process over one call of ``fn()`` (`cpu_and_wall`)."""
    return cpu_and_wall(fn)[0]


def alternating_cpu(sides: dict, rounds: int, limits: dict[str, int] | None = None) -> dict[str, list[float]]:
    """CPU seconds of each side's call in every round, the sides taking turns within a round.

    ``limits`` caps the rounds of slow sides: they run in the first rounds only, between the others.
    """
    times: dict[str, list[float]] = {name: [] for name in sides}
    for round_ in range(rounds):
        for name, fn in sides.items():
            if round_ < (limits or {}).get(name, rounds):
                times[name].append(cpu_seconds(fn))
    return times


def article_paragraphs() -> list[str]:
    """The distinct non-empty paragraphs of the article benchmark's 181 real texts (about 4,000), sorted."""
    articles = json.loads((DATA / "html_article_benchmark" / "ground-truth.json").read_text(encoding="utf-8"))
    return sorted({p.strip() for article in articles.values() for p in article["articleBody"].split("\n") if p.strip()})


class LshIndex:
    """In-memory LSH index over band keys: insert, query and remove many (the benchmarks' and tests' reference).

    The pipeline itself keeps its index in the warehouse (`dedup_pipeline.store.near`).

    Stored like the warehouse table, column-wise: per band, a sorted array of
    keys and the slot (insertion number) of each, so inserting or querying a
    batch is a few numpy calls per band rather than a Python dict operation
    per key. New entries are merged into the sorted arrays at the next query;
    removal marks a slot dead, and dead slots are dropped once they outnumber
    live ones. Ids may be any hashable values. Empty-document signatures are
    refused on insert and match nothing on query.
    """

    def __init__(self, bands: int, rows: int) -> None:
        if bands < 1 or rows < 1:
            raise ValueError("bands and rows must be positive")
        self.bands = bands
        self.rows = rows
        self._ids: list[Hashable] = []  # slot -> id (dead slots included)
        self._slots: dict[Hashable, int] = {}  # id -> slot, live entries only
        self._alive = np.zeros(0, dtype=bool)
        self._sorted_keys = np.empty((bands, 0), dtype=np.int64)
        self._sorted_slots = np.empty((bands, 0), dtype=np.int64)
        self._pending: list[np.ndarray] = []  # key blocks of slots not yet merged

    def __len__(self) -> int:
        return len(self._slots)

    def __contains__(self, item: Hashable) -> bool:
        return item in self._slots

    def insert_many(self, ids: Sequence[Hashable], signatures: np.ndarray) -> None:
        """Index each ``ids[i]`` under the bands of ``signatures[i]``."""
        ids = list(ids)
        if len(ids) != len(signatures):
            raise ValueError("ids and signatures differ in length")
        if len(set(ids)) != len(ids) or any(i in self._slots for i in ids):
            raise ValueError("ids must be unique and not yet indexed")
        if not ids:
            return
        if empty_mask(signatures).any():
            raise ValueError("empty-document signatures cannot be indexed (see empty_mask)")
        keys = band_keys(signatures, self.bands, self.rows)
        first = len(self._ids)
        self._ids.extend(ids)
        self._slots.update(zip(ids, range(first, first + len(ids))))
        self._alive = np.concatenate((self._alive, np.ones(len(ids), dtype=bool)))
        self._pending.append(keys)

    def _merge_pending(self) -> None:
        if not self._pending:
            return
        new_keys = np.concatenate(self._pending).T
        new_slots = np.arange(len(self._ids) - new_keys.shape[1], len(self._ids))
        self._pending = []
        keys = np.concatenate((self._sorted_keys, new_keys), axis=1)
        slots = np.concatenate((self._sorted_slots, np.broadcast_to(new_slots, new_keys.shape)), axis=1)
        # Two sorted runs per band: the stable sort (timsort) merges them in linear time.
        order = np.argsort(keys, axis=1, kind="stable")
        self._sorted_keys = np.take_along_axis(keys, order, axis=1)
        self._sorted_slots = np.take_along_axis(slots, order, axis=1)

    def query_slots(self, signatures: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Unique ``(query position, slot)`` pairs of live matches, sorted."""
        self._merge_pending()
        signatures = np.asarray(signatures, dtype=np.uint32).reshape(-1, np.shape(signatures)[-1])
        queries = np.flatnonzero(~empty_mask(signatures)) if len(signatures) else np.empty(0, dtype=np.int64)
        keys = band_keys(signatures[queries], self.bands, self.rows)
        found_q, found_s = [np.empty(0, dtype=np.int64)], [np.empty(0, dtype=np.int64)]
        for band in range(self.bands):
            sorted_keys = self._sorted_keys[band]
            lo = np.searchsorted(sorted_keys, keys[:, band], side="left")
            count = np.searchsorted(sorted_keys, keys[:, band], side="right") - lo
            total = int(count.sum())
            if total:
                # Expand each query's run [lo, lo + count) of the sorted array.
                run_start = np.repeat(lo - (np.cumsum(count) - count), count)
                found_q.append(np.repeat(queries, count))
                found_s.append(self._sorted_slots[band][run_start + np.arange(total)])
        q, slot = np.concatenate(found_q), np.concatenate(found_s)
        live = self._alive[slot]
        width = max(len(self._ids), 1)
        code = np.unique(q[live] * width + slot[live])
        return code // width, code % width

    def query_many(self, signatures: np.ndarray) -> list[set[Hashable]]:
        """Candidate ids for each signature: ids sharing at least one band."""
        n = len(np.asarray(signatures).reshape(-1, np.shape(signatures)[-1]))
        q, slot = self.query_slots(signatures)
        ids = [self._ids[s] for s in slot.tolist()]
        bounds = np.searchsorted(q, np.arange(n + 1)).tolist()
        return [set(ids[bounds[i] : bounds[i + 1]]) for i in range(n)]

    def remove(self, item: Hashable) -> None:
        """Drop ``item``; ``KeyError`` if it is not indexed."""
        self._alive[self._slots.pop(item)] = False
        if len(self._ids) > 2 * len(self._slots) + 1024:
            self._compact()

    def remove_many(self, ids: Iterable[Hashable]) -> None:
        for item in ids:
            self.remove(item)

    def _compact(self) -> None:
        """Drop dead slots and renumber the live ones."""
        self._merge_pending()
        renumber = np.cumsum(self._alive) - 1
        keep = self._alive[self._sorted_slots]  # every band holds each slot once
        live = int(self._alive.sum())
        self._sorted_keys = self._sorted_keys[keep].reshape(self.bands, live)
        self._sorted_slots = renumber[self._sorted_slots[keep]].reshape(self.bands, live)
        self._ids = [i for i, alive in zip(self._ids, self._alive.tolist()) if alive]
        self._slots = {item: slot for slot, item in enumerate(self._ids)}
        self._alive = np.ones(len(self._ids), dtype=bool)
