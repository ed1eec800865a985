"""Set-based statements of the rehash backfill: shards, pages of rows lacking a version, their digests, progress.

Shards split `records` by the first hex digit of the row's stored digest
(`records.content_hash`, under the version active when the row was
written). For each registered version a shard is one range scan on the
UNIQUE (hash_version, content_hash) index, and pages are keyset-paginated on
it, so a page costs the same at the start and at the end of a shard.

Digests of the target version are written into `record_hashes` beside the
old ones with one multi-row INSERT ... ON CONFLICT DO NOTHING per page: a
re-run (after a kill, or a whole second backfill) finds the rows already
hashed and writes nothing. No statement here compares digests of two
different versions. The switch and retire statements are in `rehash_switch`,
the comparison queries in `rehash_compare`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import (
    BigInteger,
    Connection,
    Integer,
    LargeBinary,
    String,
    Text,
    and_,
    case,
    cast,
    exists,
    func,
    literal,
    null,
    select,
    true,
)
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.sql import ColumnElement

from dedup_pipeline.core.hashing import HASH_RULES
from dedup_pipeline.store import json_text
from dedup_pipeline.store.schema import record_hashes, records
from dedup_pipeline.store.warehouse import upsert_ignore

#: Shard keys: the first hex digit of the stored digest.
SHARDS = tuple("0123456789abcdef")


def shard_range(shard: str) -> tuple[bytes, bytes | None]:
    """Digest bounds [low, high) of a shard; high is None for the last one."""
    if shard not in SHARDS:
        raise ValueError(f"unknown shard {shard!r}; shards are {', '.join(SHARDS)}")
    first = int(shard, 16)
    return bytes([first << 4]), (bytes([(first + 1) << 4]) if first < 15 else None)


def _in_shard(shard: str, digest=records.c.content_hash) -> ColumnElement:
    low, high = shard_range(shard)
    return and_(digest >= low, digest < high) if high is not None else digest >= low


def of_record(hashes, version: str, record_id=records.c.record_id) -> ColumnElement:
    """The `hashes` row of `record_id` under `version`, found through the primary key's record id.

    ``hash_version || ''`` keeps the planner off the (hash_version,
    content_hash) index for this per-record probe: right after a backfill
    page its statistics still say the new version has almost no rows, and a
    probe through that index then scans every new digest for every record.
    """
    return and_(hashes.c.record_id == record_id, hashes.c.hash_version.op("||")("") == version)


@dataclass(frozen=True)
class PendingRow:
    """One stored row to hash: its id, its position in the shard order (stored digest) and its canonical payload."""

    record_id: int
    content_hash: bytes
    payload: dict


def _lacks(target: str) -> ColumnElement:
    """The row has no `target` row in `record_hashes`: one primary-key probe per row.

    OFFSET 0 keeps PostgreSQL from rewriting the NOT EXISTS into an anti-join
    planned on statistics that the backfill itself makes stale: estimating
    one target row where there were 90,000, it materialised them and
    rescanned them for every row of the page (minutes per page). As a
    per-row subplan on the primary key the cost is fixed by the page size.
    """
    probe = select(literal(1)).select_from(record_hashes).where(of_record(record_hashes, target)).offset(0)
    return ~exists(probe)


def page_lacking(
    conn: Connection, target: str, version: str, shard: str, after: bytes | None, limit: int
) -> list[PendingRow]:
    """The next `limit` rows stored under `version` in `shard`, after digest `after`, with no `target` row yet."""
    position = records.c.content_hash > after if after is not None else true()
    query = (
        select(records.c.record_id, records.c.content_hash, cast(records.c.payload, Text))
        .where(records.c.hash_version == version, _in_shard(shard), position, _lacks(target))
        .order_by(records.c.content_hash)
        .limit(limit)
    )
    # The payload comes as JSON text, parsed here: about 10% less client CPU than the JSON type's decoding.
    return [PendingRow(rid, digest, json_text.loads(payload)) for rid, digest, payload in conn.execute(query)]


DIGEST_BYTES = 32


def write_target_hashes(
    conn: Connection, target: str, rows: Sequence[tuple[int, bytes | None, str | None]]
) -> set[int]:
    """Insert (record_id, digest, error) rows for `target`, skipping rows already there; returns the ids written.

    One statement per page. On PostgreSQL the page travels as three
    parameters: the ids and the error reasons as arrays, and the digests
    as one byte string cut into 32-byte pieces by position
    (INSERT ... SELECT FROM unnest(...) WITH ORDINALITY ON CONFLICT DO NOTHING),
    so neither side handles thousands of bind parameters or escapes
    thousands of array elements. SQLite runs the same insert as one executemany.
    """
    if not rows:
        return set()
    if conn.dialect.name == "postgresql":
        ids = [rid for rid, _, _ in rows]
        errors = [error for _, _, error in rows]
        blob = b"".join(digest or bytes(DIGEST_BYTES) for _, digest, _ in rows)
        page = (
            func.unnest(literal(ids, ARRAY(BigInteger)), literal(errors, ARRAY(Text)))
            .table_valued("record_id", "error", with_ordinality="n")
            .render_derived()
        )
        start = cast((page.c.n - 1) * DIGEST_BYTES + 1, Integer)
        digest = func.substring(literal(blob, LargeBinary), start, DIGEST_BYTES)
        statement = upsert_ignore(conn, record_hashes).from_select(
            ["record_id", "hash_version", "content_hash", "error"],
            select(
                page.c.record_id,
                literal(target, String),
                case((page.c.error.is_(None), digest), else_=null()),
                page.c.error,
            ),
        )
        return set(conn.execute(statement.returning(record_hashes.c.record_id)).scalars())
    values = [
        {"record_id": rid, "hash_version": target, "content_hash": digest, "error": error}
        for rid, digest, error in rows
    ]
    return set(conn.execute(upsert_ignore(conn, record_hashes).returning(record_hashes.c.record_id), values).scalars())


@dataclass(frozen=True)
class Progress:
    """How far a migration to one version has come, over a shard or the whole warehouse."""

    rows: int
    hashed: int
    unhashable: int

    @property
    def done(self) -> int:
        return self.hashed + self.unhashable

    @property
    def left(self) -> int:
        return self.rows - self.done


def progress(conn: Connection, target: str, shard: str | None = None, *, finished: bool = False) -> Progress:
    """Rows, rows with a `target` digest, rows `target` cannot hash; in one shard or everywhere.

    Counts only: `record_hashes` has one row per (record, version) and its
    rows go with their record, and error rows are the ones without a digest,
    so everything but the rows left is an index-only count. Rows left in a
    shard take a primary-key probe per row; `finished=True` (a run that read
    the shard to its end) skips it, since the run found none left.
    """
    if shard is None:
        rows = conn.execute(select(func.count()).select_from(records)).scalar_one()
        done, unhashable = (
            conn.execute(select(func.count()).where(*where)).scalar_one()
            for where in (
                [record_hashes.c.hash_version == target],
                [record_hashes.c.hash_version == target, record_hashes.c.content_hash.is_(None)],
            )
        )
        return Progress(rows, done - unhashable, unhashable)
    in_shard = [records.c.hash_version.in_(sorted(HASH_RULES)), _in_shard(shard)]
    rows = conn.execute(select(func.count()).select_from(records).where(*in_shard)).scalar_one()
    unhashable, _ = unhashable_rows(conn, target, shard, limit=0)
    left = (
        0
        if finished
        else conn.execute(select(func.count()).select_from(records).where(*in_shard, _lacks(target))).scalar_one()
    )
    return Progress(rows, rows - left - unhashable, unhashable)


def unhashable_rows(
    conn: Connection, target: str, shard: str | None = None, limit: int = 20
) -> tuple[int, list[tuple[str, str]]]:
    """How many rows `target` cannot hash, and (natural key, reason) of the first `limit` by key.

    Driven from the few error rows (no digest: a short range of the
    (hash_version, content_hash) index), each joined to its record by id.
    """
    where = [
        record_hashes.c.hash_version == target,
        record_hashes.c.content_hash.is_(None),
        record_hashes.c.error.is_not(None),
    ]
    if shard is not None:
        where += [records.c.hash_version.in_(sorted(HASH_RULES)), _in_shard(shard)]
    joined = record_hashes.join(records, records.c.record_id == record_hashes.c.record_id)
    total = conn.execute(select(func.count()).select_from(joined).where(*where)).scalar_one()
    if not limit:
        return total, []
    examples = conn.execute(
        select(records.c.natural_key, record_hashes.c.error)
        .select_from(joined)
        .where(*where)
        .order_by(records.c.natural_key)
        .limit(limit)
    ).all()
    return total, [(key, reason) for key, reason in examples]
