"""Counters with the seeds' names (and the Bloom seen-set's fill), in the Prometheus text format (prometheus-client).

Computed from the warehouse (the decision log, the near-duplicate links and the
exact rung's per-run figures), so they are the same whichever worker asks and
survive restarts. Export them with `dedup-pipeline metrics` (stdout),
`dedup-pipeline metrics --textfile PATH` for node_exporter's textfile collector,
or `dedup-pipeline metrics --serve PORT` as an HTTP endpoint for Prometheus to
scrape (`serve`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from wsgiref.simple_server import WSGIServer

from prometheus_client import (
    CollectorRegistry, Counter as PromCounter, Gauge, generate_latest, start_http_server, write_to_textfile,
)
from prometheus_client.core import GaugeMetricFamily
from sqlalchemy import Connection, Engine, func, select

from dedup_pipeline.core.policy import Decision
from dedup_pipeline.store.schema import dedup_decisions, exact_rung_runs, near_duplicate_links, quarantine

#: Decisions that skip a record, by the `type` label of scraper_duplicates_skipped_total.
SKIPPED = {
    Decision.EXACT_DUPLICATE.value: "exact",
    Decision.STALE.value: "stale",
    Decision.CHANGE_IGNORED.value: "change_ignored",
    Decision.ERASED.value: "erased",
}
log = logging.getLogger(__name__)
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


class WarehouseCollector:
    """The counters as a prometheus-client collector: read from the warehouse at scrape time, at most every `max_age` s.

    Reading the totals counts the decision log, so scrapes within `max_age`
    seconds of the last read (several Prometheus replicas, a short scrape
    interval) are answered from that read. `dedup_warehouse_up` is 1 when the
    figures are fresh from the warehouse; when it cannot be read, it is 0 and
    no other figure is served (never stale counts passed off as current).
    """

    def __init__(self, engine: Engine, max_age: float = 30.0) -> None:
        self.engine, self.max_age = engine, max_age
        self._lock = threading.Lock()
        self._families: list = []
        self._read_at = -float("inf")

    def collect(self):
        with self._lock:
            if time.monotonic() - self._read_at >= self.max_age:
                try:
                    with self.engine.connect() as conn:
                        self._families = list(registry(conn).collect())
                    self._read_at = time.monotonic()
                except Exception:  # noqa: BLE001 - any failure to read is reported as the warehouse being down
                    log.exception("metrics: could not read the warehouse")
                    self._families, self._read_at = [], -float("inf")
            families = self._families
        up = GaugeMetricFamily("dedup_warehouse_up", "1 if the figures were read from the warehouse, 0 if it could not be read.")
        up.add_metric([], 1 if families else 0)
        return iter([up, *families])


def serve(engine: Engine, port: int, address: str = "0.0.0.0", max_age: float = 30.0) -> WSGIServer:
    """Serve the counters over HTTP (any path, `/metrics` by convention) from a background thread.

    Returns the server: its `server_port` is the port bound (useful with port 0),
    and `shutdown()` stops it.
    """
    reg = CollectorRegistry()
    reg.register(WarehouseCollector(engine, max_age))
    server, _thread = start_http_server(port, addr=address, registry=reg)
    return server
