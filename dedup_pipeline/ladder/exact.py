"""Rung 3: exact dedup of a batch against the warehouse, chunk by chunk."""

from __future__ import annotations

import logging
import random
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy.exc import IntegrityError, OperationalError

from dedup_pipeline import decision_log
from dedup_pipeline.core.exact import Decision, plan_chunk
from dedup_pipeline.core.records import CanonicalRecord
from dedup_pipeline.ladder.canonical import canonicalise_batch
from dedup_pipeline.ladder.progress import ChunkProgress, ProgressLog
from dedup_pipeline.ladder.settings import LadderSettings
from dedup_pipeline.metrics import seed_figures
from dedup_pipeline.quality.history import first_decision_counts, first_decision_figures
from dedup_pipeline.store.exact import (
    ChunkConflict,
    apply_plan,
    decided_by_unfinished_runs,
    decisions_through,
    iter_canonical_chunks,
    landed_at,
    load_state,
    other_versions_held,
    quarantined_lines,
    staged_after,
    staged_without,
)
from dedup_pipeline.store.schema import (
    exact_rung_runs,
    record_hashes,
    records,
)
from dedup_pipeline.store.seen_set import NoSeenSet, SeenSet, SeenSetUnavailable, fallback_warning
from dedup_pipeline.store.tombstones import erased_positions
from dedup_pipeline.store.warehouse import (
    Warehouse,
    active_hash_version,
    analyze_grown,
    analyze_new_batch,
    batch_rung_held,
    record_rung_run,
    utcnow,
)

log = logging.getLogger(__name__)
MAX_CHUNK_ATTEMPTS = 40
#: The columns the rungs look rows up by, whose statistics `analyze_grown` refreshes (not the wide payloads).
_LOOKED_UP = {
    records: ("natural_key", "record_id", "last_batch_id", "hash_version", "content_hash"),
    record_hashes: (),
}


@dataclass
class ExactReport:
    batch_id: str
    hash_version: str
    seen_set: str = "none"
    records_in: int = 0
    quarantined: int = 0
    decisions: Counter = field(default_factory=Counter)
    chunk_retries: int = 0
    seen_set_hits: int = 0  # fast-path hits the warehouse confirmed
    seen_set_false_positives: int = 0  # hits the warehouse did not confirm (Bloom false positive, stale key)
    seen_set_cold_misses: int = 0  # chunks whose misses the UNIQUE index caught (cold or flushed seen-set)
    seen_set_fallbacks: int = 0  # chunks the seen-set failed (down, hung) for, once each; plus a failed final save
    seen_set_fill: float | None = None  # a Bloom filter's digests over its capacity after the batch (None: no capacity)
    seen_set_bypassed: bool = False  # a rehash migration's overlap: every digest was looked up in the warehouse
    # The batch's first decision on each line, its run done (the collapse rate the check judges; a replay's own
    # `decisions` are all exact duplicates): set once the batch's rung has finished.
    first_decisions: Counter = field(default_factory=Counter)

    @property
    def duplicates(self) -> int:
        return self.decisions[Decision.EXACT_DUPLICATE.value]

    @property
    def survivors(self) -> int:
        return self.decisions[Decision.NEW.value] + self.decisions[Decision.CHANGED.value]

    @property
    def seen_set_over_capacity(self) -> str | None:
        """A warning when the seen-set is past its capacity (more false positives, each one a lookup), else None."""
        if self.seen_set_fill is None or self.seen_set_fill <= 1:
            return None
        return (
            f"seen-set {self.seen_set} holds {self.seen_set_fill:.1f}x the digests it was sized for: it answers "
            "'maybe seen' more often than its error rate (each a warehouse lookup, never a lost record); raise "
            "bloom_capacity in the seen_set resource (or $DEDUP_BLOOM_CAPACITY): a filter of the new size starts empty"
        )

    @property
    def seen_set_warnings(self) -> list[str]:
        """What an operator should know about the seen-set after this batch (the rung logs it, the asset too)."""
        warnings = [fallback_warning(self.seen_set, self.seen_set_fallbacks)] if self.seen_set_fallbacks else []
        return warnings + ([self.seen_set_over_capacity] if self.seen_set_over_capacity else [])

    @property
    def collapse_rate(self) -> float:
        """Exact duplicates over records that reached the rung (0 when there were none)."""
        return self.duplicates / self.records_in if self.records_in else 0.0

    def as_metadata(self) -> dict:
        meta = {
            "batch_id": self.batch_id,
            "hash_version": self.hash_version,
            "records_in": self.records_in,
            "quarantined": self.quarantined,
            "survivors": self.survivors,
            "collapse_rate": self.collapse_rate,
            "chunk_retries": self.chunk_retries,
            "seen_set": self.seen_set,
            "seen_set_hits": self.seen_set_hits,
            "seen_set_false_positives": self.seen_set_false_positives,
            "seen_set_cold_misses": self.seen_set_cold_misses,
            "seen_set_fallbacks": self.seen_set_fallbacks,
            "seen_set_bypassed": self.seen_set_bypassed,
        }
        if self.seen_set_fill is not None:
            meta["seen_set_fill"] = self.seen_set_fill
        meta.update(
            {
                decision.value: self.decisions[decision.value]
                for decision in Decision
                if decision != Decision.QUARANTINED
            }
        )
        meta.update(seed_figures(self.records_in + self.quarantined, self.decisions))
        return meta


