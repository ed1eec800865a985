"""The persistent near-duplicate index (layout `near-index/2`): a row per record, bounded links, merged clusters.

`near_index` holds one row per sketched record: a compact signature, its
band keys as integer columns (each under a B-tree index of its own) and the
order of first landing. A chunk's candidates come from one statement (per
record, one probe of every band's index at once; at most `max_candidates`
of them, each once). Links are bounded: each record keeps its
`max_links` nearest earlier-landed near duplicates. Clusters are the
connected components of every verified pair, kept by merges (union-find):
a chunk relabels only the clusters it joins, and locks only those.

Nothing serialises all workers. A chunk commits its index rows before it queries, so of two racing records the later
sees the earlier; the rows a chunk changes (the links of a record, the clusters it merges) are locked row by row, in
id order (a deadlock between two workers' chunks is retried). The index identity (method, scheme, num_perm,
bands/rows, shingling, normaliser version, layout) is stored in the warehouse; an index built with other parameters
is refused rather than silently mixed.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from functools import lru_cache

import numpy as np
from sqlalchemy import (
    Connection,
    Row,
    Select,
    and_,
    delete,
    func,
    literal,
    or_,
    select,
    text,
    true,
    tuple_,
    update,
)

from dedup_pipeline.core.exact import Decision
from dedup_pipeline.core.near import (
    DEFAULT_MAX_CANDIDATES,
    DEFAULT_MAX_LINKS,
    NearDupParams,
    near_text,
    with_sketch_config,
)
from dedup_pipeline.core.records import TEXT_FIELDS
from dedup_pipeline.store.bulk import chunked, copy_rows, delete_in, in_values, insert_rows, staging_table, update_rows
from dedup_pipeline.store.schema import (
    MAX_BANDS,
    crawl_batches,
    dedup_decisions,
    near_duplicate_clusters,
    near_duplicate_links,
    near_index,
    near_pending,
    records,
    settings,
)
from dedup_pipeline.store.warehouse import read_setting, upsert_ignore, utcnow

INDEX_IDENTITY = "near_dup_index_identity"
#: The sketch settings the index was built with (`core.near.sketch_config`), which runs that leave them empty take.
INDEX_CONFIG = "near_dup_index_config"
LINK_SETTINGS = "near_dup_link_settings"
#: Names the index layout in every identity, so that an index of an earlier layout is refused by name.
LAYOUT = "near-index/2"
#: The command that rebuilds an index (every record re-sketched, linked and clustered again).
REBUILD_COMMAND = "dedup-pipeline rebuild-near-index"
# Advisory-lock classes (two-int form): claiming the index (once per rung run), and one cluster or record.
_CLAIM_LOCK = (7_301_045, 0)
_CLUSTER_LOCK_CLASS = 7_301_046
_US = 1_000_000
#: What an index row keeps of the digest of the content it sketched: enough to tell that a record's content
#: changed since (two contents agree on 16 bytes of SHA-256 with probability 2**-128), in half the bytes.
INDEXED_DIGEST_BYTES = 16


def indexed_digest(digest):
    """The part of a content digest (bytes, or a column or expression) an index row keeps and is compared by. A
    row written by an earlier version holds the whole digest: compared by its part, it matches the same content."""
    if isinstance(digest, bytes | bytearray | memoryview):
        return bytes(digest[:INDEXED_DIGEST_BYTES])
    return func.substr(digest, 1, INDEXED_DIGEST_BYTES)


class IndexMismatch(RuntimeError):
    """The warehouse's near-duplicate index was built with other parameters."""


def band_columns(bands: int) -> list:
    return [near_index.c[f"b{band}"] for band in range(bands)]


def stored_identity(conn: Connection) -> str | None:
    return read_setting(conn, INDEX_IDENTITY)


