"""The landing folder: which files are crawl batches, their partition keys, and reading their lines."""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import re
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from dedup_pipeline import environment

#: Batch file endings, longest first so "x.jsonl.gz" is not read as "x.jsonl" + ".gz".
BATCH_SUFFIXES = (".jsonl.gz", ".ndjson.gz", ".json.gz", ".jsonl", ".ndjson")
_KEY_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._=:+-]{0,199}$")
#: Why a file whose name ends like a batch is not one (a Dagster partition key must be a plain name).
BAD_KEY = (
    "its name (less the suffix) is not a batch key: ASCII letters, digits and . _ = : + -, starting with a "
    "letter or digit, at most 200 characters"
)
NOT_A_BATCH = "not a batch file: batch names end in " + ", ".join(sorted(BATCH_SUFFIXES)) + " (lower case)"
#: A file modified more recently than this is taken to be still being written (the sensor's and `run`'s default).
DEFAULT_SETTLE_SECONDS = 5.0


#: A batch key's leading landing date or timestamp ("2026-11-30-", "2026-11-30T06:00Z_", "20261130-"):
#: what is left is the crawl source.
# A time of day may follow the date: after "T" as ISO 8601 writes it, down to the hour alone ("T06", "T06:00Z",
# "T0600"); after "_" with its minutes ("_0600"), so that "2026-11-30_10-pack" stays the source "10-pack".
_DATED_KEY = re.compile(
    r"^\d{4}-?\d{2}-?\d{2}(?:T\d{2}(?:[:.]?\d{2}){0,2}Z?|_\d{2}[:.]?\d{2}(?:[:.]?\d{2})?Z?)?[-_.](?P<source>.+)$"
)
#: The run tag that the production instance limits to one run per value, so a source's batches run in order.
SOURCE_TAG = "dedup/source"


def batch_source(key: str) -> str:
    """The crawl source of a batch: its key without a leading date ("2026-11-30-shop-a" -> "shop-a").

    A key without a leading date is its own source.
    """
    return named_source(key) or key


def named_source(key: str) -> str | None:
    """The source a batch key names after its leading date, or None when it names none ("crawl-7", "2026-11-30")."""
    match = _DATED_KEY.match(key)
    return match.group("source") if match else None


class BatchFileError(RuntimeError):
    """A batch file that cannot be read as a whole (missing, unreadable, changed)."""


def landing_dir() -> Path:
    """$DEDUP_LANDING_DIR, else the `landing` folder of the data folder."""
    return environment.landing_dir()


def batch_key(path: Path) -> str | None:
    """The partition key of a batch file (its name without the suffix), or None if it is not a batch."""
    key, _ = _key_or_reason(path.name)
    return key


def _key_or_reason(name: str) -> tuple[str | None, str]:
    """(the batch key, "") of a file name, or (None, why it is not a batch file)."""
    for suffix in BATCH_SUFFIXES:
        if name.endswith(suffix):
            key = name[: -len(suffix)]
            return (key, "") if _KEY_PATTERN.fullmatch(key) else (None, BAD_KEY)
    return None, NOT_A_BATCH


@dataclass(frozen=True)
class BatchFile:
    key: str
    path: Path
    size: int
    mtime: float


@dataclass(frozen=True)
class LandingScan:
    """What a landing folder holds: settled batches, batches still being written, files that are no batch, and batch
    keys that several files map to."""

    batches: list[BatchFile]
    unsettled: list[BatchFile]
    ignored: list[tuple[str, str]]  # (file name, why it is not a batch file)
    ambiguous: dict[str, str]  # batch key -> which files map to it: none of them is taken

    def notices(self, settle_seconds: float) -> list[str]:
        """One line per file left alone, for an operator: which, and why."""
        now = time.time()
        lines = [
            f"not yet: {batch.path.name} was modified {max(now - batch.mtime, 0):.0f} s ago, less than the "
            f"{settle_seconds:g} s a batch must be left unchanged (still being written?)"
            for batch in self.unsettled
        ]
        return (
            lines
            + [f"ignored: {name}: {reason}" for name, reason in self.ignored]
            + [f"ambiguous: batch {key!r}: {reason}" for key, reason in self.ambiguous.items()]
        )


