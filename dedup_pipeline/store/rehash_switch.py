"""Set-based statements of the switch and retire steps of the rehash migration, and their audit.

The switch rewrites `records` to the new version for the first row of each
new digest; the retire moves the rows that merged under the new version to
`record_history` and drops the old version's digests. UNIQUE (hash_version,
content_hash) holds after every statement, and no statement compares digests
of two different versions.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from sqlalchemy import Connection, and_, delete, exists, func, insert, select, update

from dedup_pipeline.store.bulk import in_values
from dedup_pipeline.store.near import indexed_digest
from dedup_pipeline.store.near_graph import remove_from_index
from dedup_pipeline.store.rehash import of_record
from dedup_pipeline.store.schema import (
    SUPERSEDED_COLUMNS,
    hash_version_events,
    near_index,
    record_hashes,
    record_history,
    records,
    rehash_merged_records,
    settings,
)
from dedup_pipeline.store.warehouse import ACTIVE_HASH_VERSION, analyze


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
    own_digest = select(own.c.content_hash).where(of_record(own, target)).scalar_subquery()
    already_held = exists().where(
        of_record(own, target),
        held.c.hash_version == target,
        held.c.content_hash == own.c.content_hash,
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
    s = near_index
    statement = (
        update(s)
        .where(
            exists().where(
                current.c.record_id == s.c.record_id,
                current.c.hash_version == target,
                of_record(old, source, s.c.record_id),
                indexed_digest(old.c.content_hash) == indexed_digest(s.c.content_hash),
            )
        )
        .values(
            content_hash=select(indexed_digest(current.c.content_hash))
            .where(current.c.record_id == s.c.record_id)
            .scalar_subquery()
        )
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
            records.join(mine, of_record(mine, active)).join(
                holder, and_(holder.c.hash_version == active, holder.c.content_hash == mine.c.content_hash)
            )
        )
        .where(records.c.hash_version == old, holder.c.record_id != records.c.record_id)
        .order_by(records.c.record_id)
    )
    return [(rid, into) for rid, into in conn.execute(query)]


def move_merged_to_history(
    conn: Connection,
    merged: Sequence[tuple[int, int]],
    old: str,
    active: str,
    event_id: int,
    now: datetime,
    representative: str,
    chunk: int = 5000,
) -> int:
    """Delete merged rows still under `old` (a concurrent crawl may have rewritten them) into `record_history`.

    The history row keeps the row's own key, version, digest and payload; its
    `superseded_by_batch_id` is ``retire:<old>``, and `rehash_merged_records`
    says, per row (ids only), which row it merged into and why. The rows
    leave the near-duplicate index first, and the clusters they were in are
    recomputed over the members that stay (`representative` rule).
    """
    into = dict(merged)
    moved = 0
    ids = list(into)
    for start in range(0, len(ids), chunk):
        doomed = (
            conn.execute(
                select(records.c.record_id)
                .where(in_values(conn, records.c.record_id, ids[start : start + chunk]), records.c.hash_version == old)
                .with_for_update()
            )
            .scalars()
            .all()
        )
        if not doomed:
            continue
        remove_from_index(conn, doomed, representative)
        gone = conn.execute(
            delete(records).where(in_values(conn, records.c.record_id, doomed)).returning(*SUPERSEDED_COLUMNS)
        ).all()
        conn.execute(
            insert(record_history),
            [
                {
                    "record_id": rid,
                    "natural_key": key,
                    "hash_version": version,
                    "content_hash": digest,
                    "payload": payload,
                    "valid_from": crawled,
                    "superseded_at": now,
                    "superseded_by_batch_id": f"retire:{old}",
                }
                for rid, key, version, digest, payload, crawled in gone
            ],
        )
        conn.execute(
            insert(rehash_merged_records),
            [
                {
                    "event_id": event_id,
                    "record_id": rid,
                    "merged_into_record_id": into[rid],
                    "reason": f"same {active} content as record {into[rid]}; retired with {old}",
                }
                for rid, *_ in gone
            ],
        )
        moved += len(gone)
    return moved


def drop_version_hashes(conn: Connection, version: str) -> int:
    return conn.execute(delete(record_hashes).where(record_hashes.c.hash_version == version)).rowcount


def rows_stored_under(conn: Connection, version: str) -> int:
    return conn.execute(select(func.count()).select_from(records).where(records.c.hash_version == version)).scalar_one()


def refresh_statistics(conn: Connection) -> None:
    """ANALYZE the tables a switch or retire rewrites, so the next dedup batch is planned on the new version.

    Autovacuum gets there too, but only after its next nap; a batch planned
    on statistics that still say the new version has no rows can pick a join
    that rescans every new digest per row. (The backfill's own per-record
    probes do not depend on statistics, see `of_record`.)
    """
    analyze(conn, record_hashes)
    analyze(conn, records)


# ---------------------------------------------------------------- audit


def record_event(
    conn: Connection,
    action: str,
    from_version: str,
    to_version: str,
    now: datetime,
    *,
    forced: bool,
    reason: str | None,
    run_id: str | None,
    details: dict,
    overlap_until: datetime | None = None,
) -> int:
    return conn.execute(
        insert(hash_version_events)
        .values(
            action=action,
            from_version=from_version,
            to_version=to_version,
            occurred_at=now,
            overlap_until=overlap_until,
            forced=forced,
            reason=reason,
            run_id=run_id,
            details=details,
        )
        .returning(hash_version_events.c.event_id)
    ).scalar_one()


def latest_event(conn: Connection, action: str, from_version: str):
    e = hash_version_events
    return conn.execute(
        select(e).where(e.c.action == action, e.c.from_version == from_version).order_by(e.c.event_id.desc()).limit(1)
    ).one_or_none()