def claim_index(conn: Connection, identity: str, bands: int, config: dict | None = None) -> None:
    """Record the index identity (and `config`, the sketch settings that make it) on first use; refuse another
    identity afterwards.

    An identity of an earlier layout (no `near-index/2` in it) is refused with the command that rebuilds the index;
    another one, with the command that rebuilds it with `config`.
    """
    if bands > MAX_BANDS:
        raise ValueError(f"the warehouse index holds at most {MAX_BANDS} bands (or SimHash blocks), not {bands}")
    identity = f"{LAYOUT};{identity}"
    if conn.dialect.name == "postgresql":
        conn.execute(text("SELECT pg_advisory_xact_lock(:a, :b)"), {"a": _CLAIM_LOCK[0], "b": _CLAIM_LOCK[1]})
    conn.execute(upsert_ignore(conn, settings).values(name=INDEX_IDENTITY, value=identity, updated_at=utcnow()))
    stored = stored_identity(conn)
    if stored != identity:
        if LAYOUT not in stored:
            raise IndexMismatch(
                f"the warehouse's near-duplicate index was built by an earlier version ({stored!r}); "
                f"run `{REBUILD_COMMAND}` once to rebuild it in the current layout"
            )
        rebuild = f"{REBUILD_COMMAND} --config '{json.dumps(config)}'" if config else REBUILD_COMMAND
        raise IndexMismatch(
            f"the warehouse's near-duplicate index was built with {stored!r}, not {identity!r}; keep the original "
            f"sketch settings (the threshold may change freely), or run `{rebuild}` to rebuild it with these"
        )
    if config:  # an index claimed before its settings were kept gets them now: they make its identity
        value = json.dumps(config, sort_keys=True)
        conn.execute(upsert_ignore(conn, settings).values(name=INDEX_CONFIG, value=value, updated_at=utcnow()))


def adopt_index_settings(conn: Connection, params: NearDupParams, unset: Collection[str]) -> NearDupParams:
    """`params` with the sketch settings named in `unset` (those a run's config left empty) taken from the stored
    index, if that gives them the index's identity; else `params` as they are, which the claim then refuses with
    the rebuild that accepts them.

    An index is built with its sketch settings, and they stay with it: after `rebuild-near-index --config ...`,
    runs of the default config go on with the index as built. An index claimed before its settings were kept
    offers its bands and rows (:func:`adopt_bands`), and ``marks="strip"`` (text/2's rule) when that makes its
    identity.
    """
    stored, identity = read_setting(conn, INDEX_CONFIG), stored_identity(conn)
    if stored is None:
        adopted = _with_bands(params, identity) if {"bands", "rows"} <= set(unset) else params
        if "marks" in unset and adopted.normaliser.marks != "strip" and not _makes(adopted, identity):
            # Indexes of text/2 (every index claimed before its settings were kept) count marks as punctuation.
            stripped = _with_bands(with_sketch_config(params, {"marks": "strip"}), identity)
            return stripped if _makes(stripped, identity) else adopted
        return adopted
    taken = {"marks": "strip", **json.loads(stored)}  # a config kept before marks was a setting: text/2's rule
    taken = {name: value for name, value in taken.items() if name in unset}
    try:
        adopted = with_sketch_config(params, taken)
    except ValueError:  # settings the run's own cannot hold (bands of more permutations): another index, refused
        return params
    return adopted if _makes(adopted, identity) else params


def _makes(params: NearDupParams, identity: str | None) -> bool:
    """Whether `params` make the stored index identity `identity`."""
    return f"{LAYOUT};{params.identity()}" == identity


def adopt_bands(conn: Connection, params: NearDupParams) -> NearDupParams:
    """`params` with the bands and rows of the stored index, if one exists with the same identity but for them.

    Bands and rows are chosen for the threshold when an index is built; afterwards they are part of it, and a
    new threshold only changes which verified pairs count (`NearDupParams.threshold_warning` says when it is too
    far below the one the bands were built for).
    """
    return _with_bands(params, stored_identity(conn))


def _with_bands(params: NearDupParams, identity: str | None) -> NearDupParams:
    """:func:`adopt_bands` against the stored identity `identity`."""
    found = re.search(r";bands=(\d+);rows=(\d+);", identity or "")
    if params.method != "minhash" or found is None:
        return params
    try:
        adopted = replace(params, bands=int(found.group(1)), rows=int(found.group(2)))
    except ValueError:  # bands the params cannot hold (fewer permutations): another index, refused by the claim
        return params
    return adopted if _makes(adopted, identity) else params


def save_link_settings(conn: Connection, params: NearDupParams, max_links: int, max_candidates: int | None) -> None:
    """Keep the settings the rung links with, for what changes the index outside it (erasure, the retire step)."""
    value = json.dumps(
        {"params": params.as_dict(), "max_links": max_links, "max_candidates": max_candidates}, sort_keys=True
    )
    if read_setting(conn, LINK_SETTINGS) == value:
        return
    conn.execute(delete(settings).where(settings.c.name == LINK_SETTINGS))
    conn.execute(upsert_ignore(conn, settings).values(name=LINK_SETTINGS, value=value, updated_at=utcnow()))


