"""Rung 3: exact dedup of a batch against the warehouse, chunk by chunk."""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from typing import Iterator

from sqlalchemy import Connection, func, select
from sqlalchemy.exc import IntegrityError, OperationalError

from dedup_pipeline.core.policy import Decision, plan_chunk
from dedup_pipeline.core.records import CanonicalRecord
from dedup_pipeline.ladder.settings import LadderSettings
from dedup_pipeline.store.exact import ChunkConflict, apply_plan, load_state
from dedup_pipeline.store.schema import canonical_records, crawl_batches, quarantine
from dedup_pipeline.store.warehouse import Warehouse, active_hash_version, as_utc, utcnow

log = logging.getLogger(__name__)
MAX_CHUNK_ATTEMPTS = 8


@dataclass
class ExactReport:
    batch_id: str
    hash_version: str
    records_in: int = 0
    quarantined: int = 0
    decisions: Counter = field(default_factory=Counter)
    chunk_retries: int = 0

    @property
    def duplicates(self) -> int:
        return self.decisions[Decision.EXACT_DUPLICATE.value]

    @property
    def survivors(self) -> int:
        return self.decisions[Decision.NEW.value] + self.decisions[Decision.CHANGED.value]

    @property
    def collapse_rate(self) -> float:
        """Exact duplicates over records that reached the rung (0 when there were none)."""
        return self.duplicates / self.records_in if self.records_in else 0.0

    def as_metadata(self) -> dict:
        meta = {
            "batch_id": self.batch_id, "hash_version": self.hash_version, "records_in": self.records_in,
            "quarantined": self.quarantined, "survivors": self.survivors, "collapse_rate": self.collapse_rate,
            "chunk_retries": self.chunk_retries,
        }
        meta.update({decision.value: self.decisions[decision.value] for decision in Decision if decision != Decision.QUARANTINED})
        return meta


def iter_canonical_chunks(conn: Connection, batch_id: str, chunk_size: int) -> Iterator[list[CanonicalRecord]]:
    """The batch's canonical records in file order, a keyset-paginated chunk at a time."""
    last_line = 0
    while True:
        rows = conn.execute(
            select(canonical_records)
            .where(canonical_records.c.batch_id == batch_id, canonical_records.c.line_no > last_line)
            .order_by(canonical_records.c.line_no)
            .limit(chunk_size)
        ).all()
        if not rows:
            return
        yield [
            CanonicalRecord(
                line_no=row.line_no, canonical_url=row.canonical_url, natural_key=row.natural_key,
                payload=row.payload, hashes=row.hashes, hash_errors=row.hash_errors, crawled_at=row.crawled_at,
            )
            for row in rows
        ]
        last_line = rows[-1].line_no


def _batch_time(conn: Connection, batch_id: str) -> datetime:
    landed = conn.execute(select(crawl_batches.c.landed_at).where(crawl_batches.c.batch_id == batch_id)).scalar()
    if landed is None:
        raise RuntimeError(f"batch {batch_id!r} is not registered: materialise raw_crawl_batches first")
    return as_utc(landed)


def deduplicate_batch(warehouse: Warehouse, batch_id: str, run_id: str, settings: LadderSettings) -> ExactReport:
    """Apply the duplicate-class policy to every canonical record of the batch.

    Each chunk is one transaction. A chunk that loses a race with a concurrent
    writer is rolled back and replayed against the new state, so two workers
    on overlapping batches end with exactly one row per key and per content.
    Re-running a batch finds everything stored and changes nothing.
    """
    with warehouse.engine.connect() as reader:
        version = active_hash_version(reader)
        batch_time = _batch_time(reader, batch_id)
        report = ExactReport(batch_id, version)
        report.quarantined = reader.execute(
            select(func.count()).select_from(quarantine).where(quarantine.c.batch_id == batch_id)
        ).scalar_one()
        for chunk in iter_canonical_chunks(reader, batch_id, settings.chunk_size):
            report.records_in += len(chunk)
            report.decisions.update(_apply_chunk(warehouse, chunk, batch_id, run_id, version, batch_time, settings, report))
        reader.rollback()
    return report


def _apply_chunk(warehouse, chunk, batch_id, run_id, version, batch_time, settings, report) -> Counter:
    for attempt in range(1, MAX_CHUNK_ATTEMPTS + 1):
        try:
            with warehouse.engine.begin() as conn:
                stored_by_key, stored_digests = load_state(conn, chunk, version)
                plan = plan_chunk(chunk, version, stored_by_key, stored_digests, (batch_time, batch_id), settings.policy)
                return apply_plan(conn, plan, version, batch_id, run_id, utcnow(), batch_time, settings.policy.keep_history)
        except (ChunkConflict, IntegrityError, OperationalError) as exc:
            if isinstance(exc, OperationalError) and "deadlock" not in str(exc).lower() and "locked" not in str(exc).lower():
                raise
            report.chunk_retries += 1
            log.warning("chunk of batch %s lost a race (attempt %d): %s; replaying", batch_id, attempt, type(exc).__name__)
    raise RuntimeError(f"chunk of batch {batch_id} kept conflicting after {MAX_CHUNK_ATTEMPTS} attempts")