def scan_landing(folder: Path, settle_seconds: float = 0.0) -> LandingScan:
    """The batch files in `folder`, in name order, and the files left alone.

    Hidden files (a crawler writing under a temporary name and renaming it
    when done, as it should) and folders are passed over without a word.
    Files modified in the last `settle_seconds` are `unsettled`, so a
    crawler still writing a batch never yields a partial partition; other
    files whose name is not a batch's are `ignored`, with the reason. A key
    that several files map to (`x.jsonl` and `x.jsonl.gz`, settled or not)
    is `ambiguous`, with the files: none of them is taken, never one at random.
    """
    if not folder.is_dir():
        raise BatchFileError(f"landing folder {folder} does not exist or is not a folder")
    now = time.time()
    files: dict[str, list[BatchFile]] = {}
    ignored: list[tuple[str, str]] = []
    for path in sorted(folder.iterdir()):
        if path.name.startswith(".") or not path.is_file():
            continue
        key, reason = _key_or_reason(path.name)
        if key is None:
            ignored.append((path.name, reason))
            continue
        stat = path.stat()
        files.setdefault(key, []).append(BatchFile(key, path, stat.st_size, stat.st_mtime))
    batches: list[BatchFile] = []
    unsettled: list[BatchFile] = []
    ambiguous: dict[str, str] = {}
    for key, found in sorted(files.items()):
        if len(found) > 1:
            names = ", ".join(batch.path.name for batch in found)
            ambiguous[key] = (
                f"{len(found)} files map to it ({names}): none is taken until all but one are removed or renamed"
            )
        elif now - found[0].mtime < settle_seconds:
            unsettled.append(found[0])
        else:
            batches.append(found[0])
    return LandingScan(batches, unsettled, ignored, ambiguous)


def list_batches(folder: Path, settle_seconds: float = 0.0) -> list[BatchFile]:
    """The settled batch files in `folder`, in name order (see `scan_landing`)."""
    return scan_landing(folder, settle_seconds).batches


def find_batch(folder: Path, key: str) -> BatchFile:
    """The landing file of batch `key`: a BatchFileError if there is none, or if several files map to the key."""
    scan = scan_landing(folder)
    if key in scan.ambiguous:
        raise BatchFileError(f"batch {key!r} in {folder} is ambiguous: {scan.ambiguous[key]}")
    for batch in scan.batches:
        if batch.key == key:
            return batch
    raise BatchFileError(f"no landing file for batch {key!r} in {folder}")


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


@dataclass(frozen=True)
class Line:
    """One physical line of a batch: 1-based number and raw bytes (no newline).

    A line longer than the reader's limit keeps only its first `HEAD_BYTES` in `raw`, and its whole length
    in `length`; a blank (or whitespace-only) line is yielded too, so that its caller can count it.
    """

    number: int
    raw: bytes
    length: int | None = None  # set only when the line was over the limit

    @property
    def too_long(self) -> bool:
        return self.length is not None

    @property
    def blank(self) -> bool:
        return not self.too_long and not self.raw.strip()


#: What an over-long line keeps of its bytes: enough for an operator (and an erasure) to tell which record it was.
HEAD_BYTES = 4096


def _head(raw: bytes) -> bytes:
    """The first `HEAD_BYTES` of an over-long line, less a character the cut would split (UTF-8 continuation bytes)."""
    cut = min(HEAD_BYTES, len(raw))
    while 0 < cut < len(raw) and raw[cut] & 0xC0 == 0x80:
        cut -= 1
    return raw[:cut]


#: The UTF-8 byte-order mark some writers put at the start of a file (never part of the first record).
BOM = b"\xef\xbb\xbf"
#: The byte-order marks of UTF-16 (and UTF-32) text, little- and big-endian.
UTF16_BOMS = (b"\xff\xfe", b"\xfe\xff", b"\x00\x00\xfe\xff")


class TruncatedBatch(Exception):
    """Raised after the last good line when a compressed batch ends early."""

    def __init__(self, line_no: int, tail: bytes, reason: str):
        super().__init__(reason)
        self.line_no = line_no
        self.tail = tail
        self.reason = reason


class FileDigest:
    """SHA-256 and size of the bytes of a batch file as a rung read them (not as the file is now).

    A crawler may still be appending while a rung reads; comparing this
    digest, not a second read of the file, with the registration is
    what guarantees that the rung used exactly the registered bytes.
    """

    def __init__(self) -> None:
        self._sha = hashlib.sha256()
        self.size = 0

    def update(self, data) -> None:
        self._sha.update(data)
        self.size += len(data)

    def hexdigest(self) -> str:
        return self._sha.hexdigest()


class _DigestedFile(io.RawIOBase):
    """A raw file whose every byte read also goes into a FileDigest."""

    def __init__(self, handle, digest: FileDigest):
        self._handle, self._digest = handle, digest

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        n = self._handle.readinto(buffer)
        if n:
            self._digest.update(memoryview(buffer)[:n])
        return n