def link_settings(conn: Connection, representative: str | None = None) -> tuple[NearDupParams, int, int | None]:
    """(params, max_links, max_candidates) the rung last linked with (the near rung's defaults if it never ran),
    and the `representative` rule if one is given."""
    stored = read_setting(conn, LINK_SETTINGS)
    defaults = {"params": {}, "max_links": DEFAULT_MAX_LINKS, "max_candidates": DEFAULT_MAX_CANDIDATES}
    data = json.loads(stored) if stored else defaults
    if data["params"].get("normaliser"):  # kept before marks was a setting: text/2's rule, marks stripped
        data["params"]["normaliser"] = {"marks": "strip", **data["params"]["normaliser"]}
    params = NearDupParams.from_dict(data["params"]) if data["params"] else NearDupParams()
    if representative is not None:
        params = replace(params, representative=representative)
    return params, data["max_links"], data["max_candidates"]


def drop_index(conn: Connection) -> dict[str, int]:
    """Empty the index, its links and clusters, and forget its identity (tables of the earlier layout dropped too)."""
    removed = {
        table.name: conn.execute(delete(table)).rowcount
        for table in (near_duplicate_links, near_duplicate_clusters, near_pending, near_index)
    }
    conn.execute(delete(settings).where(settings.c.name.in_([INDEX_IDENTITY, INDEX_CONFIG, LINK_SETTINGS])))
    for old in ("lsh_buckets", "minhash_signatures"):  # layout neardup/1
        conn.execute(text(f"DROP TABLE IF EXISTS {old}"))
    return removed


def batches_in_landing_order(conn: Connection) -> list[str]:
    """The batches that hold the stored records' current versions, oldest landing first."""
    query = (
        select(records.c.last_batch_id)
        .group_by(records.c.last_batch_id)
        .order_by(func.min(records.c.last_landed_at), records.c.last_batch_id)
    )
    return list(conn.execute(query).scalars())


# ---------------------------------------------------------------- the rows of the index


@dataclass
class IndexRows:
    """Index rows of some records, column-wise: what verification and ordering need of them."""

    ids: np.ndarray  # int64
    signatures: np.ndarray  # (n, width) uint8: b-bit MinHash values, or the 8 bytes of a SimHash fingerprint
    order: np.ndarray  # (n, 3) int64: first landed, first seen, key order: smaller is older
    keys: np.ndarray  # (n, bands) int32 band keys (undefined where not indexable)
    indexable: np.ndarray  # bool

    @classmethod
    def empty(cls, width: int, bands: int) -> IndexRows:
        return cls(
            np.zeros(0, np.int64),
            np.zeros((0, width), np.uint8),
            np.zeros((0, 3), np.int64),
            np.zeros((0, bands), np.int32),
            np.zeros(0, bool),
        )

    def subset(self, positions) -> IndexRows:
        return IndexRows(
            self.ids[positions],
            self.signatures[positions],
            self.order[positions],
            self.keys[positions],
            self.indexable[positions],
        )

    def concat(self, other: IndexRows) -> IndexRows:
        return IndexRows(
            *(
                np.concatenate((a, b))
                for a, b in zip(
                    (self.ids, self.signatures, self.order, self.keys, self.indexable),
                    (other.ids, other.signatures, other.order, other.keys, other.indexable),
                )
            )
        )


def key_order(natural_key: str) -> int:
    """A record's last tiebreak in landing order: a number from its natural key, the same in every run."""
    return int.from_bytes(hashlib.sha256(natural_key.encode("utf-8")).digest()[:8], "big", signed=True)


def order_of(first_landed, first_seen, natural_key: str) -> tuple[int, int, int]:
    return (int(first_landed.timestamp() * _US), int(first_seen.timestamp() * _US), key_order(natural_key))


def indexed_in_batch(conn: Connection, batch_id: str) -> int:
    """Records dated to the batch that have their index row."""
    joined = records.join(near_index, near_index.c.record_id == records.c.record_id)
    query = select(func.count()).select_from(joined).where(records.c.last_batch_id == batch_id)
    return conn.execute(query).scalar_one()


