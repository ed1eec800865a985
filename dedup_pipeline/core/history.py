"""Versions a late batch brings: where, in landing order, a key's superseded contents go in its history.

Pure: the caller loads a key's chain (its history rows and current row, each with the landing order of the batch
that brought it) and files what this returns. A batch that runs after newer batches of its key (its first run
failed, and the source's later batches went on) finds its records stale, yet in landing order each of its
versions was stored, then superseded: by the next version in landing order.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dedup_pipeline.core.records import CanonicalRecord


@dataclass
class Version:
    """One content a key held, in landing order: its digest and the (landing time, batch id, line) that brought it.

    A stored version's line is 0 (not kept); `history_id` and `superseded_by` are its history row's (None for the
    current row), `record` the late record that brings a version not stored yet (neither: the current row's
    content as an earlier crawl held it).
    """

    digest: str
    origin: tuple
    history_id: int | None = None
    superseded_by: str | None = None
    record: CanonicalRecord | None = None
    last: tuple | None = None  # the current row's: the (landing time, batch id, line) that last crawled it


@dataclass
class HistoryPlan:
    """What a late batch files in one key's history: new rows (record, superseded by) and moved rows."""

    inserts: list[tuple[CanonicalRecord, str]] = field(default_factory=list)
    moves: dict[int, str] = field(default_factory=dict)  # history id -> the batch that now supersedes it
    #: the batch superseding the current row's content as crawled before this batch, when a later batch re-crawled
    #: it unchanged; and whether that crawl was its first version
    current_copy: tuple[str, bool] | None = None


def file_late_versions(
    chain: list[Version], late: list[CanonicalRecord], batch_order: tuple, version: str
) -> HistoryPlan:
    """Place the late records of one key (in line order) into its `chain` (landing order, the current row last).

    A batch already in the chain (run before) files nothing again. A record with the content of the version
    before it is a re-crawl of that version; one with the content of the version after it brings that version
    earlier; any other is a version of its own. One between the current content's first crawl and its last
    (a later batch re-crawled it unchanged) splits it: the earlier crawl becomes a version of its own, superseded
    by this batch, and the current row dates from its last crawl (only the last re-crawl is known, so that is
    the batch that supersedes this one). Each version but the last is superseded by the batch of the next.
    """
    out = HistoryPlan()
    if not chain or any(tuple(v.origin[:2]) == tuple(batch_order) for v in chain):
        return out
    chain = list(chain)
    for record in late:
        origin = (*batch_order, record.line_no)
        after = next((i for i, v in enumerate(chain) if tuple(v.origin) > origin), None)
        digest = record.hashes[version]
        if after is None:
            current = chain[-1]
            if current.last is None or tuple(current.last) <= origin or current.digest == digest:
                continue  # newer than the current row (not late), or a re-crawl of its content
            earlier = Version(current.digest, current.origin)
            chain[-1:] = [earlier, Version(digest, origin, record=record), Version(current.digest, current.last)]
            continue
        if after > 0 and chain[after - 1].digest == digest:
            continue
        if chain[after].digest == digest:
            chain[after] = Version(digest, origin, chain[after].history_id, chain[after].superseded_by)
            continue
        chain.insert(after, Version(digest, origin, record=record))
    for position, (current, following) in enumerate(zip(chain, chain[1:])):
        by = following.origin[1]
        if current.history_id is None and current.record is None:
            out.current_copy = (by, position == 0)
        elif current.history_id is None:
            out.inserts.append((current.record, by))
        elif by != current.superseded_by:
            out.moves[current.history_id] = by
    return out
