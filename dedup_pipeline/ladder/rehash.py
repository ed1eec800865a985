"""The rehash migration from the active hash version to another, in four deliberate steps.

1. **Backfill** (`backfill_shard`, one call per shard): every stored row gets
   a digest under the target version beside the one it has, or the reason the
   target rule cannot hash it. Keyset-paginated pages of rows that still lack
   the target, hashed in Python, one multi-row insert per page (each page its
   own transaction): a killed shard resumes where it stopped and a second
   run writes nothing.
2. **Compare** (`compare_versions`): distinct contents and collapse rates
   under both versions, groups that merge or split, checked against an
   expected band of the collapse-rate change. Stored in `rehash_comparisons`.
3. **Switch** and 4. **Retire**: `dedup_pipeline.ladder.rehash_switch`
   (re-exported here).

Nothing names a particular version: any registered pair migrates the same way.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from queue import Empty, Queue
from typing import TypeVar

from dedup_pipeline.core.errors import RecordError
from dedup_pipeline.core.hashing import HASH_RULES, hash_rule
from dedup_pipeline.ladder.rehash_switch import (  # noqa: F401 - the steps after the backfill, re-exported
    MigrationRefused,
    RetireReport,
    SwitchReport,
    retire_hash_version,
    switch_hash_version,
)
from dedup_pipeline.store import rehash as store
from dedup_pipeline.store.rehash_compare import staged_figures, store_comparison, stored_through, warehouse_figures
from dedup_pipeline.store.warehouse import Warehouse, utcnow

DEFAULT_CHUNK_SIZE = 5000
T = TypeVar("T")


# ---------------------------------------------------------------- 1. backfill


@dataclass
class ShardReport:
    """What one run over one shard did, and where the shard and the warehouse stand afterwards."""

    target: str
    shard: str
    hashed: int = 0
    unhashable: int = 0
    already_hashed: int = 0
    chunks: int = 0
    seconds: float = 0.0
    complete: bool = False
    shard_progress: store.Progress | None = None
    warehouse_progress: store.Progress | None = None
    unhashable_examples: list[tuple[str, str]] = field(default_factory=list)

    @property
    def rows_per_second(self) -> float:
        return (self.hashed + self.unhashable) / self.seconds if self.seconds else 0.0

    def as_metadata(self) -> dict:
        shard, everywhere = self.shard_progress, self.warehouse_progress
        meta = {
            "target_version": self.target,
            "shard": self.shard,
            "complete": self.complete,
            "rows_hashed": self.hashed,
            "rows_unhashable": self.unhashable,
            "rows_already_hashed": self.already_hashed,
            "chunks": self.chunks,
            "seconds": round(self.seconds, 3),
            "rows_per_second": round(self.rows_per_second, 1),
            "shard_rows": shard.rows,
            "shard_rows_done": shard.done,
            "shard_rows_left": shard.left,
            "shard_rows_unhashable": shard.unhashable,
        }
        if everywhere is not None:
            meta.update(
                {
                    "warehouse_rows": everywhere.rows,
                    "warehouse_rows_done": everywhere.done,
                    "warehouse_rows_left": everywhere.left,
                    "warehouse_rows_unhashable": everywhere.unhashable,
                }
            )
        return meta


def hash_payloads(target: str, page: list[store.PendingRow]) -> list[tuple[int, bytes | None, str | None]]:
    """(record_id, digest, error) per row: the target digest of the stored payload, or why there is none."""
    canonical_bytes = hash_rule(target).canonical_bytes
    rows = []
    for row in page:
        try:
            rows.append((row.record_id, hashlib.sha256(canonical_bytes(row.payload)).digest(), None))
        except RecordError as exc:
            rows.append((row.record_id, None, str(exc)))
    return rows


class ShardPages:
    """Keyset pages of the shard's rows lacking `target`, version by version, each read in its own transaction.

    `stopped` says whether `max_chunks` ended the iteration before the shard's end.
    """

    def __init__(self, warehouse: Warehouse, target: str, shard: str, chunk_size: int, max_chunks: int | None = None):
        self.warehouse, self.target, self.shard = warehouse, target, shard
        self.chunk_size, self.max_chunks = chunk_size, max_chunks
        self.stopped = False

    def __iter__(self) -> Iterator[list[store.PendingRow]]:
        pages = 0
        with self.warehouse.engine.connect() as conn:
            for version in sorted(HASH_RULES):
                after = None
                while True:
                    if self.max_chunks is not None and pages >= self.max_chunks:
                        self.stopped = True
                        return
                    page = store.page_lacking(conn, self.target, version, self.shard, after, self.chunk_size)
                    conn.rollback()
                    if not page:
                        break
                    yield page
                    pages += 1
                    after = page[-1].content_hash


def read_ahead(items: Iterable[T], depth: int = 2) -> Iterator[T]:
    """Iterate `items` in a thread of its own, up to `depth` items ahead of the consumer.

    The backfill reads page k+1 (database and JSON decoding) while it hashes
    and writes page k; on two cores that overlap is most of its speed.
    """
    queue: Queue = Queue(maxsize=depth)
    done = object()
    stop = threading.Event()

    def produce() -> None:
        try:
            for item in items:
                if stop.is_set():
                    return
                queue.put((item, None))
            queue.put((done, None))
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer
            queue.put((done, exc))

    thread = threading.Thread(target=produce, name="rehash-read-ahead", daemon=True)
    thread.start()
    try:
        while True:
            item, error = queue.get()
            if error is not None:
                raise error
            if item is done:
                return
            yield item
    finally:
        stop.set()
        while thread.is_alive():  # unblock a producer waiting on a full queue
            try:
                queue.get_nowait()
            except Empty:
                pass
            thread.join(timeout=0.05)


def backfill_shard(
    warehouse: Warehouse,
    target: str,
    shard: str,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    max_chunks: int | None = None,
    on_chunk: Callable[[ShardReport], None] | None = None,
    examples: int = 20,
    warehouse_progress: bool = True,
) -> ShardReport:
    """Write `target` digests for the rows of `shard` that lack one; stop after `max_chunks` pages if given.

    The report ends with the shard's progress and, unless `warehouse_progress`
    is False, the whole warehouse's (two counts over every row).

    Each page is written in its own short transaction, so a run killed at
    any moment leaves whole pages behind and the next run picks up the rows
    still lacking the target (a page read ahead but not written is simply
    read again).
    """
    hash_rule(target)
    store.shard_range(shard)
    if chunk_size < 1:
        raise ValueError("chunk_size must be at least 1")
    report = ShardReport(target, shard)
    started = time.perf_counter()
    pages = ShardPages(warehouse, target, shard, chunk_size, max_chunks)
    with warehouse.engine.connect() as conn:
        for page in read_ahead(pages):
            rows = hash_payloads(target, page)
            written = store.write_target_hashes(conn, target, rows)
            conn.commit()
            for record_id, digest, _ in rows:
                if record_id not in written:  # another writer (a batch, a second run) got there first
                    report.already_hashed += 1
                elif digest is None:
                    report.unhashable += 1
                else:
                    report.hashed += 1
            report.chunks += 1
            report.seconds = time.perf_counter() - started
            if on_chunk:
                on_chunk(report)
        report.shard_progress = store.progress(conn, target, shard, finished=not pages.stopped)
        report.warehouse_progress = store.progress(conn, target) if warehouse_progress else None
        _, report.unhashable_examples = store.unhashable_rows(conn, target, shard, examples)
        conn.rollback()
    report.complete = report.shard_progress.left == 0
    report.seconds = time.perf_counter() - started
    return report


def backfill(warehouse: Warehouse, target: str, chunk_size: int = DEFAULT_CHUNK_SIZE) -> list[ShardReport]:
    """Every shard in turn (what a whole Dagster backfill does, without Dagster); the last reports the warehouse."""
    last = store.SHARDS[-1]
    return [
        backfill_shard(warehouse, target, shard, chunk_size, warehouse_progress=shard == last) for shard in store.SHARDS
    ]


# ---------------------------------------------------------------- 2. compare


@dataclass
class Comparison:
    source: str
    target: str
    passed: bool
    figures: dict
    comparison_id: int | None = None


def compare_versions(
    warehouse: Warehouse,
    source: str,
    target: str,
    low: float,
    high: float,
    examples: int = 10,
) -> Comparison:
    """Compare the two versions over the rows hashed under both; pass when the collapse-rate change is in [low, high].

    The change is the target's collapse rate minus the source's over stored
    rows: positive when the new rule merges contents the old one kept apart.
    The result is stored (`rehash_comparisons`); the switch reads the latest.
    """
    hash_rule(source), hash_rule(target)
    if source == target:
        raise ValueError("compare two different versions")
    with warehouse.engine.connect() as conn:
        figures = {"source_version": source, "target_version": target, "band_low": low, "band_high": high}
        # First: what lands while the figures are counted is after it, so a switch asks for a new comparison.
        figures["stored_through"] = stored_through(conn)
        figures.update(warehouse_figures(conn, source, target, examples))
        figures.update(staged_figures(conn, source, target, examples))
        remaining = store.progress(conn, target)
        unhashable, unhashable_examples = store.unhashable_rows(conn, target, limit=examples)
        conn.rollback()
    figures.update(
        {
            "warehouse_rows": remaining.rows,
            "rows_left": remaining.left,
            "rows_unhashable": unhashable,
            "unhashable_examples": [list(pair) for pair in unhashable_examples],
        }
    )
    passed = low <= figures["collapse_rate_change"] <= high
    with warehouse.engine.begin() as conn:
        comparison_id = store_comparison(conn, source, target, utcnow(), passed, figures)
    return Comparison(source, target, passed, figures, comparison_id)
