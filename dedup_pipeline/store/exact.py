"""Set-based writes of the exact rung: load the chunk's state, apply a ChunkPlan, log decisions.

Every statement covers a whole chunk (one SELECT per lookup, executemany
inserts), never a round trip per record. A chunk is one transaction; a lost
race (another worker inserted the same key or digest first) raises
`ChunkConflict` so the caller can roll back and replay the chunk.
"""

from __future__ import annotations

from collections import Counter
from datetime import datetime
from typing import Sequence

from sqlalchemy import Connection, and_, bindparam, delete, insert, select, update

from dedup_pipeline.core.policy import ChunkPlan, Decision, StoredRow
from dedup_pipeline.core.records import URL_VERSION, CanonicalRecord
from dedup_pipeline.store.schema import dedup_decisions, record_hashes, record_history, records
from dedup_pipeline.store.warehouse import as_utc, upsert_ignore


class ChunkConflict(RuntimeError):
    """Another writer changed the rows this chunk planned against; replay the chunk."""


def load_state(
    conn: Connection, chunk: Sequence[CanonicalRecord], version: str
) -> tuple[dict[str, StoredRow], set[str]]:
    """Current rows of the chunk's natural keys, and which of its digests are already stored.

    Digests are read from `record_hashes` under the active `version` only, so a
    row written under an older version (kept during a rehash migration) is
    compared by its backfilled digest of the active version, never by a digest
    of another version. A row with no digest under `version` compares unequal.
    """
    keys = sorted({record.natural_key for record in chunk})
    digests = sorted({bytes.fromhex(record.hashes[version]) for record in chunk})
    active_hash = record_hashes.alias("active_hash")
    joined = records.outerjoin(
        active_hash, and_(active_hash.c.record_id == records.c.record_id, active_hash.c.hash_version == version)
    )
    columns = (
        records.c.natural_key, records.c.record_id, active_hash.c.content_hash,
        records.c.last_landed_at, records.c.last_batch_id, records.c.last_line_no,
    )
    by_key = {
        key: StoredRow(record_id, digest.hex() if digest else "", (as_utc(landed), batch, line))
        for key, record_id, digest, landed, batch, line in conn.execute(
            select(*columns).select_from(joined).where(records.c.natural_key.in_(keys))
        )
    }
    stored = set(
        conn.execute(
            select(record_hashes.c.content_hash).where(
                record_hashes.c.hash_version == version, record_hashes.c.content_hash.in_(digests)
            )
        ).scalars()
    )
    return by_key, {digest.hex() for digest in stored}


def _row_values(record: CanonicalRecord, version: str, batch_id: str, batch_time: datetime) -> dict:
    return {
        "natural_key": record.natural_key,
        "canonical_url": record.canonical_url,
        "url_version": URL_VERSION,
        "hash_version": version,
        "content_hash": bytes.fromhex(record.hashes[version]),
        "payload": record.payload,
        "last_crawled_at": record.crawled_at or batch_time,
        "last_batch_id": batch_id,
        "last_landed_at": batch_time,
        "last_line_no": record.line_no,
    }


def _hash_rows(record_id: int, record: CanonicalRecord) -> list[dict]:
    rows = [
        {"record_id": record_id, "hash_version": v, "content_hash": bytes.fromhex(h), "error": None}
        for v, h in record.hashes.items()
    ]
    rows += [
        {"record_id": record_id, "hash_version": v, "content_hash": None, "error": reason}
        for v, reason in record.hash_errors.items()
    ]
    return rows


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
    """Write one chunk's plan; returns the decision counts. Raises ChunkConflict on a lost race."""
    if keep_history and plan.stored_superseded:
        ids = [row.record_id for row in plan.stored_superseded]
        superseded = select(
            records.c.record_id, records.c.natural_key, records.c.hash_version, records.c.content_hash,
            records.c.payload, records.c.last_crawled_at,
        ).where(records.c.record_id.in_(ids))
        conn.execute(
            insert(record_history).values(
                [
                    {
                        "record_id": rid, "natural_key": key, "hash_version": hv, "content_hash": digest,
                        "payload": payload, "valid_from": crawled, "superseded_at": now,
                        "superseded_by_batch_id": batch_id,
                    }
                    for rid, key, hv, digest, payload, crawled in conn.execute(superseded)
                ]
            )
        )

    if plan.updates:
        params = []
        for key, (record, stored) in plan.updates.items():
            values = {f"v_{name}": value for name, value in _row_values(record, version, batch_id, batch_time).items()}
            values["b_id"] = stored.record_id
            values["b_batch"], values["b_line"] = stored.order[1], stored.order[2]
            params.append(values)
        # Optimistic: the row is only updated if it still holds the version this chunk planned against.
        statement = (
            update(records)
            .where(
                and_(
                    records.c.record_id == bindparam("b_id"),
                    records.c.last_batch_id == bindparam("b_batch"),
                    records.c.last_line_no == bindparam("b_line"),
                )
            )
            .values({name[2:]: bindparam(name) for name in params[0] if name.startswith("v_")})
        )
        result = conn.execute(statement, params)
        if result.rowcount != len(params):
            raise ChunkConflict("a stored row changed while this chunk was planned")
        ids = [stored.record_id for _, stored in plan.updates.values()]
        conn.execute(delete(record_hashes).where(record_hashes.c.record_id.in_(ids)))

    inserted_ids: dict[str, int] = {}
    if plan.inserts:
        rows = []
        for record in plan.inserts.values():
            values = _row_values(record, version, batch_id, batch_time)
            values["first_seen_at"] = values["last_crawled_at"]
            values["first_batch_id"] = batch_id
            rows.append(values)
        statement = upsert_ignore(conn, records).returning(records.c.natural_key, records.c.record_id)
        inserted_ids = dict(conn.execute(statement, rows).all())
        if len(inserted_ids) != len(rows):
            raise ChunkConflict("another writer stored one of this chunk's keys or digests first")

    if keep_history and plan.chunk_superseded:
        rows = []
        for old, new in plan.chunk_superseded:
            rows.append(
                {
                    "record_id": inserted_ids.get(new.natural_key) or plan.updates[new.natural_key][1].record_id,
                    "natural_key": old.natural_key, "hash_version": version,
                    "content_hash": bytes.fromhex(old.hashes[version]), "payload": old.payload,
                    "valid_from": old.crawled_at or batch_time, "superseded_at": now,
                    "superseded_by_batch_id": batch_id,
                }
            )
        conn.execute(insert(record_history), rows)

    hash_rows = [row for key, rid in inserted_ids.items() for row in _hash_rows(rid, plan.inserts[key])]
    hash_rows += [row for record, stored in plan.updates.values() for row in _hash_rows(stored.record_id, record)]
    if hash_rows:
        conn.execute(insert(record_hashes), hash_rows)

    counts: Counter = Counter()
    decision_rows = []
    for record, decision in plan.decisions:
        counts[decision.value] += 1
        decision_rows.append(
            {
                "batch_id": batch_id, "line_no": record.line_no, "run_id": run_id,
                "natural_key": record.natural_key, "hash_version": version,
                "content_hash": bytes.fromhex(record.hashes[version]), "decision": decision.value,
                "decided_at": now,
            }
        )
    if decision_rows:
        conn.execute(insert(dedup_decisions), decision_rows)
    return counts


__all__ = ["ChunkConflict", "Decision", "apply_plan", "load_state"]
