"""The persistent near-duplicate index: sketches, LSH buckets, verified links and clusters.

The LSH index is a table of (band, bucket, record_id) rows indexed on
(band, bucket), so a batch's candidates come from one join whatever the size
of the warehouse, workers share it, and erasure can delete from it. The
index identity (method, scheme, num_perm, bands/rows, shingling, normaliser
version) is stored in the warehouse; an index built with other parameters is
refused rather than silently mixed.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
from sqlalchemy import Connection, and_, delete, func, insert, or_, select, text, true, union

from dedup_pipeline.core.clustering import cluster_records
from dedup_pipeline.core.exact import Decision
from dedup_pipeline.store.bulk import chunked, copy_int_columns, copy_rows, delete_in, in_values
from dedup_pipeline.store.schema import (
    dedup_decisions,
    lsh_buckets,
    minhash_signatures,
    near_duplicate_clusters,
    near_duplicate_links,
    records,
    settings,
)
from dedup_pipeline.store.warehouse import read_setting, upsert_ignore, utcnow

INDEX_IDENTITY = "near_dup_index_identity"
# Any constant works; it names the lock that serialises cluster rewrites across workers.
_CLUSTER_LOCK = 7_301_042


class IndexMismatch(RuntimeError):
    """The warehouse's near-duplicate index was built with other parameters."""


def claim_index(conn: Connection, identity: str) -> None:
    """Record the index identity on first use; refuse a different one afterwards."""
    conn.execute(upsert_ignore(conn, settings).values(name=INDEX_IDENTITY, value=identity, updated_at=utcnow()))
    stored = read_setting(conn, INDEX_IDENTITY)
    if stored != identity:
        raise IndexMismatch(
            f"the warehouse's near-duplicate index was built with {stored!r}, not {identity!r}; "
            "keep the original parameters or rebuild the index"
        )


def records_to_index(conn: Connection, batch_id: str, after_id: int, limit: int) -> list:
    """Records dated to this batch (stored or re-crawled by it) whose sketch is missing or made from other content."""
    s = minhash_signatures
    query = (
        select(records.c.record_id, records.c.content_hash, records.c.payload)
        # The bound on the sketches is implied by the join, but said so that their scan starts at the page,
        # not at the first record ever sketched.
        .select_from(records.outerjoin(s, and_(s.c.record_id == records.c.record_id, s.c.record_id > after_id)))
        .where(
            records.c.last_batch_id == batch_id,
            records.c.record_id > after_id,
            or_(s.c.record_id.is_(None), s.c.content_hash != records.c.content_hash),
        )
        .order_by(records.c.record_id)
        .limit(limit)
    )
    return conn.execute(query).all()


def current_contents(conn: Connection, ids: Sequence[int]) -> dict[int, bytes]:
    """record id -> the content digest the record holds now (records that no longer exist are absent)."""
    rows = conn.execute(
        select(records.c.record_id, records.c.content_hash).where(in_values(conn, records.c.record_id, ids))
    )
    return {record_id: bytes(digest) for record_id, digest in rows}


def replace_sketches(
    conn: Connection,
    identity: str,
    rows: Sequence,
    signatures: Sequence[bytes],
    buckets: np.ndarray,
    indexable: np.ndarray,
) -> None:
    """Store sketches and buckets for `rows`, dropping their old sketches, buckets and links."""
    ids = [row.record_id for row in rows]
    link = near_duplicate_links
    delete_in(conn, lsh_buckets, [lsh_buckets.c.record_id], ids)
    delete_in(conn, minhash_signatures, [minhash_signatures.c.record_id], ids)
    delete_in(conn, link, [link.c.record_a, link.c.record_b], ids)
    copy_rows(
        conn,
        minhash_signatures,
        ("record_id", "index_identity", "content_hash", "signature"),
        ((row.record_id, identity, row.content_hash, sig) for row, sig in zip(rows, signatures)),
    )
    copy_buckets(conn, ids, buckets, indexable)


def copy_buckets(conn: Connection, ids: Sequence[int], buckets: np.ndarray, indexable: np.ndarray) -> None:
    """Append the LSH rows (band, bucket, record id) of the records `ids` that can be indexed, in one bulk write."""
    indexed = np.asarray(indexable, dtype=bool)
    keys = np.asarray(buckets, dtype=np.int64)[indexed]  # (records, bands), row-major: record by record
    owners = np.asarray(ids, dtype=np.int64)[indexed]
    band = np.tile(np.arange(keys.shape[1], dtype=np.int32), len(keys))
    bucket, record_id = keys.ravel(), np.repeat(owners, keys.shape[1])
    # Rows in primary-key order: each insert lands next to the previous one in the index (see capped_lateral_query).
    order = np.lexsort((record_id, bucket, band))
    copy_int_columns(conn, lsh_buckets, {"band": band[order], "bucket": bucket[order], "record_id": record_id[order]})


