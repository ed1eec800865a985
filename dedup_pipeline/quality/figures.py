"""Figures of one batch read back from the warehouse: the ladder funnel and the largest near-duplicate clusters.

Read from the warehouse (not from the run), so a re-materialised batch shows
the same funnel as its first run: the decision counts are the first decision
per line (see `dedup_pipeline.quality.history`). No record values: ids,
counts and similarities only.
"""

from __future__ import annotations

from collections.abc import Iterable

from sqlalchemy import Connection, case, func, select

from dedup_pipeline.core.exact import Decision
from dedup_pipeline.quality.history import first_counts
from dedup_pipeline.store.schema import (
    canonical_records,
    crawl_batches,
    dedup_decisions,
    near_duplicate_clusters,
    near_duplicate_links,
    records,
)

SURVIVING = (Decision.NEW.value, Decision.CHANGED.value)
#: Funnel stages, widest first: (metadata key, label).
STAGES = (
    ("lines", "lines in file"),
    ("parsed", "parsed"),
    ("canonical", "canonical"),
    ("exact_survivors", "new or changed"),
    ("near_distinct", "no near duplicate"),
)


def batch_funnel(conn: Connection, batch_id: str) -> dict[str, int]:
    """How many of the batch's lines are left after each rung (keys of `STAGES`)."""
    lines, parsed = conn.execute(
        select(crawl_batches.c.lines, crawl_batches.c.parsed).where(crawl_batches.c.batch_id == batch_id)
    ).one_or_none() or (0, 0)
    staged = conn.execute(
        select(func.count()).select_from(canonical_records).where(canonical_records.c.batch_id == batch_id)
    ).scalar_one()
    decisions = first_counts(conn, [batch_id]).get(batch_id, {})
    survivors = sum(decisions.get(d, 0) for d in SURVIVING)
    # Every staged line gets one first decision, so once the exact rung has run they count the canonical lines,
    # however many staged rows an erasure or the staging retention has removed since.
    canonical = max(int(staged), sum(decisions.values()))
    d = dedup_decisions.c
    # A line is new or changed at most once (a replay finds its content stored), so no first-decision filter here.
    clustered = conn.execute(
        select(func.count(records.c.record_id.distinct()))
        .select_from(
            dedup_decisions.join(records, records.c.natural_key == d.natural_key).join(
                near_duplicate_clusters, near_duplicate_clusters.c.record_id == records.c.record_id
            )
        )
        .where(d.batch_id == batch_id, d.decision.in_(SURVIVING))
    ).scalar_one()
    return {
        "lines": int(lines),
        "parsed": int(parsed),
        "canonical": int(canonical),
        "exact_survivors": survivors,
        "near_distinct": max(survivors - int(clustered), 0),
    }


def cluster_preview(conn: Connection, cluster_ids: Iterable[int]) -> list[dict]:
    """Per cluster: size, representative record id, batches it spans, and its lowest and highest link similarity."""
    ids = list(cluster_ids)
    if not ids:
        return []
    c = near_duplicate_clusters.c
    members = conn.execute(
        select(
            c.cluster_id,
            func.count().label("records"),
            func.max(case((c.is_representative, c.record_id), else_=None)).label("representative"),
            func.count(records.c.first_batch_id.distinct()).label("batches"),
        )
        .select_from(near_duplicate_clusters.join(records, records.c.record_id == c.record_id))
        .where(c.cluster_id.in_(ids))
        .group_by(c.cluster_id)
    ).all()
    link = near_duplicate_links.c
    similarity = {
        cid: (low, high)
        for cid, low, high in conn.execute(
            select(c.cluster_id, func.min(link.similarity), func.max(link.similarity))
            .select_from(near_duplicate_links.join(near_duplicate_clusters, c.record_id == link.record_a))
            .where(c.cluster_id.in_(ids))
            .group_by(c.cluster_id)
        )
    }
    rows = [
        {
            "cluster_id": int(cid),
            "records": int(n),
            "representative": int(rep) if rep is not None else None,
            "batches": int(batches),
            "min_similarity": round(float(similarity.get(cid, (0.0, 0.0))[0] or 0.0), 3),
            "max_similarity": round(float(similarity.get(cid, (0.0, 0.0))[1] or 0.0), 3),
        }
        for cid, n, rep, batches in members
    ]
    return sorted(rows, key=lambda row: (-row["records"], row["cluster_id"]))
