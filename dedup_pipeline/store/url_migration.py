"""Row statements of the URL-version migration (`dedup_pipeline.ladder.url_migration`).

Only rows whose key, URL or bytes can change are read: a URL with userinfo
(an "@" before its path) or an IPv6 host (a "["), and a natural key holding
one. Every other `url/1` key is already its `url/2` form.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Text, cast, delete, insert, or_, select, update

from dedup_pipeline.core.hashing import compute_hashes
from dedup_pipeline.core.records import migrated_key
from dedup_pipeline.core.url import canonical_url, userinfo_redacted
from dedup_pipeline.store.near import indexed_digest
from dedup_pipeline.store.near_graph import remove_from_index
from dedup_pipeline.store.schema import (
    canonical_records,
    dedup_decisions,
    near_index,
    quarantine,
    record_hashes,
    record_history,
    records,
)


def _may_change(*columns) -> Any:
    return or_(*(column.contains(mark) for column in columns for mark in ("@", "[")))


def migrated_payload(payload: dict, url_version: str) -> dict:
    """The payload with its `url` in `url_version` form (no userinfo)."""
    url = payload.get("url")
    if isinstance(url, str):
        return {**payload, "url": canonical_url(url, version=url_version)}
    return payload


def record_candidates(conn: Connection, url_version: str) -> list:
    """Current rows of another URL version whose URL or key may change, in id order."""
    r = records.c
    return conn.execute(
        select(
            r.record_id,
            r.natural_key,
            r.canonical_url,
            r.payload,
            r.hash_version,
            r.content_hash,
            r.last_landed_at,
            r.last_batch_id,
            r.last_line_no,
        )
        .where(r.url_version != url_version, _may_change(r.canonical_url, r.natural_key))
        .order_by(r.record_id)
        .with_for_update()
    ).all()


def key_holder(conn: Connection, natural_key: str, record_id: int):
    r = records.c
    return conn.execute(
        select(r.record_id, r.last_landed_at, r.last_batch_id, r.last_line_no).where(
            r.natural_key == natural_key, r.record_id != record_id
        )
    ).first()


def digest_holder(conn: Connection, hash_version: str, digest: bytes, record_id: int) -> int | None:
    r = records.c
    return conn.execute(
        select(r.record_id).where(r.hash_version == hash_version, r.content_hash == digest, r.record_id != record_id)
    ).scalar()


def retire_row(conn: Connection, record_id: int, tag: str, now: datetime, representative: str) -> None:
    """Move one current row to `record_history` (`superseded_by_batch_id` = `tag`), out of the near index first."""
    remove_from_index(conn, [record_id], representative)
    gone = conn.execute(
        delete(records)
        .where(records.c.record_id == record_id)
        .returning(
            records.c.natural_key,
            records.c.hash_version,
            records.c.content_hash,
            records.c.payload,
            records.c.last_crawled_at,
        )
    ).first()
    if gone is not None:
        key, version, digest, payload, crawled = gone
        conn.execute(
            insert(record_history).values(
                record_id=record_id,
                natural_key=key,
                hash_version=version,
                content_hash=digest,
                payload=payload,
                valid_from=crawled,
                superseded_at=now,
                superseded_by_batch_id=tag,
            )
        )


def rewrite_record(conn: Connection, record_id: int, values: dict, digests: dict, errors: dict) -> None:
    """Store a row's new key, URL, payload and digests (its version's in `records`, all in `record_hashes`)."""
    conn.execute(update(records).where(records.c.record_id == record_id).values(**values))
    if "content_hash" in values:
        conn.execute(
            update(near_index)
            .where(near_index.c.record_id == record_id)
            .values(content_hash=indexed_digest(values["content_hash"]))
        )
    for version in set(digests) | set(errors):
        digest = digests.get(version)
        conn.execute(
            update(record_hashes)
            .where(record_hashes.c.record_id == record_id, record_hashes.c.hash_version == version)
            .values(content_hash=bytes.fromhex(digest) if digest else None, error=errors.get(version))
        )


def stored_versions(conn: Connection, record_id: int) -> list[str]:
    return list(
        conn.execute(select(record_hashes.c.hash_version).where(record_hashes.c.record_id == record_id)).scalars()
    )


def set_url_version(conn: Connection, url_version: str) -> int:
    changed = conn.execute(update(records).where(records.c.url_version != url_version).values(url_version=url_version))
    return changed.rowcount


def rewrite_history(conn: Connection, url_version: str) -> int:
    """History rows' natural keys and payload URLs in `url_version` form (their digests stay as filed)."""
    h = record_history.c
    rows = conn.execute(
        select(h.history_id, h.natural_key, h.payload).where(_may_change(h.natural_key, cast(h.payload, Text)))
    ).all()
    changed = 0
    for history_id, key, payload in rows:
        new_key, new_payload = migrated_key(key, url_version), migrated_payload(payload, url_version)
        if (new_key, new_payload) != (key, payload):
            conn.execute(
                update(record_history)
                .where(h.history_id == history_id)
                .values(natural_key=new_key, payload=new_payload)
            )
            changed += 1
    return changed


