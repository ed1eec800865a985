"""Per-batch collapse rates from the warehouse's decision log (`dedup_decisions`).

Why the warehouse and not Dagster's materialisation events: the decision log is
durable (it survives a wiped or replaced Dagster instance, and PostgreSQL holds
it for every worker), it is the audit trail the figures must agree with, and it
knows what the *first* decision on each line was. A re-materialised batch finds
everything already stored and logs all its lines again as exact duplicates, so
the latest materialisation's `collapse_rate` (1.0 on a replay) is not the
batch's real rate; the earliest decision per (batch, line) is, even when the
first run crashed half way and a retry finished the batch.

The exact rung keeps each batch's first-decision counts in its run's figures (`exact_rung_runs`, kept for the
warehouse's life) once it has finished the batch, when they are final: the history reads those, a row per
batch, and counts the decision log only for a batch that has none (one staged by an older version). So a
check reads what its window needs, not every line of the trailing batches again.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from sqlalchemy import Connection, and_, func, or_, select

from dedup_pipeline.core.exact import Decision
from dedup_pipeline.landing import named_source
from dedup_pipeline.quality.collapse import BatchRate
from dedup_pipeline.store.schema import crawl_batches, dedup_decisions, exact_rung_runs

#: How a run's figures name the batch's first-decision counts: `first_decisions[exact_duplicate]`, ...
_FIRST = "first_decisions["


def first_decision_counts(conn: Connection, batch_ids: Sequence[str]) -> dict[str, Counter]:
    """Per batch, the count of each decision, taking only the earliest decision on each line."""
    if not batch_ids:
        return {}
    d = dedup_decisions
    first = (
        select(func.min(d.c.decision_id).label("decision_id"))
        .where(d.c.batch_id.in_(list(batch_ids)))
        .group_by(d.c.batch_id, d.c.line_no)
        .subquery()
    )
    rows = conn.execute(
        select(d.c.batch_id, d.c.decision, func.count())
        .join(first, first.c.decision_id == d.c.decision_id)
        .group_by(d.c.batch_id, d.c.decision)
    )
    counts: dict[str, Counter] = {}
    for batch_id, decision, n in rows:
        counts.setdefault(batch_id, Counter())[decision] = n
    return counts


def first_decision_figures(counts: Counter) -> dict[str, int]:
    """The first-decision counts as a run's figures (`record_rung_run` keeps numbers, not mappings)."""
    return {f"{_FIRST}{decision}]": n for decision, n in sorted(counts.items())}


def recorded_first_decisions(conn: Connection, batch_ids: Sequence[str]) -> dict[str, Counter]:
    """Per batch, the first-decision counts its exact rung recorded when it finished it (the earliest run that
    did); batches with none recorded are absent."""
    if not batch_ids:
        return {}
    runs = exact_rung_runs.c
    rows = conn.execute(
        select(runs.batch_id, runs.stats).where(runs.batch_id.in_(list(batch_ids))).order_by(runs.finished_at)
    )
    counts: dict[str, Counter] = {}
    for batch_id, stats in rows:
        if batch_id not in counts and any(key.startswith(_FIRST) for key in stats):
            counts[batch_id] = Counter(
                {key[len(_FIRST) : -1]: n for key, n in stats.items() if key.startswith(_FIRST) and n}
            )
    return counts


def first_counts(conn: Connection, batch_ids: Sequence[str]) -> dict[str, Counter]:
    """`recorded_first_decisions`, and the decision log's counts for the batches that have none recorded."""
    counts = recorded_first_decisions(conn, batch_ids)
    counts.update(first_decision_counts(conn, [batch for batch in batch_ids if batch not in counts]))
    return counts


def rate_of(batch_id: str, counts: Counter | None) -> BatchRate:
    counts = counts or Counter()
    return BatchRate(batch_id, sum(counts.values()), counts[Decision.EXACT_DUPLICATE.value])


def first_run_rate(conn: Connection, batch_id: str) -> BatchRate:
    """The batch's collapse rate as its first decisions made it: what the collapse check judges, whatever the
    replays since."""
    return rate_of(batch_id, first_counts(conn, [batch_id]).get(batch_id))


def earlier_batches_of_its_source(conn: Connection, batch_id: str) -> list[str]:
    """The batches of `batch_id`'s source landed before it (landing time, then key), most recent first.

    A source is what a dated key names after its date (`2026-11-30-shop-a`: `shop-a`); the batches whose keys
    name none (`crawl-7`, `2026-11-30`) are one source together. Ids only: cheap for thousands of batches.
    """
    landed = conn.execute(select(crawl_batches.c.landed_at).where(crawl_batches.c.batch_id == batch_id)).scalar()
    if landed is None:
        return []
    b = crawl_batches.c
    earlier = or_(b.landed_at < landed, and_(b.landed_at == landed, b.batch_id < batch_id))
    source = named_source(batch_id)
    keys = conn.execute(select(b.batch_id).where(earlier).order_by(b.landed_at.desc(), b.batch_id.desc())).scalars()
    return [key for key in keys if named_source(key) == source]


def batch_rates(
    conn: Connection, batch_id: str, window: int, min_records: int = 0
) -> tuple[BatchRate, list[BatchRate]]:
    """The batch's own rate, and those of the `window` latest earlier batches of its source big enough to judge.

    Most recent first; batches with fewer than `min_records` records (or no decisions) are skipped, not counted.
    """
    current = first_run_rate(conn, batch_id)
    candidates = earlier_batches_of_its_source(conn, batch_id)
    history: list[BatchRate] = []
    for start in range(0, len(candidates), 4 * window):
        part = candidates[start : start + 4 * window]
        counts = first_counts(conn, part)
        history += [
            rate for rate in (rate_of(b, counts[b]) for b in part if b in counts) if rate.records_in >= min_records
        ]
        if len(history) >= window:
            break
    return current, history[:window]
