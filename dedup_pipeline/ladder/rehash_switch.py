"""Steps 3 and 4 of the rehash migration: switch the active hash version, then retire the old one.

**Switch** (`switch_hash_version`): refused while rows lack the target, while the
latest comparison failed, ran before the backfill was done, predates rows stored
since or was made by an earlier version, and for a version older than the active
one (going back has no comparison), unless forced with a reason. Sets the active
version in the warehouse and rewrites `records` to the target for the first
row of each target digest; rows that merge into another row's digest and
rows the target cannot hash keep their old version for the overlap window.

**Retire** (`retire_hash_version`): after the overlap window (one crawl
cycle), drops the old version's digests and moves the rows that merged under
the new version to `record_history`.

Both are audited in `hash_version_events`, forced or not, with the reason.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import datetime, timedelta

from sqlalchemy import Connection, select, update

from dedup_pipeline.core.clustering import DEFAULT_RULE
from dedup_pipeline.core.hashing import HASH_RULES, hash_rule
from dedup_pipeline.store import rehash_switch as store
from dedup_pipeline.store.rehash import progress, unhashable_rows
from dedup_pipeline.store.rehash_compare import latest_comparison, stored_since
from dedup_pipeline.store.schema import hash_version_events, settings
from dedup_pipeline.store.tombstones import lock_for_erasure
from dedup_pipeline.store.warehouse import ACTIVE_HASH_VERSION, Warehouse, active_hash_version, as_utc, utcnow


class MigrationRefused(RuntimeError):
    """A switch or retire that is not safe now; `problems` says why. Unless `final`, forcing it with a reason
    overrides."""

    def __init__(self, action: str, problems: list[str], details: dict | None = None, final: bool = False):
        self.problems = problems
        self.details = details or {}
        advice = "" if final else " (force it with a reason to override)"
        super().__init__(f"{action} refused: " + "; ".join(problems) + advice)


def _check_force(force: bool, reason: str) -> None:
    if force and not (reason or "").strip():
        raise ValueError("a forced switch or retire needs a reason; it is stored in hash_version_events")


def _event_metadata(report) -> dict:
    """A switch or retire report as run metadata: overridden problems and the reason as text."""
    meta = asdict(report)
    meta["problems"] = "; ".join(report.problems) or "none"
    meta["reason"] = report.reason or ""
    return meta


def _lock_active(conn: Connection) -> str:
    """The active version, locked for a switch or a retire, which both rewrite rows of the near-duplicate index.

    The settings row is locked on PostgreSQL so switches and retires serialise. Then, before any record row,
    the erasure lock, exclusively: the step waits for the rungs' chunks in progress (they hold it shared), and
    can never hold a row that a near-rung chunk waits for (a deadlock).
    """
    conn.execute(select(settings.c.value).where(settings.c.name == ACTIVE_HASH_VERSION).with_for_update())
    lock_for_erasure(conn)
    return active_hash_version(conn)


@dataclass
class SwitchReport:
    from_version: str
    to_version: str
    forced: bool
    reason: str | None
    problems: list[str]
    promoted: int
    kept_merged: int
    kept_unhashable: int
    unhashable_examples: list[tuple[str, str]]
    sketches_relabelled: int
    overlap_until: datetime
    event_id: int

    def as_metadata(self) -> dict:
        """Counts and versions for the run's metadata; the examples name rows, so they stay out of it."""
        meta = _event_metadata(self)
        del meta["unhashable_examples"]
        meta["overlap_until"] = self.overlap_until.isoformat()
        return meta


def switch_problems(conn: Connection, source: str, target: str) -> list[str]:
    """Why switching from `source` to `target` is not safe yet (empty when it is)."""
    problems = []
    remaining = progress(conn, target)
    if remaining.left:
        problems.append(f"{remaining.left} of {remaining.rows} rows have no {target} digest yet: run the backfill")
    comparison = latest_comparison(conn, source, target)
    if comparison is None and list(HASH_RULES).index(target) < list(HASH_RULES).index(source):
        problems.append(
            f"no comparison job compares {source} with the earlier {target}: going back is a forced switch, "
            "with the reason (docs/rehash.md, Going back)"
        )
    elif comparison is None:
        problems.append(f"no comparison of {source} and {target} yet: run the comparison")
    else:
        if not comparison.passed:
            change = comparison.figures.get("collapse_rate_change")
            problems.append(
                f"the latest comparison (#{comparison.comparison_id}) failed: collapse-rate change {change} "
                f"outside [{comparison.figures.get('band_low')}, {comparison.figures.get('band_high')}]"
            )
        if comparison.figures.get("rows_left"):
            problems.append(
                f"the latest comparison (#{comparison.comparison_id}) ran while "
                f"{comparison.figures['rows_left']} rows lacked {target}: compare again"
            )
        through = comparison.figures.get("stored_through")
        if through is None:
            problems.append(
                f"the latest comparison (#{comparison.comparison_id}) was made by an earlier version, which did not "
                "keep what it saw of the warehouse: compare again"
            )
        elif since := stored_since(conn, through):
            problems.append(
                f"{since} rows were stored or changed after the latest comparison (#{comparison.comparison_id}), "
                "which has not judged them: compare again"
            )
    return problems


