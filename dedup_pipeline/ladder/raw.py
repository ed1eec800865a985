"""Rung 1: register a landing file as a crawl batch; lines that are not JSON objects go to quarantine."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import UTC, datetime

from sqlalchemy import Connection, delete, select

from dedup_pipeline.core.erasure import searchable_prefix
from dedup_pipeline.core.errors import RecordError
from dedup_pipeline.core.records import parse_line
from dedup_pipeline.core.url import userinfo_redacted
from dedup_pipeline.ladder.settings import MAX_LINE_BYTES
from dedup_pipeline.landing import BatchFile, FileDigest, TruncatedBatch, iter_lines
from dedup_pipeline.store.bulk import copy_rows
from dedup_pipeline.store.schema import crawl_batches, quarantine
from dedup_pipeline.store.tombstones import erased_raw_lines
from dedup_pipeline.store.warehouse import Warehouse, as_utc, lock_batch, upsert_ignore, utcnow

RUNG = "raw"


@dataclass
class RawReport:
    batch_id: str
    file_bytes: int
    lines: int
    parsed: int
    quarantined: int
    blank: int = 0  # empty or whitespace-only lines: counted here, never records (and not in `lines`)
    too_long: int = 0  # lines over the size limit: quarantined, their head kept
    redelivered: bool = False  # registered before with other bytes: its lines were read again
    file_sha256: str = ""  # of the bytes read: the landing sensor tells a re-delivered file by it

    @property
    def redelivery_warning(self) -> str | None:
        if not self.redelivered:
            return None
        return (
            f"batch {self.batch_id}: its file changed since it was registered (re-delivered); its lines are read "
            "again, and it keeps its landing time"
        )

    def as_metadata(self) -> dict:
        return asdict(self)


_QUARANTINE_COLUMNS = ("batch_id", "line_no", "rung", "reason", "raw_line", "quarantined_at")
#: Appended to the reason of a quarantined line whose bytes are not kept because they name an erased subject.
WITHHELD = "; raw line withheld: it names an erased subject"
#: Appended to the reason of a quarantined line kept only up to where it stops being text an erasure can search.
CUT = "; raw line kept up to byte {kept} of {length}: the rest is not UTF-8 text (an erasure could not search it)"


class QuarantineWriter:
    """Buffers quarantine rows and writes them a chunk at a time inside the caller's transaction."""

    def __init__(self, conn: Connection, batch_id: str, rung: str, chunk_size: int = 1000):
        self.conn, self.batch_id, self.rung, self.chunk_size = conn, batch_id, rung, chunk_size
        self.rows: list[tuple] = []
        self.count = 0
        self.now = utcnow()

    def add(self, line_no: int, reason: str, raw: bytes) -> None:
        """Buffer a row; of its bytes, only those an erasure can search (`searchable_prefix`) are kept, and the
        userinfo of any URL in them is dropped (credentials are never stored)."""
        kept = searchable_prefix(raw)
        if len(kept) < len(raw):
            reason += CUT.format(kept=len(kept), length=len(raw))
        self.rows.append((self.batch_id, line_no, self.rung, reason, userinfo_redacted(kept), self.now))
        self.count += 1
        if len(self.rows) >= self.chunk_size:
            self.flush()

    def flush(self) -> None:
        """Write the buffered rows; a line naming an erased subject keeps its number and reason, not its bytes."""
        withheld = erased_raw_lines(self.conn, [raw for *_, raw, _ in self.rows]) if self.rows else set()
        rows = [(*row[:3], row[3] + WITHHELD, b"", row[5]) if i in withheld else row for i, row in enumerate(self.rows)]
        copy_rows(self.conn, quarantine, _QUARANTINE_COLUMNS, rows)
        self.rows = []


def clear_quarantine(conn: Connection, batch_id: str, rung: str) -> None:
    conn.execute(delete(quarantine).where(quarantine.c.batch_id == batch_id, quarantine.c.rung == rung))


def ingest_raw_batch(warehouse: Warehouse, batch: BatchFile, max_line_bytes: int = MAX_LINE_BYTES) -> RawReport:
    """Read the whole file once, quarantine unparsable and over-long lines, and record the batch's file digest.

    One transaction: re-materialising replaces the batch's raw quarantine rows
    and registration; a failure leaves the previous state untouched.
    """
    lines = parsed = blank = too_long = 0
    read = FileDigest()  # exactly the bytes the lines came from, even if the file grows meanwhile
    with warehouse.engine.begin() as conn:
        lock_batch(conn, batch.key)  # a second run of this partition waits, then rewrites it whole
        clear_quarantine(conn, batch.key, RUNG)
        bad = QuarantineWriter(conn, batch.key, RUNG)
        try:
            for line in iter_lines(batch.path, read, max_line_bytes):
                if line.blank:
                    blank += 1
                    continue
                lines += 1
                if line.too_long:
                    too_long += 1
                    bad.add(line.number, line_too_long(line.length, max_line_bytes, len(line.raw)), line.raw)
                    continue
                try:
                    parse_line(line.raw)
                    parsed += 1
                except RecordError as exc:
                    bad.add(line.number, str(exc), line.raw)
        except TruncatedBatch as exc:
            lines += 1
            bad.add(exc.line_no, f"batch file cut short or damaged at its end: {exc.reason}", exc.tail)
        bad.flush()
        sha256 = read.hexdigest()
        landed_at, redelivered = _first_landed_at(conn, batch, sha256)
        conn.execute(delete(crawl_batches).where(crawl_batches.c.batch_id == batch.key))
        conn.execute(
            upsert_ignore(conn, crawl_batches).values(
                batch_id=batch.key,
                file_path=str(batch.path),
                file_sha256=sha256,
                file_bytes=read.size,
                lines=lines,
                parsed=parsed,
                quarantined=bad.count,
                landed_at=landed_at,
                registered_at=utcnow(),
            )
        )
    return RawReport(batch.key, read.size, lines, parsed, bad.count, blank, too_long, redelivered, sha256)


def line_too_long(length: int, limit: int, kept: int) -> str:
    """The quarantine reason of a line over the size limit (only its first `kept` bytes are kept)."""
    return f"line too long ({length} bytes; at most {limit}, max_line_bytes): only its first {kept} bytes kept"


def _first_landed_at(conn: Connection, batch: BatchFile, sha256: str) -> tuple[datetime, bool]:
    """When the batch first landed: its registered landing time if it has one, else its file's modification time;
    and whether it was registered with other bytes (re-delivered).

    The policy orders batches by it, so a file touched, copied again or restored since (or re-delivered with
    corrections) never moves its crawl after newer ones, where its old content would overwrite theirs.
    """
    registered = conn.execute(
        select(crawl_batches.c.landed_at, crawl_batches.c.file_sha256).where(crawl_batches.c.batch_id == batch.key)
    ).first()
    if registered is None:
        return datetime.fromtimestamp(batch.mtime, UTC), False
    return as_utc(registered.landed_at), registered.file_sha256 != sha256