def deduplicate_batch(
    warehouse: Warehouse,
    batch_id: str,
    run_id: str,
    settings: LadderSettings,
    seen_set: SeenSet | None = None,
    progress: ProgressLog | None = None,
) -> ExactReport:
    """Apply the duplicate-class policy to every canonical record of the batch.

    Each chunk is one transaction. The seen-set (if any) narrows the digest
    lookup to its hits; the warehouse confirms every hit, and the UNIQUE index
    catches misses it got wrong. A chunk that loses a race with a concurrent
    writer (or trusted a cold seen-set) is rolled back and replayed against the
    warehouse alone, so two workers on overlapping batches end with exactly one
    row per key and per content. Re-running a batch finds everything stored
    and changes nothing. A batch staged before a switch of the active hash
    version is canonicalised again first (its landing file must still be there).

    A run that takes over from one that failed or was killed part-way (a step
    retried after a dropped connection, a re-execution, `dedup-pipeline run`
    again) resumes after the last chunk that one committed, and reports the
    whole batch: each line is decided, and counted, once until a run finishes.
    Runs of one batch's exact rung wait for each other. `progress`, if given, hears how far it got as it goes
    (`ChunkProgress`).
    """
    with batch_rung_held(warehouse.engine, batch_id, "exact"):
        return _deduplicate_held_batch(warehouse, batch_id, run_id, settings, seen_set, progress)


def _deduplicate_held_batch(
    warehouse: Warehouse,
    batch_id: str,
    run_id: str,
    settings: LadderSettings,
    seen_set: SeenSet | None,
    progress: ProgressLog | None = None,
) -> ExactReport:
    with warehouse.engine.connect() as conn:
        version = active_hash_version(conn)
        stale = staged_without(conn, batch_id, version)
    if stale:
        # Hashed before the switch to `version`: stage it again under it (lines it cannot hash go to quarantine,
        # as for any batch canonicalised after the switch), rather than judge it by digests it lacks.
        log.warning("batch %s was canonicalised before %s became active: canonicalising it again", batch_id, version)
        canonicalise_batch(warehouse, batch_id, settings)
    with warehouse.engine.connect() as reader:
        batch_time = landed_at(reader, batch_id)
        quarantined = quarantined_lines(reader, batch_id)
        done_until, done = decided_by_unfinished_runs(reader, batch_id, run_id)
        if done:
            log.info(
                "run %s takes batch %s over after line %d (%d records decided by runs that did not finish)",
                run_id,
                batch_id,
                done_until,
                sum(done.values()),
            )
        report = deduplicate_records(
            warehouse,
            batch_id,
            run_id,
            iter_canonical_chunks(reader, batch_id, settings.chunk_size, done_until),
            settings,
            seen_set,
            batch_time,
            version,
            ChunkProgress("exact", staged_after(reader, batch_id, done_until), progress) if progress else None,
        )
        reader.rollback()
    report.decisions.update(done)
    report.records_in += sum(done.values())
    report.quarantined = quarantined
    with warehouse.engine.begin() as conn:
        report.first_decisions = first_decision_counts(conn, [batch_id]).get(batch_id, Counter())
        figures = {
            **report.as_metadata(),
            **first_decision_figures(report.first_decisions),
            "decisions_through": decisions_through(conn, batch_id),
        }
        record_rung_run(conn, exact_rung_runs, batch_id, run_id, figures)
    return report


def deduplicate_records(
    warehouse: Warehouse,
    batch_id: str,
    run_id: str,
    chunks: Iterable[list[CanonicalRecord]],
    settings: LadderSettings,
    seen_set: SeenSet | None,
    batch_time: datetime,
    version: str | None = None,
    progress: ChunkProgress | None = None,
) -> ExactReport:
    """The exact rung over canonical records in file order, a chunk per transaction.

    `deduplicate_batch` feeds it a staged batch; a caller that canonicalises
    in memory (a crawler writing straight to the warehouse, the benchmarks)
    feeds it chunks directly. `batch_time` orders this batch against others.
    """
    seen_set = seen_set or NoSeenSet()
    if version is None:
        version = warehouse.active_hash_version()
    report = ExactReport(batch_id, version, seen_set.kind)
    with warehouse.engine.connect() as conn:
        # In a migration's overlap, a digest of the active version may be held only in record_hashes by a row
        # stored under the old one, where no UNIQUE index catches a miss: every digest is looked up.
        report.seen_set_bypassed = other_versions_held(conn, version)
    writer = _ChunkWriter(warehouse, seen_set, batch_id, run_id, version, batch_time, settings, report)
    for chunk in chunks:
        report.records_in += len(chunk)
        report.decisions.update(writer.write(chunk))
        if progress is not None:
            progress.advance(len(chunk))
        with warehouse.engine.begin() as conn:  # the next chunk's lookups, planned on the tables as they are now
            analyze_grown(conn, _LOOKED_UP)
    if progress is not None:
        progress.finish()
    with warehouse.engine.begin() as conn:  # the near rung pages through this batch's rows by these columns
        analyze_new_batch(conn, records, ("last_batch_id", "record_id"), report.records_in)
    try:
        seen_set.flush()
    except SeenSetUnavailable:  # only the fast path's memory is lost; every decision is committed already
        report.seen_set_fallbacks += 1
    report.seen_set_fill = seen_set.fill(version)
    for warning in report.seen_set_warnings:
        log.warning("batch %s: %s", batch_id, warning)
    return report


