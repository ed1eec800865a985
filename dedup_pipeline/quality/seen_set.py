"""How the exact rung's seen-set fared on a batch: was it there, and does it still fit its capacity."""

from __future__ import annotations

from dataclasses import dataclass, field

from sqlalchemy import Connection, select

from dedup_pipeline.store.schema import exact_rung_runs
from dedup_pipeline.store.seen_set import fallback_warning


@dataclass(frozen=True)
class SeenSetHealth:
    """The `seen_set*` figures the exact rung recorded for one run of a batch (none: the rung never ran it)."""

    batch_id: str
    run_id: str | None
    figures: dict = field(default_factory=dict)

    def problems(self, max_fill: float) -> list[str]:
        """What an operator should look at; empty when the fast path worked as it should."""
        found = []
        fallbacks, fill = self.figures.get("seen_set_fallbacks", 0), self.figures.get("seen_set_fill")
        if fallbacks:
            found.append(fallback_warning(self.figures.get("seen_set"), fallbacks))
        if fill is not None and fill > max_fill:
            found.append(f"Bloom seen-set at {fill:.2f} of its capacity (bound {max_fill:g}): raise bloom_capacity")
        return found


def seen_set_health(conn: Connection, batch_id: str, run_id: str | None = None) -> SeenSetHealth:
    """The figures of run `run_id` of the batch's exact rung, else of its latest run."""
    runs = exact_rung_runs.c
    query = select(runs.run_id, runs.stats).where(runs.batch_id == batch_id)
    row = conn.execute(query.where(runs.run_id == run_id)).first() if run_id is not None else None
    if row is None:
        row = conn.execute(query.order_by(runs.finished_at.desc()).limit(1)).first()
    if row is None:
        return SeenSetHealth(batch_id, None)
    return SeenSetHealth(batch_id, row.run_id, {k: v for k, v in row.stats.items() if k.startswith("seen_set")})