def candidate_partners(
    conn: Connection, ids: Sequence[int], max_bucket_size: int | None = None
) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """(record, other record) pairs sharing at least one bucket, from every batch so far, and the capped buckets.

    A bucket holding m records yields about m^2/2 pairs (boilerplate pages all
    land in the same buckets). With ``max_bucket_size``, a record meets only
    the ``max_bucket_size`` oldest (smallest id) members of each bucket; the
    buckets that had more are returned as (band, bucket) keys. The limit of a
    bucket comes from one short index scan (the (max_bucket_size + 1)-th id in
    the bucket, found by OFFSET on the (band, bucket, record_id) key), so a
    huge bucket costs `max_bucket_size` index entries per record, not m.
    """
    if max_bucket_size is not None and conn.dialect.name == "postgresql":
        pairs, capped = set(), set()
        for mine, other, rank, band, bucket in conn.execute(capped_lateral_query(conn, ids, max_bucket_size)):
            if rank > max_bucket_size:
                capped.add((band, bucket))
            else:
                pairs.add((mine, other))
        return sorted(pairs), sorted(capped)
    query, capped_query = candidate_queries(conn, ids, max_bucket_size)
    pairs = [(a, b) for a, b in conn.execute(query)]
    if capped_query is None:
        return pairs, []
    return pairs, sorted((band, bucket) for band, bucket in conn.execute(capped_query))


def capped_lateral_query(conn: Connection, ids: Sequence[int], max_bucket_size: int):
    """PostgreSQL: per bucket key of `ids`, its `max_bucket_size` + 1 oldest members in one LATERAL index probe.

    Rows are (record, other record, rank in the bucket, band, bucket), the
    record itself left out; a row of rank `max_bucket_size` + 1 marks a capped
    bucket and is not a candidate.
    """
    # In key order, consecutive probes share the index's upper pages and often a leaf: on a large index
    # that is far fewer cache misses than probing in record order.
    keys = (
        select(lsh_buckets.c.record_id, lsh_buckets.c.band, lsh_buckets.c.bucket)
        .where(in_values(conn, lsh_buckets.c.record_id, ids))
        .order_by(lsh_buckets.c.band, lsh_buckets.c.bucket)
        .cte("keys")
    )
    inner = lsh_buckets.alias("inner")
    top = (
        select(inner.c.record_id.label("other_id"), func.row_number().over(order_by=inner.c.record_id).label("rank"))
        .where(inner.c.band == keys.c.band, inner.c.bucket == keys.c.bucket)
        .order_by(inner.c.record_id)
        .limit(max_bucket_size + 1)
        .lateral("top")
    )
    return (
        select(keys.c.record_id, top.c.other_id, top.c.rank, keys.c.band, keys.c.bucket)
        .select_from(keys.join(top, true()))
        .where(top.c.other_id != keys.c.record_id)
    )


def candidate_queries(conn: Connection, ids: Sequence[int], max_bucket_size: int | None = None):
    """The SELECTs behind :func:`candidate_partners`: (pairs query, capped-buckets query or None)."""
    mine, other = lsh_buckets.alias("mine"), lsh_buckets.alias("other")
    if max_bucket_size is None:
        query = (
            select(mine.c.record_id, other.c.record_id)
            .select_from(mine.join(other, and_(mine.c.band == other.c.band, mine.c.bucket == other.c.bucket)))
            .where(in_values(conn, mine.c.record_id, ids), other.c.record_id != mine.c.record_id)
            .distinct()
        )
        return query, None
    inner = lsh_buckets.alias("inner")
    first_excluded = (
        select(inner.c.record_id)
        .where(inner.c.band == lsh_buckets.c.band, inner.c.bucket == lsh_buckets.c.bucket)
        .order_by(inner.c.record_id)
        .offset(max_bucket_size)
        .limit(1)
        .scalar_subquery()
    )
    limits = (
        select(lsh_buckets.c.record_id, lsh_buckets.c.band, lsh_buckets.c.bucket, first_excluded.label("upto"))
        .where(in_values(conn, lsh_buckets.c.record_id, ids))
        .cte("limits")
        .prefix_with("MATERIALIZED", dialect="postgresql")
    )
    query = (
        select(limits.c.record_id, other.c.record_id)
        .select_from(limits.join(other, and_(limits.c.band == other.c.band, limits.c.bucket == other.c.bucket)))
        .where(
            other.c.record_id != limits.c.record_id,
            or_(limits.c.upto.is_(None), other.c.record_id < limits.c.upto),
        )
        .distinct()
    )
    # Capped when a member was left out: the first one past the cap, unless that is the record itself (it met every
    # other).
    capped = (
        select(limits.c.band, limits.c.bucket)
        .where(limits.c.upto.is_not(None), limits.c.upto != limits.c.record_id)
        .distinct()
    )
    return query, capped


