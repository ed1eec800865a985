"""The duplicate-class policy: decide, for records in file order, what happens to each.

Pure: the caller loads the warehouse state for the chunk's keys and digests,
this module replays the chunk as if records arrived one at a time, and
returns the net writes. Replaying in file order is what makes the outcome
deterministic: when a key appears several times in a batch, the last
occurrence wins and every earlier version goes to history.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum

from dedup_pipeline.core.records import CanonicalRecord


class Decision(str, Enum):
    """What the exact rung did with one record. The values are stored in the decision log."""

    NEW = "new"  # natural key and content never seen: inserted
    CHANGED = "changed"  # key seen with other content: row upserted, old content to history
    CHANGE_IGNORED = "change_ignored"  # key seen with other content, policy keeps the first version
    STALE = "stale"  # key stored from a later batch (or later line): older content skipped
    EXACT_DUPLICATE = "exact_duplicate"  # active-version digest already stored: skipped
    ERASED = "erased"  # subject under an erasure tombstone: suppressed
    QUARANTINED = "quarantined"  # could not be parsed or canonicalised


@dataclass(frozen=True)
class DuplicatePolicy:
    """What to do per duplicate class, explicit rather than left to database defaults.

    - exact duplicates are always skipped (storing them again is the waste dedup removes);
    - ``on_changed``: ``"upsert"`` replaces the current row and keeps the old content in
      history (the seeds' default); ``"keep_first"`` leaves the stored row untouched;
    - near-duplicates from other sources are kept and linked by the near-duplicate rung.
    """

    on_changed: str = "upsert"
    keep_history: bool = True

    def __post_init__(self) -> None:
        if self.on_changed not in ("upsert", "keep_first"):
            raise ValueError(f"on_changed must be 'upsert' or 'keep_first', got {self.on_changed!r}")


#: Where a record version sits in time: (batch landing time, batch id, line number).
#: The newest batch wins, and within a batch the last occurrence in file order.
Order = tuple


@dataclass(frozen=True)
class StoredRow:
    """The current warehouse row of one natural key, and the order of the version it holds."""

    record_id: int
    content_hash: str
    order: Order
    #: (landing time, batch id) of the batch the row was first stored from, or None when not loaded: `load_state`
    #: loads it only for a row stored from a batch landed after the chunk's, which alone may be older than it.
    first: tuple | None = None


@dataclass
class ChunkPlan:
    """Net effect of one chunk on the warehouse."""

    decisions: list[tuple[CanonicalRecord, Decision]] = field(default_factory=list)
    inserts: dict[str, CanonicalRecord] = field(default_factory=dict)  # key -> final record
    first_inserted: dict[str, CanonicalRecord] = field(default_factory=dict)  # key -> first record (its first_seen_at)
    updates: dict[str, tuple[CanonicalRecord, StoredRow]] = field(default_factory=dict)  # key -> (final, stored)
    # key -> (re-crawl, stored): the stored content again, from a newer batch; the row's order moves to it
    recrawls: dict[str, tuple[CanonicalRecord, StoredRow]] = field(default_factory=dict)
    # key -> (record, stored): the key's first record in a batch landed before the one its row was first stored
    # from (an out-of-order run); the row's first_seen_at and first_batch_id move to that record
    antedated: dict[str, tuple[CanonicalRecord, StoredRow]] = field(default_factory=dict)
    # key -> (stored, records): records of a batch older than the row's version, in line order: in landing order
    # they were versions of the key (unless one holds content another key holds), for its history
    late: dict[str, tuple[StoredRow, list[CanonicalRecord]]] = field(default_factory=dict)
    stored_superseded: list[StoredRow] = field(default_factory=list)  # warehouse rows moved to history
    chunk_superseded: list[tuple[CanonicalRecord, CanonicalRecord]] = field(default_factory=list)  # (old, replaced by)


def plan_chunk(
    records: Iterable[CanonicalRecord],
    active_version: str,
    stored_by_key: Mapping[str, StoredRow],
    stored_digests: Mapping[str, Collection[str]],
    batch_order: tuple,
    policy: DuplicatePolicy = DuplicatePolicy(),
    erased: set[int] | None = None,
) -> ChunkPlan:
    """Replay records in file order against the stored state and return the net writes.

    ``stored_by_key`` holds the current rows of the chunk's natural keys and
    ``stored_digests`` maps active-version digests already stored to the
    natural keys of the rows holding them: every digest of the chunk known to
    be stored, every digest the rows of ``stored_by_key`` hold (`load_state`
    gives both), and every digest one of its keys holds and changes away from
    (during a rehash migration's overlap, two rows may hold one digest, and it
    stays stored while either does). ``batch_order`` is (landing time, batch id) of the
    batch; a record older than the stored version of its key is stale, which is
    what makes replaying an old batch change nothing. ``erased`` holds the
    positions (in ``records``) that an erasure tombstone suppresses.

    A record of a stored key from a batch older than the row's ``first``
    batch dates the row's first version to it, as landing order would have:
    it is skipped (stale or an exact duplicate), but it brought the key first.
    One holding content another key holds does not: in landing order it
    would have been that key's exact duplicate.
    """
    plan = ChunkPlan()
    current: dict[str, str] = {key: row.content_hash for key, row in stored_by_key.items()}
    current_order: dict[str, Order] = {key: row.order for key, row in stored_by_key.items()}
    holders: dict[str, set[str]] = {digest: set(keys) for digest, keys in stored_digests.items()}
    for position, record in enumerate(records):
        if erased and position in erased:
            plan.decisions.append((record, Decision.ERASED))
            continue
        digest = record.hashes[active_version]
        key = record.natural_key
        previous = current.get(key)
        order = (*batch_order, record.line_no)
        row = stored_by_key.get(key)
        if (
            row is not None
            and row.first is not None
            and key not in plan.antedated
            and tuple(batch_order) < tuple(row.first)
            and (digest == previous or digest not in holders)
        ):
            plan.antedated[key] = (record, row)
        if (
            row is not None
            and policy.on_changed == "upsert"
            and key not in plan.updates
            and tuple(batch_order) < tuple(row.order[:2])
            and (digest == previous or digest not in holders)
        ):
            plan.late.setdefault(key, (row, []))[1].append(record)
        if digest in holders or digest == previous:
            plan.decisions.append((record, Decision.EXACT_DUPLICATE))
            if (
                digest == previous
                and key in stored_by_key
                and key not in plan.updates
                and key not in plan.recrawls
                and tuple(batch_order) > tuple(current_order[key][:2])
            ):
                # The row now dates from this batch, so that an older crawl of the key replayed later (a retry,
                # a backfill, a parallel worker) is stale against it, as it would be in landing order.
                plan.recrawls[key] = (record, stored_by_key[key])
                current_order[key] = order
            continue
        if previous is None:
            decision = Decision.NEW
            plan.first_inserted[key] = record
        elif order < current_order[key]:
            plan.decisions.append((record, Decision.STALE))
            continue
        elif policy.on_changed == "keep_first":
            plan.decisions.append((record, Decision.CHANGE_IGNORED))
            continue
        else:
            decision = Decision.CHANGED
            _release(holders, previous, key)
            plan.recrawls.pop(key, None)  # the update dates the row itself
            if key in plan.inserts or key in plan.updates:
                earlier = plan.inserts.get(key) or plan.updates[key][0]
                plan.chunk_superseded.append((earlier, record))
            else:
                plan.stored_superseded.append(stored_by_key[key])
        plan.decisions.append((record, decision))
        current[key] = digest
        current_order[key] = order
        holders.setdefault(digest, set()).add(key)
        if key in stored_by_key:
            plan.updates[key] = (record, stored_by_key[key])
        else:
            plan.inserts[key] = record
    return plan


def _release(holders: dict[str, set[str]], digest: str, key: str) -> None:
    """`key` no longer holds `digest`; the digest stays stored while another row holds it."""
    keys = holders.get(digest)
    if keys is not None:
        keys.discard(key)
        if not keys:
            del holders[digest]