@dataclass
class _ChunkWriter:
    warehouse: Warehouse
    seen_set: SeenSet
    batch_id: str
    run_id: str
    version: str
    batch_time: datetime
    settings: LadderSettings
    report: ExactReport
    _fell_back: bool = False

    def write(self, chunk: list[CanonicalRecord]) -> Counter:
        """Plan and apply one chunk in one transaction, replaying it while it loses races; its decision counts.

        A replay reloads the chunk's rows, so a lost race shows in what it loads. An IntegrityError raised
        twice, against the warehouse alone, on the same loaded state is no race: it fails the chunk at once.
        """
        self._fell_back = False  # the seen-set failed this chunk (its probe, or taking its digests): counted once
        digests = [bytes.fromhex(record.hashes[self.version]) for record in chunk]
        hits = None if self.report.seen_set_bypassed else self._probe(digests)
        failed_on = None  # the warehouse state an IntegrityError was raised on, replaying against the warehouse alone
        for attempt in range(1, MAX_CHUNK_ATTEMPTS + 1):
            check = digests if hits is None else [d for d, hit in zip(digests, hits) if hit]
            state = None
            try:
                with self.warehouse.engine.begin() as conn:
                    stored_by_key, stored = load_state(
                        conn, chunk, self.version, check, (self.batch_time, self.batch_id)
                    )
                    erased = erased_positions(conn, chunk, self.batch_id)
                    state = (stored_by_key, stored, erased)
                    plan = plan_chunk(
                        chunk,
                        self.version,
                        stored_by_key,
                        stored,
                        (self.batch_time, self.batch_id),
                        self.settings.policy,
                        erased=erased,
                    )
                    counts = apply_plan(
                        conn,
                        plan,
                        self.version,
                        self.batch_id,
                        self.run_id,
                        utcnow(),
                        self.batch_time,
                        self.settings.policy.keep_history,
                    )
            except (ChunkConflict, IntegrityError, OperationalError) as exc:
                if isinstance(exc, OperationalError) and not _is_lock_conflict(exc):
                    raise
                if isinstance(exc, IntegrityError) and hits is None and state is not None:
                    if state == failed_on:
                        # A lost race shows in what the replay loads; the same plan on the same rows fails for good.
                        raise RuntimeError(
                            f"chunk of batch {self.batch_id} (lines {chunk[0].line_no}-{chunk[-1].line_no}) broke a "
                            f"constraint twice against an unchanged warehouse, so replaying it cannot help: {exc.orig}"
                        ) from exc
                    failed_on = state
                if hits is not None:
                    self.report.seen_set_cold_misses += 1
                    hits = None  # replay against the warehouse alone
                else:
                    self.report.chunk_retries += 1
                log.info("chunk of batch %s replayed (attempt %d): %s", self.batch_id, attempt, type(exc).__name__)
                # Two workers replaying the same keys in lockstep would keep colliding: back off, with jitter.
                time.sleep(random.uniform(0, 0.05 * min(attempt, 10)))
                continue
            if hits is not None:
                confirmed = sum(1 for d, hit in zip(digests, hits) if hit and d.hex() in stored)
                self.report.seen_set_hits += confirmed
                self.report.seen_set_false_positives += sum(hits) - confirmed
            self._remember(plan, {d for d, hit in zip(digests, hits) if hit} if hits is not None else set())
            self.report.seen_set_fallbacks += self._fell_back
            decision_log.emit(plan.decisions, self.version, self.batch_id, self.run_id, self.seen_set.kind)
            return counts
        raise RuntimeError(f"chunk of batch {self.batch_id} kept conflicting after {MAX_CHUNK_ATTEMPTS} attempts")

    def _probe(self, digests: list[bytes]) -> list[bool] | None:
        try:
            return self.seen_set.maybe_seen(self.version, digests)
        except SeenSetUnavailable:
            self._fell_back = True
            return None

    def _remember(self, plan, present: set[bytes]) -> None:
        """Add the chunk's stored digests to the seen-set, except those it reported `present` (a no-op to add)."""
        stored_now = {
            bytes.fromhex(record.hashes[self.version])
            for record, decision in plan.decisions
            if decision in (Decision.NEW, Decision.CHANGED, Decision.EXACT_DUPLICATE)
        }
        try:
            self.seen_set.remember(self.version, sorted(stored_now - present))
        except SeenSetUnavailable:
            self._fell_back = True


def _is_lock_conflict(exc: OperationalError) -> bool:
    text = str(exc).lower()
    return "deadlock" in text or "locked" in text