def records_to_index(conn: Connection, batch_id: str, after_id: int, limit: int, bands: int) -> list:
    """Records dated to this batch (stored or re-crawled by it) not yet indexed as they are: no index row, a row of
    other content, or a row not linked yet (its chunk stopped between its two transactions); and the records this
    batch brought first though a later batch stored them (it ran late: their index rows may be dated later than
    they landed, which the caller tells from `indexed_order`).

    Each row: record id, digest, payload (`text_fields`: what `near_text` reads of it), natural key, first seen,
    first landed (its first batch's landing), and the index row's digest, signature, band keys (`ib0`...), order
    (first landed, first seen, key order), None when it has none, and its linked flag (True when it has none).
    """
    n = near_index
    first_landed = func.coalesce(crawl_batches.c.landed_at, records.c.first_seen_at)
    query = (
        select(
            records.c.record_id,
            records.c.content_hash,
            text_fields(conn).label("payload"),
            records.c.natural_key,
            records.c.first_seen_at,
            first_landed.label("first_landed_at"),
            n.c.content_hash.label("indexed_hash"),
            n.c.signature.label("indexed_signature"),
            near_pending.c.record_id.is_(None).label("linked"),
            n.c.first_landed_us.label("indexed_landed_us"),
            n.c.first_seen_us.label("indexed_seen_us"),
            n.c.key_order.label("indexed_key_order"),
            *(column.label(f"i{column.name}") for column in band_columns(bands)),
        )
        .select_from(
            records.outerjoin(crawl_batches, crawl_batches.c.batch_id == records.c.first_batch_id)
            .outerjoin(n, n.c.record_id == records.c.record_id)
            .outerjoin(near_pending, near_pending.c.record_id == records.c.record_id)
        )
        .where(records.c.record_id > after_id)
        .order_by(records.c.record_id)
        .limit(limit)
    )
    dated = query.where(
        records.c.last_batch_id == batch_id,
        (n.c.record_id.is_(None))
        | (indexed_digest(n.c.content_hash) != indexed_digest(records.c.content_hash))
        | near_pending.c.record_id.is_not(None),
    )
    # Marked pending when the batch brought them first (`mark_redated`): few, found from `near_pending`.
    brought = query.where(
        records.c.first_batch_id == batch_id,
        records.c.last_batch_id != batch_id,
        near_pending.c.record_id.is_not(None),
    )
    rows = {row.record_id: row for part in (dated, brought) for row in conn.execute(part)}
    return [rows[rid] for rid in sorted(rows)[:limit]]


def mark_redated(conn: Connection, ids: Sequence[int]) -> None:
    """Mark the indexed records among `ids` pending: a batch that ran late brought them first, so they landed
    earlier than their index rows say, and the near rung of that batch links them again by their true age."""
    if not ids:
        return
    indexed = select(near_index.c.record_id).where(in_values(conn, near_index.c.record_id, sorted(ids)))
    conn.execute(upsert_ignore(conn, near_pending).from_select(["record_id"], indexed))


def records_after(conn: Connection, after_id: int, limit: int, batch_id: str | None = None) -> list:
    """(record id, natural key, payload) of the next `limit` records after `after_id` (of `batch_id`'s, if given)."""
    query = select(records.c.record_id, records.c.natural_key, records.c.payload).where(records.c.record_id > after_id)
    if batch_id is not None:
        query = query.where(records.c.last_batch_id == batch_id)
    return [tuple(row) for row in conn.execute(query.order_by(records.c.record_id).limit(limit))]


def current_contents(conn: Connection, ids: Sequence[int]) -> dict[int, bytes]:
    """record id -> the content digest the record holds now (records that no longer exist are absent)."""
    rows = conn.execute(
        select(records.c.record_id, records.c.content_hash).where(in_values(conn, records.c.record_id, ids))
    )
    return {record_id: bytes(digest) for record_id, digest in rows}


def write_rows(conn: Connection, rows: IndexRows, digests: Sequence[bytes], pending: bool = True) -> None:
    """Insert the index rows of `rows.ids`, or overwrite a record's row in place (staged, then one upsert),
    `pending` until linked."""
    ids = rows.ids.tolist()
    bands = rows.keys.shape[1]
    unindexed = (None,) * bands
    values = [
        (rid, indexed_digest(digest), *order, signature.tobytes(), *(keys if indexable else unindexed))
        for rid, digest, order, signature, keys, indexable in zip(
            ids, digests, rows.order.tolist(), rows.signatures, rows.keys.tolist(), rows.indexable.tolist()
        )
    ]
    columns = [
        "record_id",
        "content_hash",
        "first_landed_us",
        "first_seen_us",
        "key_order",
        "signature",
        *(f"b{b}" for b in range(bands)),
    ]
    # Staged, then upserted: two workers indexing one record at once (the same partition run twice) end with one
    # row, the later one's, never a key violation.
    stage = staging_table(conn, near_index, "near_index_stage", columns)
    copy_rows(conn, stage, columns, values)
    insert = _dialect_insert(conn)(near_index).from_select(
        columns, select(*(stage.c[c] for c in columns)).where(true())
    )
    replaced = {c: insert.excluded[c] for c in near_index.c.keys() if c != "record_id"}
    replaced.update({c: insert.excluded[c] if c in columns else None for c in replaced})  # fewer bands: NULL
    conn.execute(insert.on_conflict_do_update(index_elements=[near_index.c.record_id], set_=replaced))
    if conn.dialect.name != "postgresql":
        conn.execute(stage.delete())
    if pending:
        insert_rows(conn, upsert_ignore(conn, near_pending), [{"record_id": rid} for rid in ids])