def _corrupt(exc: BaseException) -> bool:
    """Damage inside the compressed data (a failed CRC or length check, an invalid deflate stream).

    A stream that merely ends early (EOFError) decompresses to an exact prefix
    of the original, so it is a quarantined tail (or, when nothing of it could
    be read, an unreadable file: see `iter_lines`). Corrupt data is only detected after the
    lines before it were produced, and any of them may have been altered.
    """
    if isinstance(exc, zlib.error):
        return True
    return isinstance(exc, gzip.BadGzipFile) and not str(exc).startswith("Not a gzipped file")


def iter_lines(path: Path, digest: FileDigest | None = None, max_line_bytes: int | None = None) -> Iterator[Line]:
    """Stream the lines of a batch file, gunzipping when needed, blank ones included (`Line.blank`).

    Memory is one line at a time, and bounded: a line longer than `max_line_bytes`
    (None: no limit) is skipped to its newline without being held, and yielded
    as its head and length (`Line.too_long`). A UTF-8 byte-order mark at the
    start of the file (of its decompressed bytes, for gzip) is not part of the
    first line. A truncated gzip stream yields every complete line before the
    damage and then raises `TruncatedBatch` carrying the incomplete tail, so the
    caller can quarantine it. A corrupt one (failed CRC, invalid deflate data)
    raises `BatchFileError`: its lines cannot be trusted, so the rung writes
    nothing; so does a stream of which not one byte can be decompressed (a
    damaged header, bytes that are not gzip), which would otherwise be a batch
    of one quarantined line. `digest`, if given, receives every byte of the file
    the lines came from (after damage, the rest of the file too).
    """
    limit = max_line_bytes if max_line_bytes is not None else float("inf")
    line_no = 0
    try:
        with open(path, "rb", buffering=0) as raw_file:
            if path.name.endswith(".gz") and not os.fstat(raw_file.fileno()).st_size:
                raise BatchFileError(
                    f"batch file {path} is empty (0 bytes): gzip writes a header even for no lines, so the "
                    "upload failed; fetch it again"
                )
            source = io.BufferedReader(_DigestedFile(raw_file, digest) if digest else raw_file, 1 << 20)
            handle = gzip.GzipFile(fileobj=source, mode="rb") if path.name.endswith(".gz") else source
            pending = b""
            at_start = True
            skipped: Line | None = None  # an over-long line read past so far: its head and length
            read_any = False
            while True:
                try:
                    # read1: one read of the stream per call, so the lines decompressed before damage
                    # are returned, never dropped along with the partial block that hit it.
                    block = handle.read1(1 << 20)
                except (EOFError, OSError, zlib.error) as exc:
                    if _corrupt(exc):
                        raise BatchFileError(
                            f"batch file {path} is corrupt ({exc}): none of its lines can be trusted; fetch it again"
                        ) from None
                    if not read_any:  # a damaged header or no gzip at all: no line of it can be read
                        raise BatchFileError(
                            f"batch file {path} cannot be read ({exc}): not one line could be decompressed; "
                            "fetch it again"
                        ) from None
                    if digest:
                        while source.read1(1 << 20):
                            pass
                    tail = skipped.raw if skipped else pending
                    raise TruncatedBatch(line_no + 1, tail, f"compressed stream damaged: {exc}") from None
                read_any = read_any or bool(block)
                if skipped is not None and block:
                    end = block.find(b"\n")
                    if end < 0:
                        skipped = Line(skipped.number, skipped.raw, skipped.length + len(block))
                        continue
                    line_no += 1
                    yield Line(line_no, skipped.raw, skipped.length + len(block[:end].rstrip(b"\r")))
                    skipped, block = None, block[end + 1 :]
                pending += block
                if at_start and (len(pending) >= len(BOM) or not block):
                    if pending.startswith(UTF16_BOMS):  # every line would be quarantined as not UTF-8
                        raise BatchFileError(
                            f"batch file {path} is UTF-16 (or UTF-32) text, by its byte-order mark: batches are "
                            "UTF-8; re-encode it (iconv -f UTF-16 -t UTF-8)"
                        )
                    pending, at_start = pending.removeprefix(BOM), False
                if not block:
                    break
                *complete, pending = pending.split(b"\n")
                for raw in complete:
                    line_no += 1
                    raw = raw.rstrip(b"\r")
                    yield Line(line_no, _head(raw), len(raw)) if len(raw) > limit else Line(line_no, raw)
                if len(pending) > limit:
                    skipped, pending = Line(line_no + 1, _head(pending), len(pending)), b""
            if skipped is not None:
                yield Line(line_no + 1, skipped.raw, skipped.length)
            elif pending:
                raw = pending.rstrip(b"\r")
                yield Line(line_no + 1, _head(raw), len(raw)) if len(raw) > limit else Line(line_no + 1, raw)
    except FileNotFoundError:
        raise BatchFileError(f"batch file {path} disappeared") from None
    except PermissionError:
        raise BatchFileError(f"batch file {path} is not readable") from None
