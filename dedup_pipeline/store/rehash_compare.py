"""Read-only queries that compare two hash versions: distinct contents, merges and splits.

Each query compares digests of one version with digests of the same version
only (grouping by the target digest, counting distinct source digests); the
two versions meet only as two columns of the same row. Examples carry
natural keys and digests, never field values.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime

from sqlalchemy import Connection, and_, distinct, func, insert, select

from dedup_pipeline.core.exact import Decision
from dedup_pipeline.store.schema import canonical_records, dedup_decisions, record_hashes, records, rehash_comparisons

#: The decisions that write a `records` row (and its digests): what a comparison's figures depend on.
_WRITES = (Decision.NEW.value, Decision.CHANGED.value)


def _rate(distinct_count: int, total: int) -> float:
    """Collapse rate: the share of rows that are duplicates of another one (0 when there are none)."""
    return 1.0 - distinct_count / total if total else 0.0


def _collapse(total: int, distinct_source: int, distinct_target: int, prefix: str = "") -> dict:
    """Collapse rate under each version and the change (new minus old)."""
    source, target = _rate(distinct_source, total), _rate(distinct_target, total)
    return {
        f"{prefix}collapse_rate_source": source,
        f"{prefix}collapse_rate_target": target,
        f"{prefix}collapse_rate_change": target - source,
    }


def _pairs(source: str, target: str):
    """Warehouse rows with a digest under both versions: (record_id, natural_key, source digest, target digest)."""
    s, t = record_hashes.alias("s"), record_hashes.alias("t")
    return (
        select(records.c.record_id, records.c.natural_key, s.c.content_hash.label("sd"), t.c.content_hash.label("td"))
        .select_from(
            records.join(s, and_(s.c.record_id == records.c.record_id, s.c.hash_version == source)).join(
                t, and_(t.c.record_id == records.c.record_id, t.c.hash_version == target)
            )
        )
        .where(s.c.content_hash.is_not(None), t.c.content_hash.is_not(None))
        .subquery("pairs")
    )


def warehouse_figures(conn: Connection, source: str, target: str, examples: int = 10, keys_per_group: int = 5) -> dict:
    """Over stored rows hashed under both versions: distinct contents, collapse rates, groups that merge."""
    pairs = _pairs(source, target)
    rows, distinct_source, distinct_target = conn.execute(
        select(func.count(), func.count(distinct(pairs.c.sd)), func.count(distinct(pairs.c.td)))
    ).one()
    groups = (
        select(pairs.c.td, func.count().label("n"), func.count(distinct(pairs.c.sd)).label("sources"))
        .group_by(pairs.c.td)
        .having(func.count(distinct(pairs.c.sd)) > 1)
        .subquery("merges")
    )
    merge_groups, rows_in_merges = conn.execute(select(func.count(), func.coalesce(func.sum(groups.c.n), 0))).one()
    top = conn.execute(select(groups.c.td, groups.c.n).order_by(groups.c.n.desc(), groups.c.td).limit(examples)).all()
    members = defaultdict(list)
    if top:
        for td, key, sd in conn.execute(
            select(pairs.c.td, pairs.c.natural_key, pairs.c.sd)
            .where(pairs.c.td.in_([td for td, _ in top]))
            .order_by(pairs.c.td, pairs.c.record_id)
        ):
            members[td].append((key, sd))
    merge_examples = [
        {
            "target_digest": td.hex(),
            "rows": n,
            "keys": [key for key, _ in members[td][:keys_per_group]],
            "source_digests": [sd.hex() for _, sd in members[td][:keys_per_group]],
        }
        for td, n in top
    ]
    return {
        "rows_compared": rows,
        "distinct_source": distinct_source,
        "distinct_target": distinct_target,
        **_collapse(rows, distinct_source, distinct_target),
        "merge_groups": merge_groups,
        "rows_in_merge_groups": int(rows_in_merges),
        "rows_merged_away": int(rows_in_merges) - merge_groups,
        "merge_examples": merge_examples,
    }


def staged_figures(conn: Connection, source: str, target: str, examples: int = 10, keys_per_group: int = 5) -> dict:
    """Over staged lines (`canonical_records`) hashed under both versions: collapse rates and groups that split.

    A warehouse row has one digest per version, so a split (one old content,
    several new ones) only shows among the staged lines, which keep every
    version's digest of every crawled line.
    """
    c = canonical_records.c
    sd, td = c.hashes[source].as_string(), c.hashes[target].as_string()
    staged = (
        select(c.batch_id, c.line_no, c.natural_key, sd.label("sd"), td.label("td"))
        .where(sd.is_not(None), td.is_not(None))
        .subquery("staged")
    )
    lines, distinct_source, distinct_target = conn.execute(
        select(func.count(), func.count(distinct(staged.c.sd)), func.count(distinct(staged.c.td)))
    ).one()
    groups = (
        select(staged.c.sd, func.count(distinct(staged.c.td)).label("n"))
        .group_by(staged.c.sd)
        .having(func.count(distinct(staged.c.td)) > 1)
        .subquery("splits")
    )
    split_groups = conn.execute(select(func.count()).select_from(groups)).scalar_one()
    top = conn.execute(select(groups.c.sd, groups.c.n).order_by(groups.c.n.desc(), groups.c.sd).limit(examples)).all()
    members = defaultdict(dict)
    if top:
        for s_digest, key, t_digest in conn.execute(
            select(staged.c.sd, staged.c.natural_key, staged.c.td)
            .where(staged.c.sd.in_([s for s, _ in top]))
            .order_by(staged.c.sd, staged.c.batch_id, staged.c.line_no)
        ):
            members[s_digest].setdefault(t_digest, key)
    split_examples = [
        {
            "source_digest": s_digest,
            "target_digests": n,
            "keys": list(dict.fromkeys(members[s_digest].values()))[:keys_per_group],
            "digests": list(members[s_digest])[:keys_per_group],
        }
        for s_digest, n in top
    ]
    return {
        "staged_lines": lines,
        "staged_distinct_source": distinct_source,
        "staged_distinct_target": distinct_target,
        **_collapse(lines, distinct_source, distinct_target, prefix="staged_"),
        "split_groups": split_groups,
        "split_examples": split_examples,
    }


# ---------------------------------------------------------------- stored comparisons


def stored_through(conn: Connection) -> int:
    """The last decision that wrote a row (0: none): what a comparison made now has seen of the warehouse."""
    d = dedup_decisions.c
    return conn.execute(select(func.max(d.decision_id)).where(d.decision.in_(_WRITES))).scalar() or 0


def stored_since(conn: Connection, through: int) -> int:
    """Rows written (stored or changed) by decisions after `through`: what a comparison made then has not seen."""
    d = dedup_decisions.c
    return conn.execute(select(func.count()).where(d.decision_id > through, d.decision.in_(_WRITES))).scalar_one()


def store_comparison(conn: Connection, source: str, target: str, now: datetime, passed: bool, figures: dict) -> int:
    return conn.execute(
        insert(rehash_comparisons)
        .values(source_version=source, target_version=target, compared_at=now, passed=passed, figures=figures)
        .returning(rehash_comparisons.c.comparison_id)
    ).scalar_one()


def latest_comparison(conn: Connection, source: str, target: str):
    c = rehash_comparisons
    return conn.execute(
        select(c)
        .where(c.c.source_version == source, c.c.target_version == target)
        .order_by(c.c.comparison_id.desc())
        .limit(1)
    ).one_or_none()
