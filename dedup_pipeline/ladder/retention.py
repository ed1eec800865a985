"""Retention: identifiers and copies the pipeline keeps only for a bounded time.

- decision-log rows (`dedup_decisions`: natural keys and digests) older than
  `DEDUP_DECISION_RETENTION_DAYS` (90);
- superseded content (`record_history`) older than `DEDUP_HISTORY_RETENTION_DAYS` (365);
- staged canonical rows (`canonical_records`) of batches last registered (staged) more than
  `DEDUP_STAGING_RETENTION_DAYS` ago (30); re-materialising such a batch stages it again;
- quarantined lines (`quarantine`, raw bytes by design) older than `DEDUP_QUARANTINE_RETENTION_DAYS` (30);
- decision rows of suppressed re-crawls of erased subjects (`erased`) keep only
  their batch, line and decision: their key and digest are cleared at once.

0 keeps that kind of row forever. Deletes run in bounded transactions of
`batch_size` rows, so pruning never holds long locks on a busy warehouse.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from sqlalchemy import Connection, delete, select, tuple_, update

from dedup_pipeline import environment
from dedup_pipeline.core.exact import Decision
from dedup_pipeline.environment import DEFAULT_RETENTION_DAYS, RETENTION_DAYS_ENV
from dedup_pipeline.store.schema import canonical_records, crawl_batches, dedup_decisions, quarantine, record_history
from dedup_pipeline.store.warehouse import Warehouse, utcnow


@dataclass(frozen=True)
class RetentionSettings:
    """Days each kind of row is kept (0 = forever)."""

    decision_days: int = DEFAULT_RETENTION_DAYS["decision_days"]
    history_days: int = DEFAULT_RETENTION_DAYS["history_days"]
    staging_days: int = DEFAULT_RETENTION_DAYS["staging_days"]
    quarantine_days: int = DEFAULT_RETENTION_DAYS["quarantine_days"]
    batch_size: int = 10_000

    def __post_init__(self) -> None:
        for name in RETENTION_DAYS_ENV:
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be 0 (keep forever) or a number of days")
        if self.batch_size < 1:
            raise ValueError("batch_size must be at least 1")

    @classmethod
    def from_env(cls, **overrides) -> RetentionSettings:
        values = {}
        for name in RETENTION_DAYS_ENV:
            days = environment.retention_days(name)
            values[name] = getattr(cls, name) if days is None else days
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)


@dataclass
class RetentionReport:
    pruned: dict[str, int] = field(default_factory=dict)
    redacted_erased_decisions: int = 0

    def as_metadata(self) -> dict:
        meta = {f"pruned[{table}]": n for table, n in sorted(self.pruned.items())}
        meta["redacted_erased_decisions"] = self.redacted_erased_decisions
        meta["rows_pruned"] = sum(self.pruned.values())
        return meta


def _cutoff(now: datetime, days: int) -> datetime | None:
    return now - timedelta(days=days) if days else None


def _delete_batches(warehouse: Warehouse, table, key_columns, condition, batch_size: int) -> int:
    """Delete rows matching `condition` a bounded batch per transaction."""
    key = tuple_(*key_columns) if len(key_columns) > 1 else key_columns[0]
    total = 0
    while True:
        with warehouse.engine.begin() as conn:
            doomed = select(*key_columns).where(condition).limit(batch_size)
            removed = conn.execute(delete(table).where(key.in_(doomed))).rowcount
        total += removed
        if removed < batch_size:
            return total


def _redact_erased(conn: Connection) -> int:
    d = dedup_decisions
    return conn.execute(
        update(d)
        .where(d.c.decision == Decision.ERASED.value, (d.c.natural_key.is_not(None)) | (d.c.content_hash.is_not(None)))
        .values(natural_key=None, content_hash=None)
    ).rowcount


def prune_retention(warehouse: Warehouse, settings: RetentionSettings, now: datetime | None = None) -> RetentionReport:
    """Delete every row past its retention; clear keys and digests of `erased` decision rows."""
    now = now or utcnow()
    report = RetentionReport()
    with warehouse.engine.begin() as conn:
        report.redacted_erased_decisions = _redact_erased(conn)
    if cutoff := _cutoff(now, settings.decision_days):
        d = dedup_decisions
        report.pruned["dedup_decisions"] = _delete_batches(
            warehouse, d, [d.c.decision_id], d.c.decided_at < cutoff, settings.batch_size
        )
    if cutoff := _cutoff(now, settings.history_days):
        h = record_history
        report.pruned["record_history"] = _delete_batches(
            warehouse, h, [h.c.history_id], h.c.superseded_at < cutoff, settings.batch_size
        )
    if cutoff := _cutoff(now, settings.staging_days):
        c = canonical_records
        # From when the batch was last registered (staged), not from its file's time: a file copied with its old
        # modification time (`cp -p`, `rsync -t`, a replayed archive) lands "long ago" and was staged just now.
        old_batches = select(crawl_batches.c.batch_id).where(crawl_batches.c.registered_at < cutoff)
        report.pruned["canonical_records"] = _delete_batches(
            warehouse, c, [c.c.batch_id, c.c.line_no], c.c.batch_id.in_(old_batches), settings.batch_size
        )
    if cutoff := _cutoff(now, settings.quarantine_days):
        q = quarantine
        report.pruned["quarantine"] = _delete_batches(
            warehouse, q, [q.c.batch_id, q.c.line_no], q.c.quarantined_at < cutoff, settings.batch_size
        )
    return report
