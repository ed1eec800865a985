"""The exact rung in the warehouse: read a batch's staged chunks, load a chunk's state, apply its ChunkPlan.

Every statement covers a whole chunk (one SELECT per lookup; rows written by COPY, or one staged INSERT ... SELECT /
UPDATE ... FROM), never a round trip per record. A chunk is one transaction; a lost race (another worker inserted
the same key or digest first) raises `ChunkConflict` so the caller can roll back and replay the chunk.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import replace
from datetime import datetime

from sqlalchemy import (
    Column,
    Connection,
    DateTime,
    Integer,
    Select,
    String,
    Text,
    and_,
    bindparam,
    cast,
    delete,
    func,
    insert,
    literal,
    select,
    true,
    update,
)

from dedup_pipeline.core.exact import ChunkPlan, Decision, StoredRow
from dedup_pipeline.core.history import Version, file_late_versions
from dedup_pipeline.core.records import CanonicalRecord
from dedup_pipeline.store import json_text
from dedup_pipeline.store.bulk import copy_rows, in_values, staging_table
from dedup_pipeline.store.json_text import EncodedJson
from dedup_pipeline.store.near import mark_redated
from dedup_pipeline.store.schema import (
    SUPERSEDED_COLUMNS,
    Id,
    canonical_records,
    crawl_batches,
    dedup_decisions,
    exact_rung_runs,
    quarantine,
    record_hashes,
    record_history,
    records,
)
from dedup_pipeline.store.warehouse import as_utc, upsert_ignore


class ChunkConflict(RuntimeError):
    """Another writer changed the rows this chunk planned against; replay the chunk."""


def load_state(
    conn: Connection,
    chunk: Sequence[CanonicalRecord],
    version: str,
    check_digests: Sequence[bytes] | None = None,
    batch_order: tuple | None = None,
) -> tuple[dict[str, StoredRow], dict[str, set[str]]]:
    """Current rows of the chunk's natural keys, and which digests are stored by which keys (see `plan_chunk`).

    `check_digests` limits the lookup by digest (to the seen-set's hits); the
    others are assumed new, and the UNIQUE index catches them at insert if they
    are not. A digest that one of the chunk's keys already holds (an unchanged
    re-crawl, the common case) is known to be stored without a lookup. Always
    looked up, whatever the seen-set says, for each key the chunk gives other
    content: its new digest (so that stale and ignored changes of content stored
    elsewhere are told apart from exact duplicates, as nothing is inserted to
    catch them) and the digest it leaves (another row may still hold it).

    Digests are read from `record_hashes` under the active `version` only, so a
    row written under an older version (kept during a rehash migration) is
    compared by its backfilled digest of the active version, never by a digest
    of another version. A row with no digest under `version` compares unequal.

    Given the chunk's `batch_order` (landing time, batch id), the rows stored
    from a later batch also get their first batch (`_with_first_batches`).
    """
    keys = sorted({record.natural_key for record in chunk})
    active_hash = record_hashes.alias("active_hash")
    joined = records.outerjoin(
        active_hash, and_(active_hash.c.record_id == records.c.record_id, active_hash.c.hash_version == version)
    )
    columns = (
        records.c.natural_key,
        records.c.record_id,
        active_hash.c.content_hash,
        records.c.last_landed_at,
        records.c.last_batch_id,
        records.c.last_line_no,
    )
    by_key = {
        key: StoredRow(record_id, digest.hex() if digest else "", (as_utc(landed), batch, line))
        for key, record_id, digest, landed, batch, line in conn.execute(
            select(*columns).select_from(joined).where(in_values(conn, records.c.natural_key, keys))
        )
    }
    if batch_order is not None:
        by_key = _with_first_batches(conn, by_key, batch_order)
    held = {row.content_hash for row in by_key.values() if row.content_hash}
    wanted = (
        {record.hashes[version] for record in chunk}
        if check_digests is None
        else {digest.hex() for digest in check_digests}
    )
    left: set[str] = set()
    for record in chunk:
        row = by_key.get(record.natural_key)
        if row is not None and row.content_hash != record.hashes[version]:
            wanted.add(record.hashes[version])
            left.add(row.content_hash)
    lookup = sorted(bytes.fromhex(digest) for digest in (wanted - held) | (left - {""}))
    holders: dict[str, set[str]] = {}
    for key, row in by_key.items():
        if row.content_hash:
            holders.setdefault(row.content_hash, set()).add(key)
    if lookup:
        holding = (
            select(record_hashes.c.content_hash, records.c.natural_key)
            .join(records, records.c.record_id == record_hashes.c.record_id)
            .where(record_hashes.c.hash_version == version, in_values(conn, record_hashes.c.content_hash, lookup))
        )
        for digest, key in conn.execute(holding):
            holders.setdefault(digest.hex(), set()).add(key)
    return by_key, holders


def _with_first_batches(conn: Connection, by_key: dict[str, StoredRow], batch_order: tuple) -> dict[str, StoredRow]:
    """`by_key` with `StoredRow.first` set on the rows stored from a batch landed after `batch_order`.

    Only those rows may have been first stored from a batch landed after this
    one (an out-of-order run): a batch newer than a row's last version is never
    older than its first, so the common case costs no statement. A row first
    stored from a batch that is not registered (a library caller's) keeps None.
    """
    later = sorted(row.record_id for row in by_key.values() if tuple(row.order[:2]) > tuple(batch_order))
    if not later:
        return by_key
    first_batch = records.join(crawl_batches, crawl_batches.c.batch_id == records.c.first_batch_id)
    firsts = {
        record_id: (as_utc(landed), batch_id)
        for record_id, landed, batch_id in conn.execute(
            select(records.c.record_id, crawl_batches.c.landed_at, records.c.first_batch_id)
            .select_from(first_batch)
            .where(in_values(conn, records.c.record_id, later))
        )
    }
    return {key: replace(row, first=firsts.get(row.record_id)) for key, row in by_key.items()}


def other_versions_held(conn: Connection, version: str) -> bool:
    """Whether some current rows are still stored under another hash version (a rehash migration's overlap).

    Two range probes of the (hash_version, content_hash) index, whatever the table's size.
    """
    column = records.c.hash_version
    return any(
        conn.execute(select(column).where(condition).limit(1)).first() is not None
        for condition in (column < version, column > version)
    )


#: What a re-crawl of the stored content changes: when, and by which batch and line, the row was last crawled.
_DATED_COLUMNS = ("last_crawled_at", "last_batch_id", "last_landed_at", "last_line_no")
#: What an older batch, run after the one a row was first stored from, changes: when and by which batch it was
#: first seen.
_FIRST_COLUMNS = ("first_seen_at", "first_batch_id")
_ROW_COLUMNS = (
    "natural_key",
    "canonical_url",
    "url_version",
    "hash_version",
    "content_hash",
    "payload",
    *_DATED_COLUMNS,
)
_HASH_COLUMNS = ("record_id", "hash_version", "content_hash", "error")
_HISTORY_COLUMNS = (
    "record_id",
    "natural_key",
    "hash_version",
    "content_hash",
    "payload",
    "valid_from",
    "superseded_at",
    "superseded_by_batch_id",
)
_DECISION_COLUMNS = (
    "batch_id",
    "line_no",
    "run_id",
    "natural_key",
    "hash_version",
    "content_hash",
    "decision",
    "decided_at",
)


def _row_values(record: CanonicalRecord, version: str, batch_id: str, batch_time: datetime) -> tuple:
    return (
        record.natural_key,
        record.canonical_url,
        record.url_version,
        version,
        bytes.fromhex(record.hashes[version]),
        record.payload,
        *_dated_values(record, batch_id, batch_time),
    )


def _dated_values(record: CanonicalRecord, batch_id: str, batch_time: datetime) -> tuple:
    """Values of `_DATED_COLUMNS` for a record of this batch."""
    return record.crawled_at or batch_time, batch_id, batch_time, record.line_no


def _hash_rows(record_id: int, record: CanonicalRecord) -> list[tuple]:
    rows = [(record_id, v, bytes.fromhex(h), None) for v, h in record.hashes.items()]
    rows += [(record_id, v, None, reason) for v, reason in record.hash_errors.items()]
    return rows


def _insert_new(conn: Connection, plan: ChunkPlan, version: str, batch_id: str, batch_time: datetime) -> dict[str, int]:
    """Stage the chunk's new rows, then one INSERT ... SELECT ... ON CONFLICT DO NOTHING RETURNING.

    A row holds its key's last record in the chunk, first seen at the crawl time of its first.
    """
    names = (*_ROW_COLUMNS, "first_seen_at")
    stage = staging_table(conn, records, "stage_new_records", names)
    first_seen = {key: _dated_values(first, batch_id, batch_time)[0] for key, first in plan.first_inserted.items()}
    copy_rows(
        conn,
        stage,
        names,
        (
            (*_row_values(record, version, batch_id, batch_time), first_seen[key])
            for key, record in plan.inserts.items()
        ),
    )
    moved = select(*(stage.c[name] for name in names), stage.c.last_batch_id).where(true())
    statement = (
        upsert_ignore(conn, records)
        .from_select([*names, "first_batch_id"], moved)
        .returning(records.c.natural_key, records.c.record_id)
    )
    inserted = dict(conn.execute(statement).all())
    if len(inserted) != len(plan.inserts):
        raise ChunkConflict("another writer stored one of this chunk's keys or digests first")
    return inserted


def _update_changed(conn: Connection, plan: ChunkPlan, version: str, batch_id: str, batch_time: datetime) -> None:
    """Stage the chunk's changed rows, then one UPDATE ... FROM, optimistic on the stored version.

    UNIQUE (hash_version, content_hash) is checked row by row, not at the end of the statement, so when a changed
    row takes a digest another changed row leaves (content moving between keys: B to new content, then A to B's
    old content, or a swap), the leaving rows first get a placeholder digest, in one more UPDATE ... FROM.
    """
    vacating = _vacating(plan, version)
    if vacating:
        _update_stored(
            conn,
            "stage_vacated_records",
            ("content_hash",),
            ((_placeholder_digest(stored.record_id), stored) for stored in vacating),
            len(vacating),
        )
    _update_stored(
        conn,
        "stage_changed_records",
        _ROW_COLUMNS,
        ((*_row_values(record, version, batch_id, batch_time), stored) for record, stored in plan.updates.values()),
        len(plan.updates),
    )
    ids = [stored.record_id for _, stored in plan.updates.values()]
    conn.execute(delete(record_hashes).where(in_values(conn, record_hashes.c.record_id, ids)))


def _vacating(plan: ChunkPlan, version: str) -> list[StoredRow]:
    """The stored rows of changed keys whose digest another changed key of the chunk takes."""
    taken = {record.hashes[version] for record, _ in plan.updates.values()}
    return [
        stored
        for record, stored in plan.updates.values()
        if stored.content_hash in taken and stored.content_hash != record.hashes[version]
    ]


def _placeholder_digest(record_id: int) -> bytes:
    """A digest for a row while its content moves: unique per row, and 14 bytes long, so never a real 32-byte digest."""
    return b"moving" + record_id.to_bytes(8, "big")


def _antedate(conn: Connection, plan: ChunkPlan, batch_id: str, batch_time: datetime) -> None:
    """Move the first version of rows this older batch brought (an out-of-order run) to it; the rest stays."""
    _update_stored(
        conn,
        "stage_antedated_records",
        _FIRST_COLUMNS,
        ((*_dated_values(record, batch_id, batch_time)[:2], stored) for record, stored in plan.antedated.values()),
        len(plan.antedated),
        first_too=True,
    )
    mark_redated(conn, [stored.record_id for _, stored in plan.antedated.values()])


def _date_recrawled(conn: Connection, plan: ChunkPlan, batch_id: str, batch_time: datetime) -> None:
    """Move the order and crawl time of rows this newer batch re-crawled unchanged to it; their content stays."""
    _update_stored(
        conn,
        "stage_recrawled_records",
        _DATED_COLUMNS,
        ((*_dated_values(record, batch_id, batch_time), stored) for record, stored in plan.recrawls.values()),
        len(plan.recrawls),
    )


def _update_stored(
    conn: Connection, stage_name: str, columns: Sequence[str], rows, expected: int, first_too: bool = False
) -> None:
    """Set `columns` of stored rows from staged values, in one UPDATE ... FROM, optimistic on the stored version.

    Each of `rows` is the new values of `columns` followed by the `StoredRow` planned against. A row whose
    stored version changed since (another worker got there first) is not updated, and the chunk is replayed.
    With `first_too`, so is a row whose first batch changed (another older batch antedated it first).
    """
    guard = [Column("record_id", Id), Column("old_batch_id", String(255)), Column("old_line_no", Integer)]
    if first_too:
        guard.append(Column("old_first_batch_id", String(255)))
    stage = staging_table(conn, records, stage_name, columns, extra=guard)
    copy_rows(
        conn,
        stage,
        (*columns, *(column.name for column in guard)),
        (
            (*values, stored.record_id, stored.order[1], stored.order[2], *([stored.first[1]] if first_too else []))
            for *values, stored in rows
        ),
    )
    matched = [
        records.c.record_id == stage.c.record_id,
        records.c.last_batch_id == stage.c.old_batch_id,
        records.c.last_line_no == stage.c.old_line_no,
    ]
    if first_too:
        matched.append(records.c.first_batch_id == stage.c.old_first_batch_id)
    statement = update(records).where(*matched).values({name: stage.c[name] for name in columns})
    if conn.execute(statement).rowcount != expected:
        raise ChunkConflict("a stored row changed while this chunk was planned")


def _history_of_stored(conn: Connection, plan: ChunkPlan, batch_id: str, now: datetime) -> None:
    """Copy the stored rows this chunk supersedes into history, in one INSERT ... SELECT."""
    ids = [row.record_id for row in plan.stored_superseded]
    old = select(
        *SUPERSEDED_COLUMNS,
        literal(now, DateTime(timezone=True)),
        literal(batch_id),
    ).where(in_values(conn, records.c.record_id, ids))
    conn.execute(insert(record_history).from_select(_HISTORY_COLUMNS, old))


def _history_chains(conn: Connection, plan: ChunkPlan, version: str) -> dict[str, list[Version]]:
    """The version chain (`core.history`) of each key with late records whose first batch is known, in one SELECT.

    A key's versions are its history rows, in the landing order of the batches that superseded them, then its
    current row; each was brought by the batch that superseded the one before it (the first by its first batch).
    """
    rows = {row.record_id: (key, row) for key, (row, _) in plan.late.items() if row.first is not None}
    if not rows:
        return {}
    h = record_history.c
    query = (
        select(h.history_id, h.record_id, h.content_hash, h.superseded_by_batch_id, crawl_batches.c.landed_at)
        .select_from(record_history.outerjoin(crawl_batches, crawl_batches.c.batch_id == h.superseded_by_batch_id))
        .where(in_values(conn, h.record_id, sorted(rows)), h.hash_version == version)
    )
    found: dict[int, list] = {}
    for row in conn.execute(query):
        found.setdefault(row.record_id, []).append(row)
    chains: dict[str, list[Version]] = {}
    for record_id, (key, stored) in rows.items():
        history = found.get(record_id, [])
        if any(row.landed_at is None for row in history):  # superseded by a batch no longer registered
            continue
        history.sort(key=lambda row: (as_utc(row.landed_at), row.superseded_by_batch_id, row.history_id))
        origin = (*stored.first, 0)
        chain = []
        for row in history:
            chain.append(Version(row.content_hash.hex(), origin, row.history_id, row.superseded_by_batch_id))
            origin = (as_utc(row.landed_at), row.superseded_by_batch_id, 0)
        chains[key] = [*chain, Version(stored.content_hash, origin, last=stored.order)]
    return chains


def _file_late_versions(
    conn: Connection, plan: ChunkPlan, version: str, batch_id: str, batch_time: datetime, now: datetime
) -> None:
    """File the versions this older batch brought into their keys' history, where landing order puts them."""
    inserts, moves, copies = [], {}, {}
    for key, chain in _history_chains(conn, plan, version).items():
        stored, late = plan.late[key]
        filed = file_late_versions(chain, late, (batch_time, batch_id), version)
        moves.update(filed.moves)
        if filed.current_copy is not None:
            copies[stored.record_id] = filed.current_copy
        inserts += [
            (
                stored.record_id,
                key,
                version,
                bytes.fromhex(record.hashes[version]),
                record.payload,
                record.crawled_at or batch_time,
                now,
                by,
            )
            for record, by in filed.inserts
        ]
    if copies:  # the current rows' content as crawled before: valid from its first crawl when that was its first
        r = records.c
        columns = (r.record_id, r.natural_key, r.hash_version, r.content_hash, r.payload, r.first_seen_at)
        for row in conn.execute(
            select(*columns, r.last_crawled_at).where(in_values(conn, r.record_id, sorted(copies)))
        ):
            by, first = copies[row.record_id]
            valid_from = row.first_seen_at if first else row.last_crawled_at
            inserts.append((*row[:5], valid_from, now, by))
    if inserts:
        copy_rows(conn, record_history, _HISTORY_COLUMNS, inserts)
    if moves:
        conn.execute(
            update(record_history)
            .where(record_history.c.history_id == bindparam("moved_id"))
            .values(superseded_by_batch_id=bindparam("by")),
            [{"moved_id": history_id, "by": by} for history_id, by in moves.items()],
        )


def _logged_identity(record: CanonicalRecord, decision: Decision, version: str) -> tuple:
    """(key, version, digest) for the decision log; nothing for an erased subject, whose key may be personal data."""
    if decision == Decision.ERASED:
        return None, None, None
    return record.natural_key, version, bytes.fromhex(record.hashes[version])


def apply_plan(
    conn: Connection,
    plan: ChunkPlan,
    version: str,
    batch_id: str,
    run_id: str,
    now: datetime,
    batch_time: datetime,
    keep_history: bool = True,
) -> Counter:
    """Write one chunk's plan with a handful of set-based statements; returns the decision counts.

    Raises ChunkConflict when another writer got there first (the caller rolls back and replays).
    """
    if keep_history and plan.stored_superseded:
        _history_of_stored(conn, plan, batch_id, now)
    if keep_history and plan.late:
        _file_late_versions(conn, plan, version, batch_id, batch_time, now)
    if plan.updates:
        _update_changed(conn, plan, version, batch_id, batch_time)
    if plan.recrawls:
        _date_recrawled(conn, plan, batch_id, batch_time)
    if plan.antedated:
        _antedate(conn, plan, batch_id, batch_time)
    inserted_ids = _insert_new(conn, plan, version, batch_id, batch_time) if plan.inserts else {}

    def current_id(key: str) -> int:
        return inserted_ids[key] if key in inserted_ids else plan.updates[key][1].record_id

    if keep_history and plan.chunk_superseded:
        copy_rows(
            conn,
            record_history,
            _HISTORY_COLUMNS,
            (
                (
                    current_id(new.natural_key),
                    old.natural_key,
                    version,
                    bytes.fromhex(old.hashes[version]),
                    old.payload,
                    old.crawled_at or batch_time,
                    now,
                    batch_id,
                )
                for old, new in plan.chunk_superseded
            ),
        )
    final = [*plan.inserts.values(), *(record for record, _ in plan.updates.values())]
    copy_rows(
        conn,
        record_hashes,
        _HASH_COLUMNS,
        (row for record in final for row in _hash_rows(current_id(record.natural_key), record)),
    )
    counts: Counter = Counter(decision.value for _, decision in plan.decisions)
    copy_rows(
        conn,
        dedup_decisions,
        _DECISION_COLUMNS,
        (
            (batch_id, record.line_no, run_id, *_logged_identity(record, decision, version), decision.value, now)
            for record, decision in plan.decisions
        ),
    )
    return counts


__all__ = ["ChunkConflict", "Decision", "apply_plan", "load_state", "other_versions_held"]


# ---------------------------------------------------------------- what the rung reads of a batch


def canonical_chunk_query(batch_id: str, after_line: int, chunk_size: int) -> Select:
    """The batch's next `chunk_size` canonical records after line `after_line`, in line order, JSON as text."""
    staged = canonical_records.c
    return (
        select(
            staged.line_no,
            staged.canonical_url,
            staged.natural_key,
            cast(staged.payload, Text),
            cast(staged.hashes, Text),
            cast(staged.hash_errors, Text),
            staged.crawled_at,
            staged.url_version,
        )
        .where(staged.batch_id == batch_id, staged.line_no > after_line)
        .order_by(staged.line_no)
        .limit(chunk_size)
    )


def staged_after(conn: Connection, batch_id: str, after_line: int = 0) -> int:
    """How many canonical records of the batch are staged after line `after_line`: what the exact rung has left."""
    c = canonical_records.c
    query = select(func.count()).select_from(canonical_records).where(c.batch_id == batch_id, c.line_no > after_line)
    return conn.execute(query).scalar_one()


def iter_canonical_chunks(
    conn: Connection, batch_id: str, chunk_size: int, after_line: int = 0
) -> Iterator[list[CanonicalRecord]]:
    """The batch's canonical records in file order after line `after_line`, a keyset-paginated chunk at a time.

    Payloads stay the JSON text they were stored as (`EncodedJson`): the rung
    writes them on unchanged, so decoding them would be wasted work.
    """
    last_line = after_line
    while True:
        rows = conn.execute(canonical_chunk_query(batch_id, last_line, chunk_size)).all()
        if not rows:
            return
        yield [
            CanonicalRecord(
                line_no=line_no,
                canonical_url=canonical_url,
                natural_key=natural_key,
                payload=EncodedJson(payload),
                hashes=json_text.loads(hashes),
                hash_errors=json_text.loads(hash_errors),
                crawled_at=crawled_at,
                url_version=url_version,
            )
            for line_no, canonical_url, natural_key, payload, hashes, hash_errors, crawled_at, url_version in rows
        ]
        last_line = rows[-1].line_no


def landed_at(conn: Connection, batch_id: str) -> datetime:
    """When the batch landed (its registration): what orders it against other batches."""
    landed = conn.execute(select(crawl_batches.c.landed_at).where(crawl_batches.c.batch_id == batch_id)).scalar()
    if landed is None:
        raise RuntimeError(f"batch {batch_id!r} is not registered: materialise raw_crawl_batches first")
    return as_utc(landed)


def quarantined_lines(conn: Connection, batch_id: str) -> int:
    """How many lines of the batch the raw and canonical rungs sent to quarantine."""
    return conn.execute(
        select(func.count()).select_from(quarantine).where(quarantine.c.batch_id == batch_id)
    ).scalar_one()


def decided_by_unfinished_runs(conn: Connection, batch_id: str, run_id: str) -> tuple[int, Counter]:
    """(last line, decision counts) of what runs that did not finish committed for the batch, this one included.

    A run that failed or was killed part-way (or an earlier attempt of this
    run's step) leaves the chunks it committed, each with its decisions, in
    line order: everything up to the last line decided is done, and the next
    run takes it over rather than decide those lines again as exact duplicates
    of themselves. Decisions up to the last finished run of another id (its
    `decisions_through`, or its own last decision) are that run's, and not
    taken over: a new run of a finished batch decides every line again.
    """
    d, runs = dedup_decisions.c, exact_rung_runs.c
    others = (runs.batch_id == batch_id) & (runs.run_id != run_id)
    finished_through = max(
        conn.execute(select(func.max(runs.stats["decisions_through"].as_integer())).where(others)).scalar() or 0,
        conn.execute(
            select(func.max(d.decision_id)).where(
                d.batch_id == batch_id, d.run_id.in_(select(runs.run_id).where(others))
            )
        ).scalar()
        or 0,
    )
    rows = conn.execute(
        select(d.decision, func.count(), func.max(d.line_no))
        .where(d.batch_id == batch_id, d.decision_id > finished_through)
        .group_by(d.decision)
    ).all()
    return max((last for _, _, last in rows), default=0), Counter({decision: n for decision, n, _ in rows})


def decisions_through(conn: Connection, batch_id: str) -> int:
    """The last decision id of the batch: what the run finishing now has counted."""
    d = dedup_decisions.c
    return conn.execute(select(func.max(d.decision_id)).where(d.batch_id == batch_id)).scalar() or 0


def staged_without(conn: Connection, batch_id: str, version: str) -> bool:
    """Whether some staged canonical records of the batch carry no digest of `version`: staged before the switch to it.

    (The canonical rung always hashes under the active version and quarantines what it cannot hash.)
    """
    staged = canonical_records.c
    missing = staged.hashes[version].as_string().is_(None)
    return conn.execute(select(staged.line_no).where(staged.batch_id == batch_id, missing).limit(1)).first() is not None
