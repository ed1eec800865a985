"""Set-based statements of the rehash migration: shard pages, target digests, progress, switch and retire.

Shards split `records` by the first hex digit of the row's stored digest
(`records.content_hash`, under the version active when the row was
written). For each registered version a shard is one range scan on the
UNIQUE (hash_version, content_hash) index, and pages are keyset-paginated on
it, so a page costs the same at the start and at the end of a shard.

Digests of the target version are written into `record_hashes` beside the
old ones with one multi-row INSERT ... ON CONFLICT DO NOTHING per page: a
re-run (after a kill, or a whole second backfill) finds the rows already
hashed and writes nothing. No statement here compares digests of two
different versions.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Sequence

from sqlalchemy import (
    BigInteger, Connection, Integer, LargeBinary, String, Text, and_, case, cast, delete, exists, func, insert, literal,
    null, select, text, true, update,
)
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.sql import ColumnElement

from dedup_pipeline.core.hashing import HASH_RULES
from dedup_pipeline.store.schema import (
    hash_version_events, minhash_signatures, record_hashes, record_history, records, rehash_comparisons,
    rehash_merged_records, settings,
)
from dedup_pipeline.store.warehouse import ACTIVE_HASH_VERSION, upsert_ignore

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


def _of_record(hashes, version: str, record_id=records.c.record_id) -> ColumnElement:
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
    probe = (
        select(literal(1))
        .select_from(record_hashes)
        .where(_of_record(record_hashes, target))
        .offset(0)
    )
    return ~exists(probe)


def page_lacking(
    conn: Connection, target: str, version: str, shard: str, after: bytes | None, limit: int
) -> list[PendingRow]:
    """The next `limit` rows stored under `version` in `shard`, after digest `after`, with no `target` row yet."""
    position = records.c.content_hash > after if after is not None else true()
    query = (
        select(records.c.record_id, records.c.content_hash, records.c.payload)
        .where(records.c.hash_version == version, _in_shard(shard), position, _lacks(target))
        .order_by(records.c.content_hash)
        .limit(limit)
    )
    return [PendingRow(*row) for row in conn.execute(query)]


DIGEST_BYTES = 32


def write_target_hashes(conn: Connection, target: str, rows: Sequence[tuple[int, bytes | None, str | None]]) -> set[int]:
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
        page = func.unnest(literal(ids, ARRAY(BigInteger)), literal(errors, ARRAY(Text))).table_valued(
            "record_id", "error", with_ordinality="n"
        ).render_derived()
        start = cast((page.c.n - 1) * DIGEST_BYTES + 1, Integer)
        digest = func.substring(literal(blob, LargeBinary), start, DIGEST_BYTES)
        statement = upsert_ignore(conn, record_hashes).from_select(
            ["record_id", "hash_version", "content_hash", "error"],
            select(
                page.c.record_id, literal(target, String),
                case((page.c.error.is_(None), digest), else_=null()), page.c.error,
            ),
        )
        return set(conn.execute(statement.returning(record_hashes.c.record_id)).scalars())
    values = [{"record_id": rid, "hash_version": target, "content_hash": digest, "error": error} for rid, digest, error in rows]
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
    left = 0 if finished else conn.execute(
        select(func.count()).select_from(records).where(*in_shard, _lacks(target))
    ).scalar_one()
    return Progress(rows, rows - left - unhashable, unhashable)


def refresh_statistics(conn: Connection) -> None:
    """ANALYZE the tables a switch or retire rewrites, so the next dedup batch is planned on the new version.

    Autovacuum gets there too, but only after its next nap; a batch planned
    on statistics that still say the new version has no rows can pick a join
    that rescans every new digest per row. (The backfill's own per-record
    probes do not depend on statistics, see `_of_record`.)
    """
    if conn.dialect.name == "postgresql":
        conn.execute(text("ANALYZE record_hashes, records"))


def unhashable_rows(conn: Connection, target: str, shard: str | None = None, limit: int = 20) -> tuple[int, list[tuple[str, str]]]:
    """How many rows `target` cannot hash, and (natural key, reason) of the first `limit` by key.

    Driven from the few error rows (no digest: a short range of the
    (hash_version, content_hash) index), each joined to its record by id.
    """
    where = [record_hashes.c.hash_version == target, record_hashes.c.content_hash.is_(None), record_hashes.c.error.is_not(None)]
    if shard is not None:
        where += [records.c.hash_version.in_(sorted(HASH_RULES)), _in_shard(shard)]
    joined = record_hashes.join(records, records.c.record_id == record_hashes.c.record_id)
    total = conn.execute(select(func.count()).select_from(joined).where(*where)).scalar_one()
    if not limit:
        return total, []
    examples = conn.execute(
        select(records.c.natural_key, record_hashes.c.error).select_from(joined).where(*where)
        .order_by(records.c.natural_key).limit(limit)
    ).all()
    return total, [(key, reason) for key, reason in examples]


# ---------------------------------------------------------------- switch

def set_active_version(conn: Connection, version: str, now: datetime) -> None:
    conn.execute(update(settings).where(settings.c.name == ACTIVE_HASH_VERSION).values(value=version, updated_at=now))


def promote_group_leaders(conn: Connection, target: str) -> int:
    """Rewrite `records` to `target` for the first row (smallest id) of each `target` digest group.

    A group whose digest a row already holds under `target` keeps that holder;
    every other row of a group (a merge under the new rule), and every row
    `target` cannot hash, keeps its old version and digest, so UNIQUE
    (hash_version, content_hash) holds at every moment.
    """
    digest = record_hashes.alias("digest")
    leaders = (
        select(func.min(digest.c.record_id))
        .where(digest.c.hash_version == target, digest.c.content_hash.is_not(None))
        .group_by(digest.c.content_hash)
    )
    own = record_hashes.alias("own")
    held = records.alias("held")
    own_digest = (
        select(own.c.content_hash)
        .where(_of_record(own, target))
        .scalar_subquery()
    )
    already_held = exists().where(
        _of_record(own, target),
        held.c.hash_version == target, held.c.content_hash == own.c.content_hash,
    )
    statement = (
        update(records)
        .where(records.c.hash_version != target, records.c.record_id.in_(leaders), ~already_held)
        .values(hash_version=target, content_hash=own_digest)
    )
    return conn.execute(statement).rowcount


def follow_sketches(conn: Connection, source: str, target: str) -> int:
    """Relabel near-duplicate sketches of promoted rows with their new digest (same payload, same sketch).

    The near rung re-sketches a row whose sketch digest differs from its
    `records` digest; a sketch made from the `source` digest of a row now
    stored under `target` is still current, so it gets the `target` label.
    """
    old = record_hashes.alias("old")
    current = records.alias("current")
    s = minhash_signatures
    statement = (
        update(s)
        .where(
            exists().where(
                current.c.record_id == s.c.record_id, current.c.hash_version == target,
                _of_record(old, source, s.c.record_id), old.c.content_hash == s.c.content_hash,
            )
        )
        .values(content_hash=select(current.c.content_hash).where(current.c.record_id == s.c.record_id).scalar_subquery())
    )
    return conn.execute(statement).rowcount


# ---------------------------------------------------------------- retire

def merged_rows(conn: Connection, old: str, active: str) -> list[tuple[int, int]]:
    """(record_id, merged_into) for rows still stored under `old` whose `active` digest another row holds."""
    mine = record_hashes.alias("mine")
    holder = records.alias("holder")
    query = (
        select(records.c.record_id, holder.c.record_id)
        .select_from(
            records.join(mine, _of_record(mine, active)).join(
                holder, and_(holder.c.hash_version == active, holder.c.content_hash == mine.c.content_hash)
            )
        )
        .where(records.c.hash_version == old, holder.c.record_id != records.c.record_id)
        .order_by(records.c.record_id)
    )
    return [(rid, into) for rid, into in conn.execute(query)]


def move_merged_to_history(
    conn: Connection, merged: Sequence[tuple[int, int]], old: str, active: str, event_id: int, now: datetime,
    chunk: int = 5000,
) -> int:
    """Delete merged rows still under `old` (a concurrent crawl may have rewritten them) into `record_history`.

    The history row keeps the row's own key, version, digest and payload; its
    `superseded_by_batch_id` is ``retire:<old>``, and `rehash_merged_records`
    says, per row (ids only), which row it merged into and why.
    """
    into = dict(merged)
    moved = 0
    ids = list(into)
    for start in range(0, len(ids), chunk):
        gone = conn.execute(
            delete(records)
            .where(records.c.record_id.in_(ids[start:start + chunk]), records.c.hash_version == old)
            .returning(
                records.c.record_id, records.c.natural_key, records.c.hash_version, records.c.content_hash,
                records.c.payload, records.c.last_crawled_at,
            )
        ).all()
        if not gone:
            continue
        conn.execute(insert(record_history), [
            {"record_id": rid, "natural_key": key, "hash_version": version, "content_hash": digest, "payload": payload,
             "valid_from": crawled, "superseded_at": now, "superseded_by_batch_id": f"retire:{old}"}
            for rid, key, version, digest, payload, crawled in gone
        ])
        conn.execute(insert(rehash_merged_records), [
            {"event_id": event_id, "record_id": rid, "merged_into_record_id": into[rid],
             "reason": f"same {active} content as record {into[rid]}; retired with {old}"}
            for rid, *_ in gone
        ])
        moved += len(gone)
    return moved


def drop_version_hashes(conn: Connection, version: str) -> int:
    return conn.execute(delete(record_hashes).where(record_hashes.c.hash_version == version)).rowcount


def rows_stored_under(conn: Connection, version: str) -> int:
    return conn.execute(select(func.count()).select_from(records).where(records.c.hash_version == version)).scalar_one()


# ---------------------------------------------------------------- audit and comparisons

def record_event(
    conn: Connection, action: str, from_version: str, to_version: str, now: datetime, *, forced: bool,
    reason: str | None, run_id: str | None, details: dict, overlap_until: datetime | None = None,
) -> int:
    return conn.execute(
        insert(hash_version_events)
        .values(
            action=action, from_version=from_version, to_version=to_version, occurred_at=now,
            overlap_until=overlap_until, forced=forced, reason=reason, run_id=run_id, details=details,
        )
        .returning(hash_version_events.c.event_id)
    ).scalar_one()


def latest_event(conn: Connection, action: str, from_version: str):
    e = hash_version_events
    return conn.execute(
        select(e).where(e.c.action == action, e.c.from_version == from_version).order_by(e.c.event_id.desc()).limit(1)
    ).one_or_none()


def store_comparison(conn: Connection, source: str, target: str, now: datetime, passed: bool, figures: dict) -> int:
    return conn.execute(
        insert(rehash_comparisons)
        .values(source_version=source, target_version=target, compared_at=now, passed=passed, figures=figures)
        .returning(rehash_comparisons.c.comparison_id)
    ).scalar_one()


def latest_comparison(conn: Connection, source: str, target: str):
    c = rehash_comparisons
    return conn.execute(
        select(c).where(c.c.source_version == source, c.c.target_version == target)
        .order_by(c.c.comparison_id.desc()).limit(1)
    ).one_or_none()
