"""The persistent near-duplicate index: sketches, LSH buckets, verified links and clusters.

The LSH index is a table of (band, bucket, record_id) rows indexed on
(band, bucket), so a batch's candidates come from one join whatever the size
of the warehouse, workers share it, and erasure can delete from it. The
index identity (method, scheme, num_perm, bands/rows, shingling, normaliser
version) is stored in the warehouse; an index built with other parameters is
refused rather than silently mixed.
"""

from __future__ import annotations

from typing import Iterable, Sequence

import numpy as np
from sqlalchemy import Connection, and_, delete, insert, or_, select, text

from dedup_pipeline.store.schema import (
    lsh_buckets, minhash_signatures, near_duplicate_clusters, near_duplicate_links, records, settings,
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
    """Records last written by this batch whose sketch is missing or was made from other content."""
    s = minhash_signatures
    query = (
        select(records.c.record_id, records.c.content_hash, records.c.payload)
        .select_from(records.outerjoin(s, s.c.record_id == records.c.record_id))
        .where(
            records.c.last_batch_id == batch_id,
            records.c.record_id > after_id,
            or_(s.c.record_id.is_(None), s.c.content_hash != records.c.content_hash),
        )
        .order_by(records.c.record_id)
        .limit(limit)
    )
    return conn.execute(query).all()


def replace_sketches(
    conn: Connection, identity: str, rows: Sequence, signatures: Sequence[bytes], buckets: np.ndarray, indexable: np.ndarray
) -> None:
    """Store sketches and buckets for `rows`, dropping their old sketches, buckets and links."""
    ids = [row.record_id for row in rows]
    conn.execute(delete(lsh_buckets).where(lsh_buckets.c.record_id.in_(ids)))
    conn.execute(delete(minhash_signatures).where(minhash_signatures.c.record_id.in_(ids)))
    conn.execute(
        delete(near_duplicate_links).where(
            or_(near_duplicate_links.c.record_a.in_(ids), near_duplicate_links.c.record_b.in_(ids))
        )
    )
    conn.execute(
        insert(minhash_signatures),
        [
            {"record_id": row.record_id, "index_identity": identity, "content_hash": row.content_hash, "signature": sig}
            for row, sig in zip(rows, signatures)
        ],
    )
    bucket_rows = [
        {"band": band, "bucket": int(bucket), "record_id": row.record_id}
        for row, keys, ok in zip(rows, buckets, indexable)
        if ok
        for band, bucket in enumerate(keys)
    ]
    if bucket_rows:
        conn.execute(upsert_ignore(conn, lsh_buckets), bucket_rows)


def candidate_partners(conn: Connection, ids: Sequence[int]) -> list[tuple[int, int]]:
    """(record, other record) pairs sharing at least one bucket, from every batch so far."""
    mine, other = lsh_buckets.alias("mine"), lsh_buckets.alias("other")
    query = (
        select(mine.c.record_id, other.c.record_id)
        .select_from(mine.join(other, and_(mine.c.band == other.c.band, mine.c.bucket == other.c.bucket)))
        .where(mine.c.record_id.in_(ids), other.c.record_id != mine.c.record_id)
        .distinct()
    )
    return [(a, b) for a, b in conn.execute(query)]


def load_sketches(conn: Connection, ids: Iterable[int]) -> dict[int, bytes]:
    ids = sorted(set(ids))
    if not ids:
        return {}
    query = select(minhash_signatures.c.record_id, minhash_signatures.c.signature).where(
        minhash_signatures.c.record_id.in_(ids)
    )
    return dict(conn.execute(query).all())


def add_links(conn: Connection, links: Sequence[tuple[int, int, float]], method: str, batch_id: str) -> None:
    if links:
        conn.execute(
            upsert_ignore(conn, near_duplicate_links),
            [{"record_a": a, "record_b": b, "similarity": s, "method": method, "batch_id": batch_id} for a, b, s in links],
        )


def lock_clusters(conn: Connection) -> None:
    """Serialise cluster rewrites between workers (PostgreSQL; SQLite writers are serial already)."""
    if conn.dialect.name == "postgresql":
        conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _CLUSTER_LOCK})


def component_members(conn: Connection, seeds: Iterable[int]) -> set[int]:
    """The seeds plus every record in a stored cluster with one of them."""
    seeds = set(seeds)
    if not seeds:
        return set()
    c = near_duplicate_clusters
    clusters = select(c.c.cluster_id).where(c.c.record_id.in_(sorted(seeds))).scalar_subquery()
    members = conn.execute(select(c.c.record_id).where(c.c.cluster_id.in_(clusters))).scalars()
    return seeds | set(members)


def links_among(conn: Connection, ids: Iterable[int]) -> list[tuple[int, int, float]]:
    ids = sorted(set(ids))
    if not ids:
        return []
    link = near_duplicate_links
    query = select(link.c.record_a, link.c.record_b, link.c.similarity).where(
        or_(link.c.record_a.in_(ids), link.c.record_b.in_(ids))
    )
    return [tuple(row) for row in conn.execute(query)]


def text_lengths(conn: Connection, ids: Iterable[int]) -> dict[int, int]:
    """Length of the near-duplicate text of each record (for the 'longest' representative rule)."""
    ids = sorted(set(ids))
    rows = conn.execute(select(records.c.record_id, records.c.payload).where(records.c.record_id.in_(ids)))
    return {rid: len(str(p.get("title") or "")) + len(str(p.get("description") or "")) for rid, p in rows}


def replace_clusters(conn: Connection, members: Iterable[int], assignment: dict[int, tuple[int, bool]]) -> None:
    """Rewrite the cluster rows of `members`: record -> (cluster id, is representative)."""
    members = sorted(set(members))
    if not members:
        return
    conn.execute(delete(near_duplicate_clusters).where(near_duplicate_clusters.c.record_id.in_(members)))
    if assignment:
        conn.execute(
            insert(near_duplicate_clusters),
            [{"record_id": rid, "cluster_id": cid, "is_representative": rep} for rid, (cid, rep) in sorted(assignment.items())],
        )