def load_sketches(conn: Connection, ids: Iterable[int]) -> dict[int, bytes]:
    ids = sorted(set(ids))
    if not ids:
        return {}
    query = select(minhash_signatures.c.record_id, minhash_signatures.c.signature).where(
        in_values(conn, minhash_signatures.c.record_id, ids)
    )
    return dict(conn.execute(query).all())


def add_links(conn: Connection, links: Sequence[tuple[int, int, float]], method: str, batch_id: str) -> None:
    if links:
        conn.execute(
            upsert_ignore(conn, near_duplicate_links),
            [
                {"record_a": a, "record_b": b, "similarity": s, "method": method, "batch_id": batch_id}
                for a, b, s in links
            ],
        )


def lock_clusters(conn: Connection) -> None:
    """Serialise cluster rewrites between workers (PostgreSQL; SQLite writers are serial already)."""
    if conn.dialect.name == "postgresql":
        conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _CLUSTER_LOCK})


#: The cost PostgreSQL's planner gives a random page read during the rung's transactions (its default, 4, is
#: for spinning disks). The rung looks up a few thousand ids a chunk in tables that are meant to stay in cache
#: (see deploy/README.md, sizing); at the default cost the planner reads the whole clusters table instead of
#: probing its index, which made every chunk slower as the corpus grew.
CACHED_RANDOM_PAGE_COST = 1.1


def plan_for_cached_tables(conn: Connection) -> None:
    """For the rest of this transaction, plan lookups as the index probes they should be (PostgreSQL).

    JIT compilation is off too: a chunk's bucket join, estimated expensive on a
    fast-growing table, spent 100-200 ms compiling for a few hundred ms of work.
    """
    if conn.dialect.name == "postgresql":
        conn.execute(text(f"SET LOCAL random_page_cost = {CACHED_RANDOM_PAGE_COST}"))
        conn.execute(text("SET LOCAL jit = off"))


#: The tables a near-rung chunk writes and the next chunk's lookups read.
INDEX_TABLES = (lsh_buckets, minhash_signatures, near_duplicate_links, near_duplicate_clusters)


def component_members(conn: Connection, seeds: Iterable[int]) -> set[int]:
    """The seeds plus every record in a stored cluster with one of them."""
    seeds = set(seeds)
    if not seeds:
        return set()
    c = near_duplicate_clusters
    clusters = select(c.c.cluster_id).where(in_values(conn, c.c.record_id, sorted(seeds))).scalar_subquery()
    members = conn.execute(select(c.c.record_id).where(c.c.cluster_id.in_(clusters))).scalars()
    return seeds | set(members)


def links_among(conn: Connection, ids: Iterable[int]) -> list[tuple[int, int, float]]:
    ids = sorted(set(ids))
    if not ids:
        return []
    link = near_duplicate_links
    # A UNION of one lookup per column uses both indexes; an OR of the two is planned as a scan of every link.
    query = union(
        *(
            select(link.c.record_a, link.c.record_b, link.c.similarity).where(in_values(conn, column, ids))
            for column in (link.c.record_a, link.c.record_b)
        )
    )
    return [tuple(row) for row in conn.execute(query)]


def load_payloads(conn: Connection, ids: Iterable[int]) -> dict[int, dict]:
    """record id -> stored payload, in one SELECT."""
    ids = sorted(set(ids))
    if not ids:
        return {}
    return dict(
        conn.execute(
            select(records.c.record_id, records.c.payload).where(in_values(conn, records.c.record_id, ids))
        ).all()
    )


def text_lengths(conn: Connection, ids: Iterable[int]) -> dict[int, int]:
    """Length of the near-duplicate text of each record (for the 'longest' representative rule)."""
    return {
        rid: len(str(p.get("title") or "")) + len(str(p.get("description") or ""))
        for rid, p in load_payloads(conn, ids).items()
    }


