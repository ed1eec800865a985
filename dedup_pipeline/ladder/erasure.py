"""Erasure of a data subject: the warehouse in one transaction, then the seen-sets. Shared by the job and the CLI."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from sqlalchemy.exc import OperationalError

from dedup_pipeline import environment
from dedup_pipeline.core.clustering import DEFAULT_RULE
from dedup_pipeline.core.erasure import Subject
from dedup_pipeline.store.erasure import erase, record_seen_set_removals
from dedup_pipeline.store.warehouse import Warehouse

log = logging.getLogger(__name__)


@dataclass
class ErasureReport:
    """Counts only: what an erasure removed, per table and seen-set, how many tombstones it added, and the links the
    records that linked to an erased one stored when they linked again (`links_added`)."""

    erasure_id: int
    request_id: str
    subject_kind: str
    removed: dict[str, int] = field(default_factory=dict)
    tombstones_added: int = 0
    clusters_recomputed: int = 0
    links_added: int = 0
    seen_set: str = "none"
    seen_set_errors: list[str] = field(default_factory=list)

    def as_metadata(self) -> dict:
        meta = {
            "erasure_id": self.erasure_id,
            "request_id": self.request_id,
            "subject_kind": self.subject_kind,
            "tombstones_added": self.tombstones_added,
            "clusters_recomputed": self.clusters_recomputed,
            "links_added": self.links_added,
            "seen_set": self.seen_set,
            "records_removed": self.removed.get("records", 0),
        }
        meta.update({f"removed[{table}]": n for table, n in sorted(self.removed.items())})
        if self.seen_set_errors:
            meta["seen_set_errors"] = "; ".join(self.seen_set_errors)
        return meta


def url_seen_set_from_env():
    """The crawlers' URL seen-set (dedup_pipeline.crawler) when Redis is configured, else None."""
    if not environment.redis_url():
        return None
    from dedup_pipeline.crawler import UrlSeenSet

    return UrlSeenSet()


def erase_subject(
    warehouse: Warehouse,
    subject: Subject,
    request_id: str = "",
    seen_set=None,
    representative: str = DEFAULT_RULE,
    url_seen_set=None,
) -> ErasureReport:
    """Erase every copy of `subject` and leave its tombstones; then drop it from the seen-sets.

    The warehouse part is one transaction: all or nothing. Seen-sets cannot
    join it, so they are cleared after the commit: the content seen-set
    (`seen_set`: its digests under every version) and the crawlers' URL
    seen-set (`url_seen_set`: the erased canonical URLs). If that fails
    (Redis down), the warehouse is still right: a seen-set hit is only "maybe
    seen", confirmed against the warehouse, where the tombstones win; the keys
    expire with their TTL. A Bloom filter cannot forget and holds only bits.
    """
    result = _erase_with_retries(warehouse, subject, request_id, representative)
    report = ErasureReport(
        result.erasure_id,
        request_id,
        subject.kind.value,
        dict(result.removed),
        result.tombstones_added,
        result.clusters_recomputed,
        result.links_added,
    )
    cleared: dict[str, int] = {}
    if seen_set is not None:
        report.seen_set = getattr(seen_set, "kind", type(seen_set).__name__)
        _clear(
            report,
            cleared,
            "seen_set",
            lambda: sum(seen_set.forget(v, sorted(ds)) for v, ds in sorted(result.digests.items())),
        )
    if url_seen_set is not None:
        _clear(report, cleared, "url_seen_set", lambda: url_seen_set.forget(sorted(result.urls)) if result.urls else 0)
    if cleared:
        report.removed.update(cleared)
        with warehouse.engine.begin() as conn:
            record_seen_set_removals(conn, result.erasure_id, cleared)
    log.info("erasure %s (%s): removed %s", result.erasure_id, subject.kind.value, report.removed)
    return report


def _erase_with_retries(
    warehouse: Warehouse, subject: Subject, request_id: str, representative: str, attempts: int = 5
):
    """One transaction; on SQLite, a concurrent writer that committed first makes it fail whole, so it is retried."""
    for attempt in range(1, attempts + 1):
        try:
            with warehouse.engine.begin() as conn:
                return erase(conn, subject, request_id, representative)
        except OperationalError as exc:
            if attempt == attempts or "locked" not in str(exc).lower():
                raise
            log.info("erasure met a concurrent writer (attempt %d); retrying", attempt)


def _clear(report: ErasureReport, cleared: dict, name: str, action) -> None:
    try:
        cleared[name] = int(action())
    except Exception as exc:  # noqa: BLE001 - the warehouse part is done and correct; say what is left
        report.seen_set_errors.append(f"{name}: {type(exc).__name__}; its entries expire with their TTL")
        log.warning("erasure %s: could not clear the %s (%s)", report.erasure_id, name, type(exc).__name__)