def _dialect_insert(conn: Connection):
    if conn.dialect.name == "postgresql":
        from sqlalchemy.dialects.postgresql import insert
    else:
        from sqlalchemy.dialects.sqlite import insert
    return insert


def update_digests(conn: Connection, digests: dict[int, bytes]) -> None:
    """Re-label rows whose record holds new content with the same text (a price change): nothing else changes."""
    n = near_index
    update_rows(
        conn,
        lambda v: update(n).where(n.c.record_id == v["rid"]).values(content_hash=v["digest"]),
        {"rid": n.c.record_id.type, "digest": n.c.content_hash.type},
        sorted((rid, indexed_digest(digest)) for rid, digest in digests.items()),
    )


def mark_linked(conn: Connection, ids: Sequence[int]) -> None:
    delete_in(conn, near_pending, [near_pending.c.record_id], ids)


@lru_cache(maxsize=32)
def _rows_sql(bands: int) -> str:
    """PostgreSQL: the index rows of `:ids` in id order, each column packed into one byte string (big-endian
    integers, the signatures end to end): a few values to decode, not a row object per record."""

    def packed(value: str) -> str:
        return f"string_agg({value}, ''::bytea ORDER BY record_id)"

    columns = [
        "int8send(record_id)",
        "signature",
        "int8send(first_landed_us) || int8send(first_seen_us) || int8send(key_order)",
        " || ".join(f"int4send(coalesce(b{b}, 0))" for b in range(bands)),
        "decode(CASE WHEN b0 IS NULL THEN '00' ELSE '01' END, 'hex')",  # indexable
    ]
    return f"SELECT {', '.join(map(packed, columns))} FROM near_index WHERE record_id = ANY(:ids)"


def load_rows(conn: Connection, ids: Iterable[int], width: int, bands: int) -> IndexRows:
    """The index rows of `ids` that exist, in id order."""
    ids = sorted(set(ids))
    if not ids:
        return IndexRows.empty(width, bands)
    if conn.dialect.name == "postgresql":
        return _packed_rows(conn, ids, width, bands)
    return _selected_rows(conn, ids, width, bands)


def _packed_rows(conn: Connection, ids: list[int], width: int, bands: int) -> IndexRows:
    found, signatures, order, keys, indexable = conn.execute(text(_rows_sql(bands)), {"ids": ids}).one()
    if found is None:
        return IndexRows.empty(width, bands)
    found = np.frombuffer(found, dtype=">i8").astype(np.int64)
    return IndexRows(
        ids=found,
        signatures=np.frombuffer(signatures, dtype=np.uint8).reshape(found.size, -1).copy(),
        order=np.frombuffer(order, dtype=">i8").astype(np.int64).reshape(found.size, 3),
        keys=np.frombuffer(keys, dtype=">i4").astype(np.int32).reshape(found.size, bands),
        indexable=np.frombuffer(indexable, dtype=np.uint8).astype(bool),
    )


def _selected_rows(conn: Connection, ids: list[int], width: int, bands: int) -> IndexRows:
    n = near_index.c
    fetched = []
    for part in chunked(ids):
        fetched += conn.execute(
            select(n.record_id, n.signature, n.first_landed_us, n.first_seen_us, n.key_order, *band_columns(bands))
            .where(in_values(conn, n.record_id, part))
            .order_by(n.record_id)
        ).all()
    if not fetched:
        return IndexRows.empty(width, bands)
    fetched = [tuple(row) for row in fetched]
    indexable = np.array([row[5] is not None for row in fetched], dtype=bool)
    keys = np.zeros((len(fetched), bands), dtype=np.int64)
    if indexable.any():
        keys[indexable] = np.array([row[5:] for row, ok in zip(fetched, indexable.tolist()) if ok], dtype=np.int64)
    return IndexRows(
        ids=np.array([row[0] for row in fetched], dtype=np.int64),
        signatures=np.frombuffer(b"".join(bytes(row[1]) for row in fetched), dtype=np.uint8).reshape(len(fetched), -1),
        order=np.array([row[2:5] for row in fetched], dtype=np.int64),
        keys=keys.astype(np.int32),
        indexable=indexable,
    )


# ---------------------------------------------------------------- candidates