def rewrite_decisions(conn: Connection, url_version: str) -> int:
    """Decision-log natural keys in `url_version` form."""
    d = dedup_decisions.c
    rows = conn.execute(select(d.decision_id, d.natural_key).where(_may_change(d.natural_key))).all()
    changed = 0
    for decision_id, key in rows:
        new_key = migrated_key(key, url_version)
        if new_key != key:
            conn.execute(update(dedup_decisions).where(d.decision_id == decision_id).values(natural_key=new_key))
            changed += 1
    return changed


def rewrite_staged(conn: Connection, url_version: str) -> int:
    """Staged rows of another URL version: key, URL, payload and digests in `url_version` form."""
    c = canonical_records.c
    rows = conn.execute(
        select(c.batch_id, c.line_no, c.natural_key, c.canonical_url, c.payload, c.hashes, c.hash_errors).where(
            c.url_version != url_version, _may_change(c.canonical_url, c.natural_key)
        )
    ).all()
    changed = 0
    for batch_id, line_no, key, url, payload, hashes, hash_errors in rows:
        new_url = canonical_url(url, version=url_version)
        new_payload = migrated_payload(payload, url_version)
        digests, errors = compute_hashes(new_payload, sorted({*hashes, *hash_errors}))
        conn.execute(
            update(canonical_records)
            .where(c.batch_id == batch_id, c.line_no == line_no)
            .values(
                natural_key=migrated_key(key, url_version),
                canonical_url=new_url,
                payload=new_payload,
                hashes=digests,
                hash_errors=errors,
            )
        )
        changed += 1
    conn.execute(update(canonical_records).where(c.url_version != url_version).values(url_version=url_version))
    return changed


def _quarantined(conn: Connection, page: int = 1000) -> Iterator[list]:
    q = quarantine.c
    after: tuple[str, int] = ("", -1)
    while True:
        rows = conn.execute(
            select(q.batch_id, q.line_no, q.raw_line)
            .where(or_(q.batch_id > after[0], (q.batch_id == after[0]) & (q.line_no > after[1])))
            .order_by(q.batch_id, q.line_no)
            .limit(page)
        ).all()
        if not rows:
            return
        yield rows
        after = (rows[-1].batch_id, rows[-1].line_no)


def redact_quarantine(conn: Connection) -> int:
    """Drop the userinfo of every URL in quarantined raw lines (lines quarantined by code older than `url/2`)."""
    changed = 0
    for rows in _quarantined(conn):
        for batch_id, line_no, raw in rows:
            redacted = userinfo_redacted(bytes(raw))
            if redacted != bytes(raw):
                conn.execute(
                    update(quarantine)
                    .where(quarantine.c.batch_id == batch_id, quarantine.c.line_no == line_no)
                    .values(raw_line=redacted)
                )
                changed += 1
    return changed
