"""Rung 2: canonical URL, canonical fields and versioned content hashes for every good line."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from functools import partial
from itertools import islice
from pathlib import Path

from sqlalchemy import delete, select

from dedup_pipeline.core.erasure import WITHHELD
from dedup_pipeline.core.parallel import available_cpus, can_start_processes, ordered_map
from dedup_pipeline.core.records import CanonicalRecord
from dedup_pipeline.ladder.canonical_lines import COLUMNS, CanonicalLines, canonicalise_lines
from dedup_pipeline.ladder.progress import ChunkProgress, ProgressLog
from dedup_pipeline.ladder.raw import QuarantineWriter, clear_quarantine
from dedup_pipeline.ladder.settings import LadderSettings
from dedup_pipeline.landing import BatchFileError, FileDigest, TruncatedBatch, file_sha256, iter_lines
from dedup_pipeline.store import json_text
from dedup_pipeline.store.bulk import copy_rows
from dedup_pipeline.store.json_text import EncodedJson
from dedup_pipeline.store.schema import canonical_records, crawl_batches
from dedup_pipeline.store.tombstones import erased_positions
from dedup_pipeline.store.warehouse import (
    Warehouse,
    active_hash_version,
    active_url_version,
    analyze_new_batch,
    lock_batch,
    retired_hash_versions,
)

RUNG = "canonical"
#: Lines a batch needs before its chunks go to worker processes: below it, the pipeline of chunks through them
#: (pickled both ways, filling and draining) costs about what they save (`benchmarks/bench_canonical_workers.py`).
PARALLEL_FLOOR = 20_000
#: What the workers are forked with (`core.parallel.ordered_map`'s `preload`), imported once per process by its fork
#: server: the rung's pure part. The server also imports what the process's main script imports (the command line,
#: or Dagster's in a run worker), which each worker runs again as multiprocessing does: spawned, each worker imported
#: it anew, about 0.3 to 0.8 s of CPU a worker, a batch.
WORKER_PRELOAD = ("dedup_pipeline.ladder.canonical_lines",)


@dataclass
class CanonicalReport:
    batch_id: str
    records_in: int = 0
    canonical: int = 0
    quarantined: int = 0
    hash_errors: Counter = field(default_factory=Counter)  # version -> records that version could not hash
    workers: int = 1
    withheld: int = 0  # staged without their data: they name an erased subject (the exact rung decides them `erased`)

    def add(self, chunk: CanonicalLines) -> None:
        self.records_in += chunk.records_in
        self.canonical += len(chunk.rows)
        self.hash_errors.update(chunk.hash_errors)

    def as_metadata(self) -> dict:
        meta = {
            "batch_id": self.batch_id,
            "records_in": self.records_in,
            "canonical": self.canonical,
            "quarantined": self.quarantined,
            "workers": self.workers,
            "withheld": self.withheld,
        }
        meta.update({f"unhashable[{v}]": n for v, n in sorted(self.hash_errors.items())})
        return meta


@dataclass(frozen=True)
class RegisteredFile:
    path: Path
    sha256: str
    lines: int


def registered_file(warehouse: Warehouse, batch_id: str) -> RegisteredFile:
    with warehouse.engine.connect() as conn:
        row = conn.execute(
            select(crawl_batches.c.file_path, crawl_batches.c.file_sha256, crawl_batches.c.lines).where(
                crawl_batches.c.batch_id == batch_id
            )
        ).one_or_none()
    if row is None:
        raise BatchFileError(f"batch {batch_id!r} is not registered: materialise raw_crawl_batches first")
    return RegisteredFile(Path(row.file_path), row.file_sha256, row.lines)


def worker_count(settings: LadderSettings, lines: int) -> int:
    """Processes for a batch of `lines`: up to the setting (0: one per CPU), one per chunk at most.

    1 (inline) below `PARALLEL_FLOOR`, and in a process that may not start any (a Celery prefork worker).
    """
    if lines < PARALLEL_FLOOR or not can_start_processes():
        return 1
    wanted = settings.canonical_workers or available_cpus()
    return max(1, min(wanted, -(-lines // settings.chunk_size)))


def canonicalise_batch(
    warehouse: Warehouse, batch_id: str, settings: LadderSettings, progress: ProgressLog | None = None
) -> CanonicalReport:
    """Canonicalise every parsable line of a registered batch into the `canonical_records` table.

    Lines the raw rung quarantined are skipped (they are already in quarantine); lines that parse but cannot be
    canonicalised (no or invalid URL, missing natural key, active hash version not computable) are quarantined here.
    Lines are canonicalised and hashed a chunk (`settings.chunk_size`) at a time, column-wise
    (`canonicalise_lines`); a large batch's chunks are spread over worker processes (`settings.canonical_workers`)
    while this process reads the file and copies each chunk, in file order, in one statement. The rewrite is one
    transaction, so a partition is either fully replaced or untouched; a second one then analyses the new rows.
    `progress`, if given, hears how far it got as it goes (`ChunkProgress`).
    """
    registered = registered_file(warehouse, batch_id)
    path, sha = registered.path, registered.sha256
    if file_sha256(path) != sha:
        raise BatchFileError(f"batch file {path} changed since it was registered: re-materialise raw_crawl_batches")
    report = CanonicalReport(batch_id, workers=worker_count(settings, registered.lines))
    with warehouse.engine.begin() as conn:
        lock_batch(conn, batch_id)  # a second run of this partition waits, then rewrites it whole
        active = active_hash_version(conn)
        url_version = active_url_version(conn)
        retired = retired_hash_versions(conn)  # dropped by the migration: not computed again
        versions = tuple(dict.fromkeys((active, *(v for v in settings.hash_versions if v not in retired))))
        conn.execute(delete(canonical_records).where(canonical_records.c.batch_id == batch_id))
        clear_quarantine(conn, batch_id, RUNG)
        bad = QuarantineWriter(conn, batch_id, RUNG)
        read = FileDigest()
        work = partial(
            canonicalise_lines,
            batch_id=batch_id,
            versions=versions,
            active=active,
            key_fields=settings.natural_key,
            url_version=url_version,
        )
        done = ChunkProgress("canonical", registered.lines, progress)
        chunks = _line_chunks(path, read, settings.chunk_size, settings.max_line_bytes)
        for chunk in ordered_map(work, chunks, report.workers, preload=WORKER_PRELOAD):
            report.add(chunk)
            done.advance(len(chunk.rows) + len(chunk.quarantine))
            for line_no, reason, raw in chunk.quarantine:
                bad.add(line_no, reason, raw)
            erased = erased_positions(conn, _StagedRecords(chunk.rows), staged=False)
            rows = [_withheld(row, versions, url_version) if i in erased else row for i, row in enumerate(chunk.rows)]
            report.withheld += len(erased)
            copy_rows(conn, canonical_records, COLUMNS, rows, json_as_text=True)
        done.finish()
        if read.hexdigest() != sha:  # the file changed while it was read: roll everything back
            raise BatchFileError(f"batch file {path} changed while it was being read: re-materialise raw_crawl_batches")
        bad.flush()
        report.quarantined = bad.count
    with warehouse.engine.begin() as conn:  # the exact rung reads the batch back a chunk at a time in line order
        analyze_new_batch(conn, canonical_records, ("batch_id", "line_no"), report.canonical)
    return report


class _StagedRecords(Sequence):
    """Rows for `canonical_records` (`COLUMNS` order, JSON as text) seen as CanonicalRecords, decoded on demand.

    The tombstone check reads them only when the warehouse has tombstones: otherwise nothing is decoded.
    """

    def __init__(self, rows: list[tuple]) -> None:
        self.rows = rows

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, position: int) -> CanonicalRecord:
        _, line_no, natural_key, canonical_url, url_version, hashes, hash_errors, payload, _ = self.rows[position]
        return CanonicalRecord(
            line_no,
            canonical_url,
            natural_key,
            EncodedJson(payload),
            json_text.loads(hashes),
            json_text.loads(hash_errors),
            url_version=url_version,
        )


#: What a withheld staged line holds instead of its data: placeholders the canonical suite accepts, and no digest.
_WITHHELD_URL = "https://withheld.invalid/"
_NO_DIGEST = "0" * 64


def _withheld(row: tuple, versions: Sequence[str], url_version: str) -> tuple:
    """The staged row of a line that names an erased subject, with none of its data.

    Staging it (rather than leaving the line out) keeps the batch's line count whole, and the exact rung
    decides it `erased` from the mark alone, as it would have from the data.
    """
    batch_id, line_no = row[0], row[1]
    return (
        batch_id,
        line_no,
        f"withheld:{line_no}",
        _WITHHELD_URL,
        url_version,
        json_text.dumps({version: _NO_DIGEST for version in versions}),
        json_text.dumps({WITHHELD: "the line names an erased subject"}),
        "{}",
        None,
    )


def _line_chunks(path: Path, read: FileDigest, size: int, max_line_bytes: int) -> Iterator[list[tuple[int, bytes]]]:
    """(line number, raw line) pairs `size` at a time; `read` gets the bytes they came from.

    Blank lines are passed over; a truncated tail ends the batch, and over-long lines are left out: the raw
    rung has already counted or quarantined them.
    """

    def lines() -> Iterator[tuple[int, bytes]]:
        try:
            for line in iter_lines(path, read, max_line_bytes):
                if not (line.blank or line.too_long):
                    yield line.number, line.raw
        except TruncatedBatch:
            return

    source = lines()
    while chunk := list(islice(source, size)):
        yield chunk