@lru_cache(maxsize=32)
def _candidate_sql(bands: int, limited: bool) -> str:
    """PostgreSQL: per queried record, the records sharing one of its band keys (one BitmapOr over the bands'
    indexes, so each candidate's row is read once however many bands it shares), at most `:limit` of them."""
    shares = " OR ".join(f"i.b{b} = q.b{b}" for b in range(bands))
    return (
        f"WITH q AS MATERIALIZED (SELECT record_id, {', '.join(f'b{b}' for b in range(bands))} FROM near_index "
        "WHERE record_id = ANY(:ids) AND b0 IS NOT NULL)\n"
        "SELECT array_agg(q.record_id), array_agg(t.record_id) FROM q CROSS JOIN LATERAL "
        f"(SELECT i.record_id FROM near_index i WHERE ({shares}) AND i.record_id <> q.record_id"
        f"{' LIMIT :limit' if limited else ''}) t"
    )


def candidate_pairs(
    conn: Connection, ids: Sequence[int], bands: int, max_candidates: int | None
) -> tuple[np.ndarray, set[int]]:
    """(record, other record) pairs sharing a band key, from the whole index, and the records whose candidates
    were capped.

    Each of the records `ids` meets at most `max_candidates` others (None: all), the first stored: boilerplate
    shared by many records would otherwise make every one of them meet every other. Pairs come as an (m, 2)
    array, both orders possible.
    """
    ids = sorted(set(ids))
    if not ids:
        return np.zeros((0, 2), np.int64), set()
    # One more than the cap is asked for: a record that gets it had more, and is reported capped.
    limit = max_candidates + 1 if max_candidates is not None else None
    if conn.dialect.name == "postgresql":
        mine, other = conn.execute(text(_candidate_sql(bands, limit is not None)), {"ids": ids, "limit": limit}).one()
        pairs = np.column_stack((np.array(mine or [], dtype=np.int64), np.array(other or [], dtype=np.int64)))
    else:
        pairs = np.array([tuple(row) for row in _sqlite_candidates(conn, ids, bands, limit)], dtype=np.int64).reshape(
            -1, 2
        )
    if limit is None or not len(pairs):
        return pairs, set()
    order = np.argsort(pairs[:, 0], kind="stable")  # each record's candidates stay in the order they came
    grouped = pairs[order]
    starts = np.r_[0, np.flatnonzero(np.diff(grouped[:, 0])) + 1]
    rank = np.arange(len(grouped)) - np.repeat(starts, np.diff(np.r_[starts, len(grouped)]))
    return grouped[rank < max_candidates], set(grouped[rank == max_candidates, 0].tolist())


def _sqlite_candidates(conn: Connection, ids: Sequence[int], bands: int, limit: int | None) -> list:
    """The same as the PostgreSQL statement, with a window function in place of the LATERAL LIMIT."""
    q = near_index.alias("q")
    i = near_index.alias("i")
    shares = or_(*(i.c[f"b{b}"] == q.c[f"b{b}"] for b in range(bands)))
    out: list = []
    for part in chunked(ids, 500):
        rank = func.row_number().over(partition_by=q.c.record_id, order_by=i.c.record_id).label("rank")
        hits = (
            select(q.c.record_id.label("mine"), i.c.record_id.label("other"), rank)
            .select_from(q.join(i, shares))
            .where(q.c.record_id.in_(part), q.c.b0.is_not(None), i.c.record_id != q.c.record_id)
            .subquery()
        )
        query = select(hits.c.mine, hits.c.other)
        out += conn.execute(query.where(hits.c.rank <= limit) if limit is not None else query).all()
    return out


# ---------------------------------------------------------------- links


def lock_rows(conn: Connection, ids: Sequence[int]) -> None:
    """Row locks on the index rows of `ids`, in id order (PostgreSQL): who changes a record's links holds its row."""
    if conn.dialect.name == "postgresql" and len(ids):
        conn.execute(
            select(near_index.c.record_id)
            .where(in_values(conn, near_index.c.record_id, sorted(ids)))
            .order_by(near_index.c.record_id)
            .with_for_update()
        ).all()


def add_links(conn: Connection, links: Sequence[tuple[int, int, float]], method: str, batch_id: str) -> int:
    """Insert links (earlier record, later record, similarity); a link stored already is kept. Returns the links
    inserted."""
    return insert_rows(
        conn,
        upsert_ignore(conn, near_duplicate_links),
        [{"record_a": a, "record_b": b, "similarity": s, "method": method, "batch_id": batch_id} for a, b, s in links],
    )


