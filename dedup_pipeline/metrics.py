"""Counters with the seeds' names (and the Bloom seen-set's fill), in the Prometheus text format (prometheus-client).

Computed from the warehouse (the figures each run of the exact and near rungs
keeps), so they are the same whichever worker asks, survive restarts, and never
go down when retention or an erasure deletes rows. Export them with
`dedup-pipeline metrics` (stdout), `dedup-pipeline metrics --textfile PATH` for
node_exporter's textfile collector, or `dedup-pipeline metrics --serve PORT` as
an HTTP endpoint for Prometheus to scrape (`serve`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Mapping
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, generate_latest, start_http_server, write_to_textfile
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from sqlalchemy import Connection, Engine, select

from dedup_pipeline.core.exact import Decision
from dedup_pipeline.store.schema import REBUILD_RUN_PREFIX, exact_rung_runs, near_rung_runs

log = logging.getLogger(__name__)

#: Decisions that skip a record, by the `type` label of scraper_duplicates_skipped_total.
_SKIPPED = {
    Decision.EXACT_DUPLICATE.value: "exact",
    Decision.STALE.value: "stale",
    Decision.CHANGE_IGNORED.value: "change_ignored",
    Decision.ERASED.value: "erased",
}
SEEN_SET_FIGURES = ("seen_set_hits", "seen_set_false_positives", "seen_set_cold_misses", "seen_set_fallbacks")


def seed_figures(records_seen: int, decisions: Mapping[str, int]) -> dict:
    """An exact-rung run's figures under the seeds' metric names and labels, for its asset metadata.

    The counters this module exports are the totals of these figures over every run.
    """
    figures = {"scraper_records_seen_total": records_seen}  # the names exactly as Prometheus shows them
    for decision, label in _SKIPPED.items():
        figures[f'scraper_duplicates_skipped_total{{type="{label}"}}'] = decisions[decision]
    return figures


def _runs_summed(conn: Connection, table, *where) -> tuple[Counter, dict]:
    """The numeric figures of every run in `table` (those `where` keeps), summed; and the figures of the latest run."""
    summed: Counter = Counter()
    latest: dict = {}
    for (stats,) in conn.execute(select(table.c.stats).where(*where).order_by(table.c.finished_at)):
        summed.update({k: v for k, v in stats.items() if isinstance(v, (int, float)) and not isinstance(v, bool)})
        latest = stats
    return summed, latest


def totals(conn: Connection) -> dict:
    """Every counter's value: sums of the rungs' run figures, which only ever grow.

    Not counts of the decision log, the quarantine or the links: retention and
    erasure delete their rows, and a counter that goes down reads to Prometheus
    as a reset followed by a burst of every event counted since. Each run of
    the exact rung over a batch counts its lines again, as the decision log does.
    """
    exact, latest = _runs_summed(conn, exact_rung_runs)
    # A rebuild of the index (`rebuild-near-index`, runs `rebuild-...`) links again what was flagged: no new flags.
    near, _ = _runs_summed(conn, near_rung_runs, near_rung_runs.c.run_id.not_like(f"{REBUILD_RUN_PREFIX}%"))
    return {
        "decisions": Counter({d.value: int(exact[d.value]) for d in Decision if d != Decision.QUARANTINED}),
        "quarantined": int(exact["quarantined"]),
        "near_duplicates_flagged": int(near["near_duplicates"]),
        "seen_set": Counter({name: int(exact[name]) for name in SEEN_SET_FIGURES}),
        "seen_set_fill": latest.get("seen_set_fill"),  # of the latest run (only a Bloom filter has a capacity)
    }


def _counter(name: str, documentation: str, values: dict[tuple[str, ...], float], labels: tuple[str, ...] = ()):
    family = CounterMetricFamily(name, documentation, labels=labels)
    for label_values, value in values.items():
        family.add_metric(list(label_values), value)
    return family


def families(conn: Connection) -> list[Metric]:
    """The counters (and the Bloom fill gauge) as metric families, read from the warehouse.

    Built as families, not as prometheus-client `Counter` objects: those would
    add a `_created` sample stamped with the moment of this read, which is not
    when anything was created and changes at every read.
    """
    figures = totals(conn)
    decisions = figures["decisions"]
    found = [
        _counter(
            "scraper_records_seen",
            "Records that reached the dedup ladder (decided or quarantined).",
            {(): sum(decisions.values()) + figures["quarantined"]},
        ),
        _counter(
            "scraper_duplicates_skipped",
            "Records skipped, by duplicate type.",
            {(label,): decisions[decision] for decision, label in _SKIPPED.items()},
            ("type",),
        ),
        _counter(
            "scraper_records_stored",
            "Records written to the warehouse, by kind.",
            {(d,): decisions[d] for d in (Decision.NEW.value, Decision.CHANGED.value)},
            ("type",),
        ),
        _counter("scraper_records_quarantined", "Lines sent to quarantine.", {(): figures["quarantined"]}),
        _counter(
            "scraper_near_duplicates_flagged",
            "Records the near-duplicate rung linked to others.",
            {(): figures["near_duplicates_flagged"]},
        ),
        _counter(
            "dedup_seen_set",
            "Seen-set fast path: hits confirmed, false positives caught, cold misses, fallbacks.",
            {(name.removeprefix("seen_set_"),): figures["seen_set"][name] for name in SEEN_SET_FIGURES},
            ("outcome",),
        ),
    ]
    if figures["seen_set_fill"] is not None:
        found.append(
            GaugeMetricFamily(
                "dedup_seen_set_fill",
                "Bloom seen-set: digests over capacity after the latest batch (alert well before 1).",
                value=figures["seen_set_fill"],
            )
        )
    return found


class _Read:
    """A collector of families read once."""

    def __init__(self, found: list[Metric]) -> None:
        self.found = found

    def collect(self):
        return iter(self.found)


def _up(read: bool) -> GaugeMetricFamily:
    up = GaugeMetricFamily(
        "dedup_warehouse_up", "1 if the figures were read from the warehouse, 0 if it could not be read."
    )
    up.add_metric([], 1 if read else 0)
    return up


def registry(conn: Connection | None) -> CollectorRegistry:
    """A registry holding `dedup_warehouse_up` and the counters as read now, ready to print or write; without a
    connection (the warehouse could not be read), `dedup_warehouse_up` 0 alone."""
    reg = CollectorRegistry()
    reg.register(_Read([_up(conn is not None), *(families(conn) if conn is not None else [])]))
    return reg


def prometheus_text(conn: Connection) -> str:
    return generate_latest(registry(conn)).decode("utf-8")


def write_textfile(conn: Connection | None, path: str) -> None:
    """Write the counters to `path` atomically (a temporary file beside it, then a rename), as node_exporter expects;
    without a connection, `dedup_warehouse_up` 0 alone, so that no stale count stays served as current."""
    try:
        write_to_textfile(path, registry(conn))
    except OSError as exc:  # its message names the temporary file; the operator gave `path`
        raise OSError(exc.errno, f"cannot write {path}: {exc.strerror}") from exc


class WarehouseCollector:
    """The counters as a prometheus-client collector: read from the warehouse at scrape time, at most every `max_age` s.

    Scrapes within `max_age` seconds of the last read (several Prometheus
    replicas, a short scrape interval) are answered from that read, so the
    warehouse is read at most once per `max_age` whoever scrapes.
    `dedup_warehouse_up` is 1 when the figures were read from the warehouse;
    when it cannot be read, it is 0 and no other figure is served (never
    stale counts passed off as current).
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
                        self._families = families(conn)
                    self._read_at = time.monotonic()
                except Exception as exc:  # noqa: BLE001 - any failure to read is reported as the warehouse being down
                    reason = " ".join(f"{type(exc).__name__}: {exc}".split())[:500]
                    log.warning("dedup-pipeline metrics: could not read the warehouse: %s", reason)
                    self._families, self._read_at = [], -float("inf")
            found = self._families
        return iter([_up(bool(found)), *found])


def serve(engine: Engine, port: int, address: str = "0.0.0.0", max_age: float = 30.0) -> WSGIServer:
    """Serve the counters over HTTP (any path, `/metrics` by convention) from a background thread.

    Returns the server: its `server_port` is the port bound (useful with port 0),
    and `shutdown()` stops it.
    """
    reg = CollectorRegistry()
    reg.register(WarehouseCollector(engine, max_age))
    server, _thread = start_http_server(port, addr=address, registry=reg)
    return server
