"""Rung 2: canonical URL, canonical fields and versioned content hashes for every good line."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import Iterator

from sqlalchemy import delete, select

from dedup_pipeline.core.errors import RecordError
from dedup_pipeline.core.records import URL_VERSION, CanonicalRecord, canonicalise_records, parse_line
from dedup_pipeline.landing import BatchFileError, Fingerprint, TruncatedBatch, file_sha256, iter_lines
from dedup_pipeline.ladder.raw import QuarantineWriter, clear_quarantine
from dedup_pipeline.ladder.settings import LadderSettings
from dedup_pipeline.store.bulk import copy_rows
from dedup_pipeline.store.schema import canonical_records, crawl_batches
from dedup_pipeline.store.warehouse import Warehouse, active_hash_version, analyze_new_batch, lock_batch

RUNG = "canonical"


@dataclass
class CanonicalReport:
    batch_id: str
    records_in: int = 0
    canonical: int = 0
    quarantined: int = 0
    hash_errors: Counter = field(default_factory=Counter)  # version -> records that version could not hash

    def as_metadata(self) -> dict:
        meta = {"batch_id": self.batch_id, "records_in": self.records_in, "canonical": self.canonical,
                "quarantined": self.quarantined}
        meta.update({f"unhashable[{v}]": n for v, n in sorted(self.hash_errors.items())})
        return meta


def registered_file(warehouse: Warehouse, batch_id: str) -> tuple[Path, str]:
    with warehouse.engine.connect() as conn:
        row = conn.execute(
            select(crawl_batches.c.file_path, crawl_batches.c.file_sha256).where(crawl_batches.c.batch_id == batch_id)
        ).one_or_none()
    if row is None:
        raise BatchFileError(f"batch {batch_id!r} is not registered: materialise raw_crawl_batches first")
    return Path(row.file_path), row.file_sha256


_COLUMNS = (
    "batch_id", "line_no", "natural_key", "canonical_url", "url_version", "hashes", "hash_errors", "payload", "crawled_at",
)


def _row(batch_id: str, record: CanonicalRecord) -> tuple:
    return (
        batch_id, record.line_no, record.natural_key, record.canonical_url, URL_VERSION, record.hashes,
        record.hash_errors, record.payload, record.crawled_at,
    )


def canonicalise_batch(warehouse: Warehouse, batch_id: str, settings: LadderSettings) -> CanonicalReport:
    """Canonicalise every parsable line of a registered batch into the `canonical_records` table.

    Lines the raw rung quarantined are skipped (they are already in quarantine);
    lines that parse but cannot be canonicalised (no or invalid URL, missing
    natural key, active hash version not computable) are quarantined here.
    Lines are canonicalised and hashed a chunk (`settings.chunk_size`) at a
    time, column-wise (`canonicalise_records`), and each chunk is copied in
    one statement. One transaction, so a partition is either fully replaced
    or untouched.
    """
    path, sha = registered_file(warehouse, batch_id)
    if file_sha256(path) != sha:
        raise BatchFileError(f"batch file {path} changed since it was registered: re-materialise raw_crawl_batches")
    report = CanonicalReport(batch_id)
    with warehouse.engine.begin() as conn:
        lock_batch(conn, batch_id)  # a second run of this partition waits, then rewrites it whole
        active = active_hash_version(conn)
        versions = tuple(dict.fromkeys((active, *settings.hash_versions)))
        conn.execute(delete(canonical_records).where(canonical_records.c.batch_id == batch_id))
        clear_quarantine(conn, batch_id, RUNG)
        bad = QuarantineWriter(conn, batch_id, RUNG)
        read = Fingerprint()
        lines = _parsed_lines(path, read)
        while chunk := list(islice(lines, settings.chunk_size)):
            rows: list[tuple] = []
            results = canonicalise_records(
                [record for _, _, record in chunk], [line_no for line_no, _, _ in chunk],
                versions, active, settings.natural_key,
            )
            for (line_no, raw, _), canonical in zip(chunk, results):
                report.records_in += 1
                if isinstance(canonical, RecordError):
                    bad.add(line_no, str(canonical), raw)
                    continue
                report.canonical += 1
                report.hash_errors.update(canonical.hash_errors.keys())
                rows.append(_row(batch_id, canonical))
            copy_rows(conn, canonical_records, _COLUMNS, rows)
        if read.hexdigest() != sha:  # the file changed while it was read: roll everything back
            raise BatchFileError(f"batch file {path} changed while it was being read: re-materialise raw_crawl_batches")
        bad.flush()
        report.quarantined = bad.count
    with warehouse.engine.begin() as conn:  # the exact rung reads the batch back a chunk at a time in line order
        analyze_new_batch(conn, canonical_records, ("batch_id", "line_no"), report.canonical)
    return report


def _parsed_lines(path: Path, read: Fingerprint) -> Iterator[tuple[int, bytes, dict]]:
    """Lines that parse; the raw rung has already quarantined the others. `read` gets the bytes they came from."""
    try:
        for line in iter_lines(path, read):
            try:
                yield line.number, line.raw, parse_line(line.raw)
            except RecordError:
                continue
    except TruncatedBatch:
        return