def batch_cluster_shares(conn: Connection, batch_id: str, limit: int) -> tuple[int, list[tuple[int, int, int]]]:
    """The batch's new or changed records, and its `limit` largest clusters as (cluster id, batch members, all).

    Ids and counts only. A record counts for the batch while it holds content this batch brought (its
    decision was `new` or `changed`, and no later batch has dated it since); an unchanged re-crawl, dated to
    the batch all the same, does not. Members of this batch are counted per cluster; the cluster's whole
    size (earlier batches included) comes alongside.
    """
    c = near_duplicate_clusters
    d = dedup_decisions.c
    brought = select(d.natural_key).where(
        d.batch_id == batch_id, d.decision.in_([Decision.NEW.value, Decision.CHANGED.value])
    )
    fresh = and_(records.c.last_batch_id == batch_id, records.c.natural_key.in_(brought))
    total = conn.execute(select(func.count()).select_from(records).where(fresh)).scalar_one()
    mine = (
        select(c.c.cluster_id, func.count().label("in_batch"))
        .select_from(c.join(records, records.c.record_id == c.c.record_id))
        .where(fresh)
        .group_by(c.c.cluster_id)
        .order_by(func.count().desc(), c.c.cluster_id)
        .limit(limit)
        .subquery()
    )
    whole = (
        select(mine.c.cluster_id, mine.c.in_batch, func.count(c.c.record_id))
        .select_from(mine.join(c, c.c.cluster_id == mine.c.cluster_id))
        .group_by(mine.c.cluster_id, mine.c.in_batch)
        .order_by(mine.c.in_batch.desc(), mine.c.cluster_id)
    )
    return total, [(int(cid), int(n), int(size)) for cid, n, size in conn.execute(whole)]


def replace_clusters(conn: Connection, members: Iterable[int], assignment: dict[int, tuple[int, bool]]) -> None:
    """Rewrite the cluster rows of `members`: record -> (cluster id, is representative)."""
    members = sorted(set(members))
    if not members:
        return
    conn.execute(delete(near_duplicate_clusters).where(in_values(conn, near_duplicate_clusters.c.record_id, members)))
    if assignment:
        conn.execute(
            insert(near_duplicate_clusters),
            [
                {"record_id": rid, "cluster_id": cid, "is_representative": rep}
                for rid, (cid, rep) in sorted(assignment.items())
            ],
        )


def remove_records(conn: Connection, ids: Iterable[int], representative: str) -> tuple[dict[str, int], int]:
    """Take records out of the index before they are deleted: sketches, buckets, links, cluster rows.

    The clusters they were in are recomputed over the members that stay (a
    cluster may split, or lose its representative). Returns the rows removed
    per table and how many clusters the records were in. Erasure and the
    rehash retire step delete records through this.
    """
    plan_for_cached_tables(conn)  # the same lookups as the rung's, so the same planning
    ordered = sorted(set(ids))
    survivors = component_members(conn, ordered) - set(ordered)
    c, link = near_duplicate_clusters, near_duplicate_links
    old_clusters = {
        cid
        for part in chunked(ordered)
        for cid in conn.execute(select(c.c.cluster_id).where(in_values(conn, c.c.record_id, part))).scalars()
    }
    counts = {
        "near_duplicate_links": delete_in(conn, link, [link.c.record_a, link.c.record_b], ordered),
        "near_duplicate_clusters": delete_in(conn, c, [c.c.record_id], ordered),
        "lsh_buckets": delete_in(conn, lsh_buckets, [lsh_buckets.c.record_id], ordered),
        "minhash_signatures": delete_in(conn, minhash_signatures, [minhash_signatures.c.record_id], ordered),
    }
    if survivors:
        recluster(conn, survivors, representative)
    return counts, len(old_clusters)


def recluster(conn: Connection, members: set[int], representative: str) -> list:
    """Recompute and store the clusters of `members` and of every record linked to them.

    Returns the clusters of two or more records (`core.clustering.Cluster`);
    the members left alone get no cluster row.
    """
    links = links_among(conn, members)
    members = members | {x for a, b, _ in links for x in (a, b)}
    lengths = text_lengths(conn, members) if representative == "longest" else None
    clusters = [k for k in cluster_records(sorted(members), links, representative, lengths) if len(k.members) > 1]
    replace_clusters(
        conn, members, {rid: (k.cluster_id, rid == k.representative) for k in clusters for rid in k.members}
    )
    return clusters