def prune_links(conn: Connection, owners: Sequence[int], max_links: int) -> int:
    """Keep each owner's `max_links` nearest earlier neighbours: highest similarity, then the oldest."""
    if not len(owners):
        return 0
    link, n = near_duplicate_links, near_index
    removed = 0
    for part in chunked(sorted(owners)):
        rank = func.row_number().over(
            partition_by=link.c.record_b,
            order_by=(link.c.similarity.desc(), n.c.first_landed_us, n.c.first_seen_us, n.c.key_order),
        )
        ranked = (
            select(link.c.record_a, link.c.record_b, rank.label("rank"))
            .select_from(link.join(n, n.c.record_id == link.c.record_a))
            .where(in_values(conn, link.c.record_b, part))
            .subquery()
        )
        doomed = select(ranked.c.record_a, ranked.c.record_b).where(ranked.c.rank > max_links)
        removed += conn.execute(delete(link).where(tuple_(link.c.record_a, link.c.record_b).in_(doomed))).rowcount
    return removed


def detach_links(conn: Connection, ids: Sequence[int]) -> tuple[int, set[int]]:
    """Delete every link of `ids` (either end); returns how many, and the other records that linked to them."""
    link = near_duplicate_links
    ids = sorted(set(ids))
    owners = {
        owner
        for part in chunked(ids)
        for owner in conn.execute(select(link.c.record_b).where(in_values(conn, link.c.record_a, part))).scalars()
    }
    return delete_in(conn, link, [link.c.record_a, link.c.record_b], ids), owners - set(ids)


# ---------------------------------------------------------------- clusters


def lock_clusters(conn: Connection, roots: Iterable[int]) -> None:
    """Transaction locks on clusters (a cluster id, or the id of a record in none), in id order (PostgreSQL)."""
    keys = sorted({int(root) % (1 << 31) for root in roots})
    if conn.dialect.name == "postgresql" and keys:
        conn.execute(
            text(
                "SELECT count(pg_advisory_xact_lock(:a, k)) "
                "FROM (SELECT k FROM unnest(CAST(:keys AS int[])) k ORDER BY k) o"
            ),
            {"a": _CLUSTER_LOCK_CLASS, "keys": keys},
        )


def _by_parts(conn: Connection, ids: Iterable[int], query: Callable[[list[int]], Select]) -> Iterator[Row]:
    """The rows of `query(part)` for each bounded part of the sorted distinct `ids` (one SELECT a part)."""
    for part in chunked(sorted(set(ids))):
        yield from conn.execute(query(part))


def cluster_of(conn: Connection, ids: Iterable[int]) -> dict[int, tuple[int, bool]]:
    """record id -> (cluster id, is representative), for those of `ids` in a cluster."""
    c = near_duplicate_clusters.c
    rows = _by_parts(
        conn,
        ids,
        lambda part: select(c.record_id, c.cluster_id, c.is_representative).where(in_values(conn, c.record_id, part)),
    )
    return {rid: (cid, rep) for rid, cid, rep in rows}


def locked_roots(conn: Connection, ids: Iterable[int]) -> dict[int, tuple[int, bool]]:
    """Lock the clusters of `ids` (each record's cluster, or the record itself if in none) and return their rows.

    A cluster merged away by another worker between the read and the lock shows up in the second read; its new
    cluster is locked too, until a read changes nothing.
    """
    ids = set(ids)
    held: set[int] = set()
    while True:
        current = cluster_of(conn, ids)
        roots = {current[rid][0] if rid in current else rid for rid in ids}
        if roots <= held:
            return current
        lock_clusters(conn, roots - held)
        held |= roots


def cluster_representatives(conn: Connection, cluster_ids: Iterable[int]) -> dict[int, int]:
    c = near_duplicate_clusters.c
    return dict(
        _by_parts(
            conn,
            cluster_ids,
            lambda part: select(c.cluster_id, c.record_id).where(
                in_values(conn, c.cluster_id, part), c.is_representative
            ),
        )
    )


def relabel_clusters(conn: Connection, moves: dict[int, int]) -> None:
    """Merge clusters: every member of cluster `old` joins cluster `new` (moves: old -> new)."""
    c = near_duplicate_clusters
    update_rows(
        conn,
        lambda v: update(c).where(c.c.cluster_id == v["old"]).values(cluster_id=v["new"], is_representative=False),
        {"old": c.c.cluster_id.type, "new": c.c.cluster_id.type},
        sorted(moves.items()),
    )


def add_members(conn: Connection, members: dict[int, int]) -> None:
    """New cluster rows: record -> cluster id (not representative; `set_representatives` says who is)."""
    insert_rows(
        conn,
        near_duplicate_clusters.insert(),
        [{"record_id": rid, "cluster_id": cid, "is_representative": False} for rid, cid in sorted(members.items())],
    )


