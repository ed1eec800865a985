"""The auditable decision log as structured JSON: one `dedup_decision` event per record.

Events carry the record's key, digest, hash version, decision, batch, line and
run id, never field values. They live in the `dedup_decisions` table (written
in bulk by the exact rung) and are also emitted, when the
`dedup_pipeline.decisions` logger is enabled at INFO, as one JSON line each:

    logging.getLogger("dedup_pipeline.decisions").setLevel(logging.INFO)

`dedup-pipeline decisions` prints them from the table as JSON Lines.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Iterator
from datetime import datetime

from sqlalchemy import Connection, select

from dedup_pipeline.store.schema import dedup_decisions

logger = logging.getLogger("dedup_pipeline.decisions")


def event(
    ts: datetime | str,
    natural_key,
    version,
    digest: bytes | str | None,
    decision: str,
    batch_id: str,
    line_no: int,
    run_id: str,
    **extra,
) -> dict:
    """One decision as the seeds' `dedup_decision` event."""
    return {
        "event": "dedup_decision",
        "ts": ts.isoformat() if isinstance(ts, datetime) else ts,
        "content_hash": digest.hex() if isinstance(digest, bytes) else digest,
        "hash_version": version,
        "decision": decision,
        "record_key": natural_key,
        "batch_id": batch_id,
        "line_no": line_no,
        "run_id": run_id,
        **extra,
    }


def emit(decisions: Iterable, version: str, batch_id: str, run_id: str, seen_set: str) -> None:
    """Log one JSON line per (record, decision) of a chunk, if the logger is enabled (one check per chunk)."""
    if not logger.isEnabledFor(logging.INFO):
        return
    now = datetime.now().astimezone().isoformat()
    for record, decision in decisions:
        if decision.value == "erased":  # an erased subject's key and digest are never logged again
            key = digest = None
        else:
            key, digest = record.natural_key, record.hashes[version]
        logger.info(
            json.dumps(
                event(
                    now,
                    key,
                    version,
                    digest,
                    decision.value,
                    batch_id,
                    record.line_no,
                    run_id,
                    seen_set=seen_set,
                ),
                ensure_ascii=False,
            )
        )


def runs_named(conn: Connection, run_id: str) -> list[str]:
    """The run ids of the decision log that are `run_id` or start with it (the UI shows the first 8 characters):
    `run_id` alone when it is one, else at most two."""
    d = dedup_decisions.c
    if conn.execute(select(d.run_id).where(d.run_id == run_id).limit(1)).first() is not None:
        return [run_id]
    prefix = run_id.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    query = select(d.run_id).where(d.run_id.like(f"{prefix}%", escape="\\")).distinct().limit(2)
    return list(conn.execute(query).scalars())


def iter_events(
    conn: Connection, batch_id: str | None = None, run_id: str | None = None, chunk: int = 5000
) -> Iterator[dict]:
    """Decision events from the table in order, keyset-paginated (memory bounded by `chunk`)."""
    d = dedup_decisions
    last = 0
    while True:
        query = select(d).where(d.c.decision_id > last).order_by(d.c.decision_id).limit(chunk)
        if batch_id:
            query = query.where(d.c.batch_id == batch_id)
        if run_id:
            query = query.where(d.c.run_id == run_id)
        rows = conn.execute(query).all()
        if not rows:
            return
        for row in rows:
            yield event(
                row.decided_at,
                row.natural_key,
                row.hash_version,
                row.content_hash,
                row.decision,
                row.batch_id,
                row.line_no,
                row.run_id,
            )
        last = rows[-1].decision_id
