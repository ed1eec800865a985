"""A batch's quarantine rate: lines set aside (by the raw and canonical rungs) over lines in the file."""

from __future__ import annotations

from dataclasses import dataclass, field

from sqlalchemy import Connection, func, select

from dedup_pipeline.store.schema import crawl_batches, quarantine


@dataclass
class QuarantineReport:
    batch_id: str
    lines: int
    quarantined: int
    by_rung: dict[str, int] = field(default_factory=dict)
    top_reasons: list[tuple[str, str, int]] = field(default_factory=list)  # (rung, reason, lines)

    @property
    def rate(self) -> float:
        return self.quarantined / self.lines if self.lines else 0.0


def quarantine_report(conn: Connection, batch_id: str, top: int = 5) -> QuarantineReport:
    """Counts per rung and the most frequent reasons (reasons name rules and fields, never values)."""
    lines = conn.execute(select(crawl_batches.c.lines).where(crawl_batches.c.batch_id == batch_id)).scalar() or 0
    q = quarantine.c
    by_rung = dict(conn.execute(select(q.rung, func.count()).where(q.batch_id == batch_id).group_by(q.rung)).all())
    reasons = conn.execute(
        select(q.rung, q.reason, func.count().label("n"))
        .where(q.batch_id == batch_id)
        .group_by(q.rung, q.reason)
        .order_by(func.count().desc(), q.rung, q.reason)
        .limit(top)
    ).all()
    return QuarantineReport(batch_id, int(lines), sum(by_rung.values()), by_rung, [tuple(r) for r in reasons])
