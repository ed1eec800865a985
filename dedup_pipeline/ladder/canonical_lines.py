"""The canonical rung's work on one chunk of raw lines: pure, so it can run in a worker process.

Kept apart from `canonical` (which holds the transaction) so that a worker
process imports only the core rules and the JSON codec, not the database layer.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from dedup_pipeline.core.errors import RecordError
from dedup_pipeline.core.records import canonicalise_records, parse_line
from dedup_pipeline.store import json_text

#: Columns of `canonical_records` in the order of `CanonicalLines.rows`.
COLUMNS = (
    "batch_id",
    "line_no",
    "natural_key",
    "canonical_url",
    "url_version",
    "hashes",
    "hash_errors",
    "payload",
    "crawled_at",
)


@dataclass
class CanonicalLines:
    """One chunk's outcome: rows for `canonical_records` (JSON columns as text), lines to quarantine, counts."""

    rows: list[tuple] = field(default_factory=list)
    quarantine: list[tuple[int, str, bytes]] = field(default_factory=list)  # (line number, reason, raw line)
    records_in: int = 0
    hash_errors: Counter = field(default_factory=Counter)  # version -> records that version could not hash


def canonicalise_lines(
    lines: Sequence[tuple[int, bytes]],
    batch_id: str,
    versions: Sequence[str],
    active: str,
    key_fields: Sequence[str],
    url_version: str,
) -> CanonicalLines:
    """Parse and canonicalise (line number, raw line) pairs, column-wise (`canonicalise_records`).

    Lines that do not parse are skipped: the raw rung has quarantined them
    already. Lines that parse but cannot be canonicalised are returned for
    quarantine with their reason.
    """
    parsed = []
    for line_no, raw in lines:
        try:
            parsed.append((line_no, raw, parse_line(raw)))
        except RecordError:
            continue
    out = CanonicalLines(records_in=len(parsed))
    results = canonicalise_records(
        [record for _, _, record in parsed],
        [line_no for line_no, _, _ in parsed],
        versions,
        active,
        key_fields,
        url_version,
    )
    dumps = json_text.dumps
    for (line_no, raw, _), canonical in zip(parsed, results):
        if isinstance(canonical, RecordError):
            out.quarantine.append((line_no, str(canonical), raw))
            continue
        out.hash_errors.update(canonical.hash_errors.keys())
        out.rows.append(
            (
                batch_id,
                line_no,
                canonical.natural_key,
                canonical.canonical_url,
                url_version,
                dumps(canonical.hashes),
                dumps(canonical.hash_errors),
                dumps(canonical.payload),
                canonical.crawled_at,
            )
        )
    return out


__all__ = ["COLUMNS", "CanonicalLines", "canonicalise_lines"]
