"""Counters with the seeds' names (and the Bloom seen-set's fill), in the Prometheus text format (prometheus-client).

Computed from the warehouse (the decision log, the near-duplicate links and the
exact rung's per-run figures), so they are the same whichever worker asks and
survive restarts. Export them with `dedup-pipeline metrics` (stdout) or
`dedup-pipeline metrics --textfile PATH` for node_exporter's textfile collector.
"""

from __future__ import annotations

from collections import Counter

from prometheus_client import CollectorRegistry, Counter as PromCounter, Gauge, generate_latest, write_to_textfile
from sqlalchemy import Connection, func, select

from dedup_pipeline.core.policy import Decision
from dedup_pipeline.store.schema import dedup_decisions, exact_rung_runs, near_duplicate_links, quarantine

#: Decisions that skip a record, by the `type` label of scraper_duplicates_skipped_total.
SKIPPED = {
    Decision.EXACT_DUPLICATE.value: "exact",
    Decision.STALE.value: "stale",
    Decision.CHANGE_IGNORED.value: "change_ignored",
    Decision.ERASED.value: "erased",
}
SEEN_SET_FIGURES = ("seen_set_hits", "seen_set_false_positives", "seen_set_cold_misses", "seen_set_fallbacks")


def totals(conn: Connection) -> dict:
    """Every counter's value, read from the warehouse."""
    decisions = Counter(dict(conn.execute(
        select(dedup_decisions.c.decision, func.count()).group_by(dedup_decisions.c.decision)
    ).all()))
    quarantined = conn.execute(select(func.count()).select_from(quarantine)).scalar_one()
    flagged = conn.execute(select(func.count()).select_from(near_duplicate_links)).scalar_one()
    seen_set = Counter()
    fill = None  # of the latest run (None unless its seen-set has a capacity: a Bloom filter)
    for (stats,) in conn.execute(select(exact_rung_runs.c.stats).order_by(exact_rung_runs.c.finished_at)):
        seen_set.update({name: int(stats.get(name, 0)) for name in SEEN_SET_FIGURES})
        fill = stats.get("seen_set_fill")
    return {
        "decisions": decisions, "quarantined": quarantined, "near_duplicates_flagged": flagged, "seen_set": seen_set,
        "seen_set_fill": fill,
    }


def registry(conn: Connection) -> CollectorRegistry:
    """A registry holding the counters, ready to print or write."""
    figures = totals(conn)
    reg = CollectorRegistry()
    seen = PromCounter("scraper_records_seen", "Records that reached the dedup ladder (decided or quarantined).", registry=reg)
    seen.inc(sum(figures["decisions"].values()) + figures["quarantined"])
    skipped = PromCounter("scraper_duplicates_skipped", "Records skipped, by duplicate type.", ["type"], registry=reg)
    for decision, label in SKIPPED.items():
        skipped.labels(type=label).inc(figures["decisions"][decision])
    stored = PromCounter("scraper_records_stored", "Records written to the warehouse, by kind.", ["type"], registry=reg)
    for decision in (Decision.NEW.value, Decision.CHANGED.value):
        stored.labels(type=decision).inc(figures["decisions"][decision])
    PromCounter("scraper_records_quarantined", "Lines sent to quarantine.", registry=reg).inc(figures["quarantined"])
    PromCounter("scraper_near_duplicates_flagged", "Near-duplicate links found.", registry=reg).inc(
        figures["near_duplicates_flagged"]
    )
    fast = PromCounter("dedup_seen_set", "Seen-set fast path: hits confirmed, false positives caught, cold misses, fallbacks.", ["outcome"], registry=reg)
    for name in SEEN_SET_FIGURES:
        fast.labels(outcome=name.removeprefix("seen_set_")).inc(figures["seen_set"][name])
    if figures["seen_set_fill"] is not None:
        Gauge(
            "dedup_seen_set_fill", "Bloom seen-set: digests over capacity after the latest batch (alert well before 1).",
            registry=reg,
        ).set(figures["seen_set_fill"])
    return reg


def prometheus_text(conn: Connection) -> str:
    return generate_latest(registry(conn)).decode("utf-8")


def write_textfile(conn: Connection, path: str) -> None:
    write_to_textfile(path, registry(conn))
