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
3. **Switch** (`switch_hash_version`): refused while rows lack the target or
   the latest comparison failed, unless forced with a reason. Sets the active
   version in the warehouse and rewrites `records` to the target for the
   first row of each target digest; rows that merge into another row's digest
   and rows the target cannot hash keep their old version for the overlap
   window. Audited in `hash_version_events`.
4. **Retire** (`retire_hash_version`): after the overlap window (one crawl
   cycle), drops the old version's digests and moves the rows that merged
   under the new version to `record_history`.

Nothing names a particular version: any registered pair migrates the same way.
"""

from __future__ import annotations

import hashlib
import threading
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta
from queue import Empty, Queue
from typing import Callable, Iterable, Iterator, TypeVar

from sqlalchemy import Connection, select, update

from dedup_pipeline.core.errors import RecordError
from dedup_pipeline.core.hashing import HASH_RULES, hash_rule
from dedup_pipeline.store import rehash as store
from dedup_pipeline.store.rehash_compare import staged_figures, warehouse_figures
from dedup_pipeline.store.schema import hash_version_events, settings
from dedup_pipeline.store.warehouse import ACTIVE_HASH_VERSION, Warehouse, active_hash_version, as_utc, utcnow

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
            "target_version": self.target, "shard": self.shard, "complete": self.complete,
            "rows_hashed": self.hashed, "rows_unhashable": self.unhashable, "rows_already_hashed": self.already_hashed,
            "chunks": self.chunks, "seconds": round(self.seconds, 3), "rows_per_second": round(self.rows_per_second, 1),
            "shard_rows": shard.rows, "shard_rows_done": shard.done, "shard_rows_left": shard.left,
            "shard_rows_unhashable": shard.unhashable,
        }
        if everywhere is not None:
            meta.update({
                "warehouse_rows": everywhere.rows, "warehouse_rows_done": everywhere.done,
                "warehouse_rows_left": everywhere.left, "warehouse_rows_unhashable": everywhere.unhashable,
            })
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


class shard_pages:
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
    pages = shard_pages(warehouse, target, shard, chunk_size, max_chunks)
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
    warehouse: Warehouse, source: str, target: str, low: float, high: float, examples: int = 10,
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
        figures.update(warehouse_figures(conn, source, target, examples))
        figures.update(staged_figures(conn, source, target, examples))
        remaining = store.progress(conn, target)
        unhashable, unhashable_examples = store.unhashable_rows(conn, target, limit=examples)
        conn.rollback()
    figures.update({
        "warehouse_rows": remaining.rows, "rows_left": remaining.left, "rows_unhashable": unhashable,
        "unhashable_examples": [list(pair) for pair in unhashable_examples],
    })
    passed = low <= figures["collapse_rate_change"] <= high
    with warehouse.engine.begin() as conn:
        comparison_id = store.store_comparison(conn, source, target, utcnow(), passed, figures)
    return Comparison(source, target, passed, figures, comparison_id)


# ---------------------------------------------------------------- 3. switch

class MigrationRefused(RuntimeError):
    """A switch or retire that is not safe now; `problems` says why. Force it with a reason to override."""

    def __init__(self, action: str, problems: list[str], details: dict | None = None):
        self.problems = problems
        self.details = details or {}
        super().__init__(f"{action} refused: " + "; ".join(problems) + " (force it with a reason to override)")


def _check_force(force: bool, reason: str) -> None:
    if force and not (reason or "").strip():
        raise ValueError("a forced switch or retire needs a reason; it is stored in hash_version_events")


def _event_metadata(report) -> dict:
    """A switch or retire report as run metadata: overridden problems and the reason as text."""
    meta = asdict(report)
    meta["problems"] = "; ".join(report.problems) or "none"
    meta["reason"] = report.reason or ""
    return meta


def _lock_active(conn: Connection) -> str:
    """The active version, with its settings row locked on PostgreSQL so switches and retires serialise."""
    conn.execute(select(settings.c.value).where(settings.c.name == ACTIVE_HASH_VERSION).with_for_update())
    return active_hash_version(conn)


@dataclass
class SwitchReport:
    from_version: str
    to_version: str
    forced: bool
    reason: str | None
    problems: list[str]
    promoted: int
    kept_merged: int
    kept_unhashable: int
    unhashable_examples: list[tuple[str, str]]
    sketches_relabelled: int
    overlap_until: datetime
    event_id: int

    def as_metadata(self) -> dict:
        meta = _event_metadata(self)
        meta["overlap_until"] = self.overlap_until.isoformat()
        meta["unhashable_examples"] = [list(pair) for pair in self.unhashable_examples]
        return meta


def switch_problems(conn: Connection, source: str, target: str) -> list[str]:
    """Why switching from `source` to `target` is not safe yet (empty when it is)."""
    problems = []
    remaining = store.progress(conn, target)
    if remaining.left:
        problems.append(f"{remaining.left} of {remaining.rows} rows have no {target} digest yet: run the backfill")
    comparison = store.latest_comparison(conn, source, target)
    if comparison is None:
        problems.append(f"no comparison of {source} and {target} yet: run the comparison")
    else:
        if not comparison.passed:
            change = comparison.figures.get("collapse_rate_change")
            problems.append(
                f"the latest comparison (#{comparison.comparison_id}) failed: collapse-rate change {change} "
                f"outside [{comparison.figures.get('band_low')}, {comparison.figures.get('band_high')}]"
            )
        if comparison.figures.get("rows_left"):
            problems.append(
                f"the latest comparison (#{comparison.comparison_id}) ran while "
                f"{comparison.figures['rows_left']} rows lacked {target}: compare again"
            )
    return problems


def switch_hash_version(
    warehouse: Warehouse,
    target: str,
    *,
    force: bool = False,
    reason: str = "",
    run_id: str | None = None,
    overlap_hours: float = 24.0,
    now: datetime | None = None,
    examples: int = 20,
) -> SwitchReport:
    """Make `target` the active version (see the module docstring); MigrationRefused when not safe."""
    hash_rule(target)
    _check_force(force, reason)
    if overlap_hours < 0:
        raise ValueError("overlap_hours cannot be negative")
    now = now or utcnow()
    with warehouse.engine.begin() as conn:
        source = _lock_active(conn)
        if source == target:
            raise MigrationRefused("switch", [f"{target} is already the active version"])
        problems = switch_problems(conn, source, target)
        if problems and not force:
            raise MigrationRefused("switch", problems)
        store.set_active_version(conn, target, now)
        promoted = store.promote_group_leaders(conn, target)
        relabelled = store.follow_sketches(conn, source, target)
        unhashable, unhashable_examples = store.unhashable_rows(conn, target, limit=examples)
        kept_merged = len(store.merged_rows(conn, source, target))
        overlap_until = now + timedelta(hours=overlap_hours)
        details = {
            "problems": problems, "promoted": promoted, "kept_merged": kept_merged,
            "kept_unhashable": unhashable, "sketches_relabelled": relabelled,
        }
        event_id = store.record_event(
            conn, "switch", source, target, now, forced=bool(problems) and force, reason=reason or None,
            run_id=run_id, details=details, overlap_until=overlap_until,
        )
    with warehouse.engine.begin() as conn:
        store.refresh_statistics(conn)
    return SwitchReport(
        source, target, bool(problems) and force, reason or None, problems, promoted, kept_merged, unhashable,
        unhashable_examples, relabelled, overlap_until, event_id,
    )


# ---------------------------------------------------------------- 4. retire

@dataclass
class RetireReport:
    version: str
    active: str
    forced: bool
    reason: str | None
    problems: list[str]
    promoted: int
    merged_moved: int
    hashes_dropped: int
    kept_unhashable: int
    event_id: int

    def as_metadata(self) -> dict:
        return _event_metadata(self)


def retire_hash_version(
    warehouse: Warehouse,
    version: str,
    *,
    force: bool = False,
    reason: str = "",
    run_id: str | None = None,
    now: datetime | None = None,
) -> RetireReport:
    """Drop `version`'s digests once the overlap window after the switch away from it is over.

    Rows still stored under `version` whose active digest another row holds
    (they merged under the new rule) are moved to `record_history`; rows the
    active version cannot hash stay, keeping their old digest in `records`.
    """
    _check_force(force, reason)
    now = now or utcnow()
    with warehouse.engine.begin() as conn:
        active = _lock_active(conn)
        if version == active:
            raise MigrationRefused("retire", [f"{version} is the active version: switch away from it first"])
        problems = []
        switched = store.latest_event(conn, "switch", version)
        if switched is None:
            if store.rows_stored_under(conn, version):
                problems.append(f"no recorded switch away from {version}, so no overlap window has run")
        elif switched.overlap_until is not None and now < as_utc(switched.overlap_until):
            problems.append(f"the overlap window after the switch to {switched.to_version} runs until {as_utc(switched.overlap_until).isoformat()}")
        if problems and not force:
            raise MigrationRefused("retire", problems)
        promoted = store.promote_group_leaders(conn, active)
        merged = store.merged_rows(conn, version, active)
        event_id = store.record_event(
            conn, "retire", version, active, now, forced=bool(problems) and force, reason=reason or None,
            run_id=run_id, details={},
        )
        moved = store.move_merged_to_history(conn, merged, version, active, event_id, now)
        dropped = store.drop_version_hashes(conn, version)
        kept = store.rows_stored_under(conn, version)
        details = {"problems": problems, "promoted": promoted, "merged_moved": moved, "hashes_dropped": dropped,
                   "kept_unhashable": kept}
        conn.execute(update(hash_version_events).where(hash_version_events.c.event_id == event_id).values(details=details))
    with warehouse.engine.begin() as conn:
        store.refresh_statistics(conn)
    return RetireReport(version, active, bool(problems) and force, reason or None, problems, promoted, moved, dropped, kept, event_id)