def set_representatives(conn: Connection, chosen: dict[int, int]) -> None:
    """cluster id -> its representative record: that member's flag set, every other member's cleared."""
    c = near_duplicate_clusters
    update_rows(
        conn,
        lambda v: (
            update(c)
            .where(c.c.cluster_id == v["cid"], c.c.is_representative | (c.c.record_id == v["rep"]))
            .values(is_representative=(c.c.record_id == v["rep"]))
        ),
        {"cid": c.c.cluster_id.type, "rep": c.c.record_id.type},
        sorted(chosen.items()),
    )


def cluster_members(conn: Connection, cluster_ids: Iterable[int]) -> dict[int, list[int]]:
    c = near_duplicate_clusters.c
    out: dict[int, list[int]] = {}
    for cid, rid in _by_parts(
        conn, cluster_ids, lambda part: select(c.cluster_id, c.record_id).where(in_values(conn, c.cluster_id, part))
    ):
        out.setdefault(cid, []).append(rid)
    return out


def cluster_sizes(conn: Connection, cluster_ids: Iterable[int]) -> dict[int, int]:
    c = near_duplicate_clusters.c
    return dict(
        _by_parts(
            conn,
            cluster_ids,
            lambda part: (
                select(c.cluster_id, func.count()).where(in_values(conn, c.cluster_id, part)).group_by(c.cluster_id)
            ),
        )
    )


def replace_clusters(conn: Connection, members: Iterable[int], assignment: dict[int, tuple[int, bool]]) -> None:
    """Rewrite the cluster rows of `members`: record -> (cluster id, is representative)."""
    members = sorted(set(members))
    if not members:
        return
    delete_in(conn, near_duplicate_clusters, [near_duplicate_clusters.c.record_id], members)
    insert_rows(
        conn,
        near_duplicate_clusters.insert(),
        [
            {"record_id": rid, "cluster_id": cid, "is_representative": rep}
            for rid, (cid, rep) in sorted(assignment.items())
        ],
    )


def text_fields(conn: Connection):
    """The stored payload's text fields (`TEXT_FIELDS`, all `near_text` reads of it) as a JSON object.

    On PostgreSQL the server picks them out, so the rest of the payload (most of it) is neither written out as
    JSON text nor sent and decoded; elsewhere it is the payload itself.
    """
    payload = records.c.payload
    if conn.dialect.name != "postgresql":
        return payload
    fields = [part for name in TEXT_FIELDS for part in (literal(name), payload[name])]
    return func.jsonb_build_object(*fields, type_=payload.type)


def load_texts(conn: Connection, ids: Iterable[int]) -> dict[int, str]:
    """record id -> the stored record's `near_text`, in one SELECT a part."""
    r = records.c
    fields = text_fields(conn)
    rows = _by_parts(conn, ids, lambda part: select(r.record_id, fields).where(in_values(conn, r.record_id, part)))
    return {rid: near_text(payload) for rid, payload in rows}


def remove_rows(conn: Connection, ids: Sequence[int]) -> dict[str, int]:
    """Delete the index rows, links and cluster rows of `ids` (the caller recomputes what they leave)."""
    c, link = near_duplicate_clusters, near_duplicate_links
    return {
        "near_duplicate_links": delete_in(conn, link, [link.c.record_a, link.c.record_b], ids),
        "near_duplicate_clusters": delete_in(conn, c, [c.c.record_id], ids),
        "near_index": delete_in(conn, near_index, [near_index.c.record_id], ids),
        "near_pending": delete_in(conn, near_pending, [near_pending.c.record_id], ids),
    }


#: The cost PostgreSQL's planner gives a random page read during the rung's transactions (its default, 4, is
#: for spinning disks). The rung looks up a few thousand ids a chunk in tables that are meant to stay in cache
#: (see docs/scale-out.md, sizing); at the default cost the planner may scan a table instead of probing its index.
CACHED_RANDOM_PAGE_COST = 1.1


def plan_for_cached_tables(conn: Connection) -> None:
    """For the rest of this transaction, plan lookups as the index probes they should be (PostgreSQL), without JIT."""
    if conn.dialect.name == "postgresql":
        conn.execute(text(f"SET LOCAL random_page_cost = {CACHED_RANDOM_PAGE_COST}"))
        conn.execute(text("SET LOCAL jit = off"))


#: The tables a near-rung chunk writes and the next chunk's lookups read.
INDEX_TABLES = (near_index, near_pending, near_duplicate_links, near_duplicate_clusters)
#: Their ANALYZE samples 3,000 rows, not 30,000: lookups go by record id and by band keys that are nearly unique,
#: which a small sample estimates as well, and a sampled row costs `near_index` a check against each partial band
#: index's predicate (ANALYZE of a 61,000-row index: 1.2 s at the default target, 0.06 s at 10).
STATISTICS_TARGET = 10


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
