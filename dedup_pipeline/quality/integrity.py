"""Warehouse integrity for the rows dated to a batch (stored or re-crawled unchanged by it), against the warehouse.

The invariants (rule 2 of the design: the database is the authority):
- one row per content: `(hash_version, content_hash)` is unique in `records`;
- one current row per natural key;
- every stored digest is well-formed (32 bytes of SHA-256), in `records`,
  `record_hashes` and the decision log;
- every hash version named anywhere is known to the rule registry
  (`HASH_RULES`), including the warehouse's active version.

The constraints enforce most of this; the check proves it still holds (after a
migration, a restore, a hand edit or a schema drift). Each query is scoped to
the batch's rows through an index (`ix_records_last_batch`, `ix_decisions_batch`)
and compares them against the whole table through the unique indexes, so the
cost follows the batch size, not the warehouse size.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field

from sqlalchemy import Connection, and_, func, or_, select, text

from dedup_pipeline.core.hashing import HASH_RULES
from dedup_pipeline.store.schema import dedup_decisions, record_hashes, records
from dedup_pipeline.store.warehouse import ACTIVE_HASH_VERSION, read_setting

DIGEST_BYTES = 32


@dataclass
class IntegrityReport:
    batch_id: str
    rows_checked: int = 0
    duplicate_content: int = 0
    duplicate_keys: int = 0
    malformed_hashes: int = 0
    unknown_versions: int = 0
    active_version: str | None = None
    active_version_known: bool = True
    problems: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.problems

    def as_metadata(self) -> dict:
        meta = asdict(self)
        meta["problems"] = "; ".join(self.problems) or "none"
        meta["active_version"] = self.active_version or "unset"
        return meta


def _counts(conn: Connection, table, where, **conditions) -> dict[str, int]:
    """`count(*)` of `table`'s rows matching `where`, and of those matching each of `conditions`, in one scan."""
    columns = [func.count().label("rows")]
    columns += [func.count().filter(condition).label(name) for name, condition in conditions.items()]
    row = conn.execute(select(*columns).select_from(table).where(where)).one()
    return {name: int(value or 0) for name, value in row._mapping.items()}


def check_batch_integrity(
    conn: Connection, batch_id: str, known_versions: Iterable[str] = HASH_RULES
) -> IntegrityReport:
    """Count every violation among the rows `batch_id` last wrote (and its decision-log lines).

    Three statements, one per table the batch wrote (its rows are read once each, through the batch's index);
    the duplicates are probes of the whole table through its unique indexes.
    """
    known = sorted(known_versions)
    report = IntegrityReport(batch_id)
    if conn.dialect.name == "postgresql":
        # The probes' estimated cost passes PostgreSQL's `jit_above_cost` on any sizeable batch, and compiling
        # them took longer (0.05 to 0.2 s a batch) than the index probes themselves.
        conn.execute(text("SET LOCAL jit = off"))

    def bad_digest(column):
        return or_(column.is_(None), func.length(column) != DIGEST_BYTES)

    r, other = records.alias("r"), records.alias("other")
    same_content = and_(
        other.c.hash_version == r.c.hash_version,
        other.c.content_hash == r.c.content_hash,
        other.c.record_id != r.c.record_id,
    )
    same_key = and_(other.c.natural_key == r.c.natural_key, other.c.record_id != r.c.record_id)
    mine = _counts(
        conn,
        r,
        r.c.last_batch_id == batch_id,
        duplicate_content=select(other.c.record_id).where(same_content).exists(),
        duplicate_keys=select(other.c.record_id).where(same_key).exists(),
        malformed=bad_digest(r.c.content_hash),
        unknown=r.c.hash_version.not_in(known),
    )
    h = record_hashes.c
    hashes = _counts(
        conn,
        record_hashes.join(records, h.record_id == records.c.record_id),
        records.c.last_batch_id == batch_id,
        malformed=and_(h.error.is_(None), bad_digest(h.content_hash)),
        unknown=h.hash_version.not_in(known),
    )
    d = dedup_decisions.c
    decisions = _counts(
        conn,
        dedup_decisions,
        d.batch_id == batch_id,
        malformed=and_(d.content_hash.is_not(None), func.length(d.content_hash) != DIGEST_BYTES),
        unknown=and_(d.hash_version.is_not(None), d.hash_version.not_in(known)),
    )
    report.rows_checked = mine["rows"]
    report.duplicate_content, report.duplicate_keys = mine["duplicate_content"], mine["duplicate_keys"]
    report.malformed_hashes = sum(counts["malformed"] for counts in (mine, hashes, decisions))
    report.unknown_versions = sum(counts["unknown"] for counts in (mine, hashes, decisions))
    report.active_version = read_setting(conn, ACTIVE_HASH_VERSION)
    report.active_version_known = report.active_version in known

    if report.duplicate_content:
        report.problems.append(f"{report.duplicate_content} rows share (hash_version, content_hash) with another row")
    if report.duplicate_keys:
        report.problems.append(f"{report.duplicate_keys} rows share their natural key with another row")
    if report.malformed_hashes:
        report.problems.append(f"{report.malformed_hashes} digests are not {DIGEST_BYTES} bytes")
    if report.unknown_versions:
        report.problems.append(f"{report.unknown_versions} rows name a hash version unknown to HASH_RULES {known}")
    if not report.active_version_known:
        report.problems.append(f"the active hash version {report.active_version!r} is unknown to HASH_RULES {known}")
    return report
