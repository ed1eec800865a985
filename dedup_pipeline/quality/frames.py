"""The key columns of a batch's rows as pandas frames, for the Great Expectations suites.

Only identity columns (keys, URLs, versions, digests as hex), never payloads:
a batch's rows fit in memory, the warehouse does not have to.
"""

from __future__ import annotations

import pandas as pd
from sqlalchemy import Connection, func, select

from dedup_pipeline.ladder.canonical import RUNG as CANONICAL_RUNG
from dedup_pipeline.store.schema import canonical_records, crawl_batches, quarantine, records

CANONICAL_COLUMNS = ["line_no", "natural_key", "canonical_url", "url_version", "hash_version", "content_hash"]
RECORD_COLUMNS = ["record_id", "natural_key", "canonical_url", "url_version", "hash_version", "content_hash"]


def canonical_frame(conn: Connection, batch_id: str, active_version: str) -> pd.DataFrame:
    """One row per canonical record of the batch, with its digest under the active version (hex, or None)."""
    c = canonical_records.c
    rows = conn.execute(
        select(c.line_no, c.natural_key, c.canonical_url, c.url_version, c.hashes)
        .where(c.batch_id == batch_id)
        .order_by(c.line_no)
    )
    data = [
        (line_no, key, url, url_version, active_version, (hashes or {}).get(active_version))
        for line_no, key, url, url_version, hashes in rows
    ]
    return pd.DataFrame(data, columns=CANONICAL_COLUMNS)


def expected_canonical_rows(conn: Connection, batch_id: str) -> int | None:
    """Lines the raw rung parsed minus lines the canonical rung quarantined: nothing may go missing in between."""
    parsed = conn.execute(select(crawl_batches.c.parsed).where(crawl_batches.c.batch_id == batch_id)).scalar()
    if parsed is None:
        return None
    q = quarantine.c
    stopped = conn.execute(
        select(func.count()).select_from(quarantine).where(q.batch_id == batch_id, q.rung == CANONICAL_RUNG)
    ).scalar_one()
    return int(parsed) - int(stopped)


def records_frame(conn: Connection, batch_id: str) -> pd.DataFrame:
    """The warehouse rows dated to this batch (new, changed, or re-crawled unchanged), digests as hex."""
    r = records.c
    rows = conn.execute(
        select(r.record_id, r.natural_key, r.canonical_url, r.url_version, r.hash_version, r.content_hash)
        .where(r.last_batch_id == batch_id)
        .order_by(r.record_id)
    )
    data = [(*row[:5], row[5].hex() if row[5] is not None else None) for row in rows]
    return pd.DataFrame(data, columns=RECORD_COLUMNS)