def switch_hash_version(
    warehouse: Warehouse,
    target: str,
    *,
    force: bool = False,
    reason: str = "",
    run_id: str | None = None,
    overlap_hours: float = 24.0,
    now: datetime | None = None,
    examples: int = 20,
) -> SwitchReport:
    """Make `target` the active version (see the module docstring); MigrationRefused when not safe."""
    hash_rule(target)
    _check_force(force, reason)
    if overlap_hours < 0:
        raise ValueError("overlap_hours cannot be negative")
    now = now or utcnow()
    with warehouse.engine.begin() as conn:
        source = _lock_active(conn)
        if source == target:
            raise MigrationRefused("switch", [f"{target} is already the active version"], final=True)
        problems = switch_problems(conn, source, target)
        if problems and not force:
            raise MigrationRefused("switch", problems)
        store.set_active_version(conn, target, now)
        promoted = store.promote_group_leaders(conn, target)
        relabelled = store.follow_sketches(conn, source, target)
        unhashable, unhashable_examples = unhashable_rows(conn, target, limit=examples)
        kept_merged = len(store.merged_rows(conn, source, target))
        overlap_until = now + timedelta(hours=overlap_hours)
        details = {
            "problems": problems,
            "promoted": promoted,
            "kept_merged": kept_merged,
            "kept_unhashable": unhashable,
            "sketches_relabelled": relabelled,
        }
        event_id = store.record_event(
            conn,
            "switch",
            source,
            target,
            now,
            forced=bool(problems) and force,
            reason=reason or None,
            run_id=run_id,
            details=details,
            overlap_until=overlap_until,
        )
    with warehouse.engine.begin() as conn:
        store.refresh_statistics(conn)
    return SwitchReport(
        source,
        target,
        bool(problems) and force,
        reason or None,
        problems,
        promoted,
        kept_merged,
        unhashable,
        unhashable_examples,
        relabelled,
        overlap_until,
        event_id,
    )


# ---------------------------------------------------------------- retire


@dataclass
class RetireReport:
    version: str
    active: str
    forced: bool
    reason: str | None
    problems: list[str]
    promoted: int
    merged_moved: int
    hashes_dropped: int
    kept_unhashable: int
    event_id: int

    def as_metadata(self) -> dict:
        return _event_metadata(self)


def retire_hash_version(
    warehouse: Warehouse,
    version: str,
    *,
    force: bool = False,
    reason: str = "",
    run_id: str | None = None,
    now: datetime | None = None,
    representative: str = DEFAULT_RULE,
) -> RetireReport:
    """Drop `version`'s digests once the overlap window after the switch away from it is over.

    Rows still stored under `version` whose active digest another row holds
    (they merged under the new rule) are moved to `record_history`; rows the
    active version cannot hash stay, keeping their old digest in `records`.
    Moved rows leave the near-duplicate index and their clusters are
    recomputed under the `representative` rule (the near-duplicate rung's).
    """
    _check_force(force, reason)
    now = now or utcnow()
    with warehouse.engine.begin() as conn:
        active = _lock_active(conn)
        if version == active:
            raise MigrationRefused(
                "retire", [f"{version} is the active version: switch away from it first"], final=True
            )
        problems = []
        switched = store.latest_event(conn, "switch", version)
        if switched is None:
            if store.rows_stored_under(conn, version):
                problems.append(f"no recorded switch away from {version}, so no overlap window has run")
        elif switched.overlap_until is not None and now < as_utc(switched.overlap_until):
            problems.append(
                f"the overlap window after the switch to {switched.to_version} runs until "
                f"{as_utc(switched.overlap_until).isoformat()}"
            )
        if problems and not force:
            raise MigrationRefused("retire", problems)
        promoted = store.promote_group_leaders(conn, active)
        merged = store.merged_rows(conn, version, active)
        event_id = store.record_event(
            conn,
            "retire",
            version,
            active,
            now,
            forced=bool(problems) and force,
            reason=reason or None,
            run_id=run_id,
            details={},
        )
        moved = store.move_merged_to_history(conn, merged, version, active, event_id, now, representative)
        dropped = store.drop_version_hashes(conn, version)
        kept = store.rows_stored_under(conn, version)
        details = {
            "problems": problems,
            "promoted": promoted,
            "merged_moved": moved,
            "hashes_dropped": dropped,
            "kept_unhashable": kept,
        }
        conn.execute(
            update(hash_version_events).where(hash_version_events.c.event_id == event_id).values(details=details)
        )
    with warehouse.engine.begin() as conn:
        store.refresh_statistics(conn)
    return RetireReport(
        version, active, bool(problems) and force, reason or None, problems, promoted, moved, dropped, kept, event_id
    )
