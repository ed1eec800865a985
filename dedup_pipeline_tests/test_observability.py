"""The decision log as JSON events and the Prometheus counters, from a real run of the ladder."""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import secrets
import signal
import subprocess
import sys
import urllib.request
from datetime import timedelta
from pathlib import Path

import promql_parser
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import create_engine, func, select

from dedup_pipeline.cli import _listen_address
from dedup_pipeline.core.erasure import Subject
from dedup_pipeline.core.near import NearDupParams
from dedup_pipeline.decision_log import iter_events
from dedup_pipeline.environment import TOMBSTONE_KEY_ENV
from dedup_pipeline.ladder.canonical import canonicalise_batch
from dedup_pipeline.ladder.erasure import erase_subject
from dedup_pipeline.ladder.exact import deduplicate_batch
from dedup_pipeline.ladder.near import cluster_batch, rebuild_index
from dedup_pipeline.ladder.raw import ingest_raw_batch
from dedup_pipeline.ladder.retention import RetentionSettings, prune_retention
from dedup_pipeline.ladder.settings import LadderSettings, NearSettings
from dedup_pipeline.landing import find_batch
from dedup_pipeline.metrics import prometheus_text, seed_figures, serve
from dedup_pipeline.store.schema import dedup_decisions, near_duplicate_links, quarantine
from dedup_pipeline.store.seen_set import BloomSeenSet
from dedup_pipeline.store.warehouse import utcnow
from dedup_pipeline_tests.helpers import listing, write_batch

SECRET = "private-marker-8c1f"


def test_decision_events_and_counters(warehouse, tmp_path, caplog):
    folder = tmp_path / "landing"
    lines = [listing(n, seller_id=SECRET) for n in range(10)] + [
        listing(n, crawl_id="again", seller_id=SECRET) for n in range(4)
    ]
    write_batch(folder, "b1", lines + ["{broken"], landed=1e9)
    ingest_raw_batch(warehouse, find_batch(folder, "b1"))
    canonicalise_batch(warehouse, "b1", LadderSettings())
    with caplog.at_level(logging.INFO, logger="dedup_pipeline.decisions"):
        deduplicate_batch(warehouse, "b1", "run-1", LadderSettings(chunk_size=5), BloomSeenSet(tmp_path / "bloom"))

    logged = [json.loads(r.getMessage()) for r in caplog.records if r.name == "dedup_pipeline.decisions"]
    with warehouse.engine.connect() as conn:
        stored = list(iter_events(conn, batch_id="b1", chunk=3))
        text = prometheus_text(conn)
    assert len(logged) == len(stored) == 14
    assert {e["decision"] for e in stored} == {"new", "exact_duplicate"}
    first = stored[0]
    assert first["event"] == "dedup_decision" and len(first["content_hash"]) == 64 and first["run_id"] == "run-1"
    assert set(first) >= {"ts", "hash_version", "record_key", "batch_id", "line_no"}
    assert SECRET not in json.dumps(stored) + json.dumps(logged)  # keys and digests, never field values

    metrics = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }
    assert metrics[("scraper_records_seen_total", ())] == 15
    assert metrics[("scraper_duplicates_skipped_total", (("type", "exact"),))] == 4
    assert metrics[("scraper_records_stored_total", (("type", "new"),))] == 10
    assert metrics[("scraper_records_quarantined_total", ())] == 1
    assert ("dedup_seen_set_total", (("outcome", "hits"),)) in metrics
    assert metrics[("dedup_seen_set_fill", ())] == pytest.approx(10 / 10_000_000, rel=0.2)  # 10 digests, default size


def _ladder(warehouse, folder, batch, lines):
    write_batch(folder, batch, lines, landed=1e9)
    ingest_raw_batch(warehouse, find_batch(folder, batch))
    canonicalise_batch(warehouse, batch, LadderSettings())
    deduplicate_batch(warehouse, batch, f"run-{batch}", LadderSettings())


def _scrape(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as response:
        assert response.status == 200
        text = response.read().decode("utf-8")
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


SEEN = ("scraper_records_seen_total", ())
UP = ("dedup_warehouse_up", ())


def test_the_metrics_endpoint_serves_the_warehouse_counters_at_most_max_age_old(warehouse, tmp_path):
    _ladder(warehouse, tmp_path, "b1", [listing(n) for n in range(6)] + [listing(1, crawl_id="again")])
    fresh = serve(warehouse.engine, 0, "127.0.0.1", max_age=0)
    cached = serve(warehouse.engine, 0, "127.0.0.1", max_age=3600)
    try:
        fresh_url, cached_url = (f"http://127.0.0.1:{s.server_port}/metrics" for s in (fresh, cached))
        first = _scrape(fresh_url)
        assert first[UP] == 1 and first[SEEN] == 7
        assert not [name for name, _ in first if name.endswith("_created")]  # no time stamp of the read posing as one
        assert first[("scraper_duplicates_skipped_total", (("type", "exact"),))] == 1
        assert _scrape(cached_url)[SEEN] == 7
        _ladder(warehouse, tmp_path, "b2", [listing(n) for n in range(4, 9)])
        assert _scrape(fresh_url)[SEEN] == 12  # read again at every scrape
        assert _scrape(cached_url)[SEEN] == 7  # answered from its read of the last hour
    finally:
        fresh.shutdown()
        cached.shutdown()


def test_the_metrics_endpoint_reports_an_unreadable_warehouse_as_down(tmp_path):
    engine = create_engine("postgresql+psycopg://postgres@127.0.0.1:1/nowhere?connect_timeout=2")
    server = serve(engine, 0, "127.0.0.1", max_age=3600)
    try:
        scraped = _scrape(f"http://127.0.0.1:{server.server_port}/metrics")
    finally:
        server.shutdown()
        engine.dispose()
    assert scraped == {UP: 0.0}  # no stale or made-up counts beside it


@pytest.mark.parametrize("warehouse_url", ["sqlite"], indirect=True)
def test_dedup_pipeline_metrics_serve_until_terminated(warehouse, warehouse_url, tmp_path):
    _ladder(warehouse, tmp_path, "b1", [listing(n) for n in range(3)])
    environment = {k: v for k, v in os.environ.items() if not k.startswith("DEDUP_")}
    process = subprocess.Popen(
        [sys.executable, "-m", "dedup_pipeline.cli", "metrics", "--serve", "127.0.0.1:0", "--max-age", "0"],
        env={**environment, "DEDUP_DATABASE_URL": warehouse_url},
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        banner = process.stdout.readline()
        url = re.search(r"http://\S+/metrics", banner)
        assert url, banner
        assert _scrape(url.group(0))[SEEN] == 3
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=20) == 0
    finally:
        if process.poll() is None:
            process.kill()
        process.stdout.close()
        process.stderr.close()


@pytest.mark.parametrize(
    "value, expected",
    [
        ("9108", ("0.0.0.0", 9108)),
        ("127.0.0.1:0", ("127.0.0.1", 0)),
        ("[::1]:9108", ("::1", 9108)),
    ],
)
def test_metrics_listen_address(value, expected):
    assert _listen_address(value) == expected


@pytest.mark.parametrize("value", ["", "host", "host:port", "1:70000"])
def test_metrics_listen_address_refuses_what_is_not_a_port(value):
    with pytest.raises(argparse.ArgumentTypeError):
        _listen_address(value)


def _counters(warehouse) -> dict:
    with warehouse.engine.connect() as conn:
        return {
            (sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(prometheus_text(conn))
            for sample in family.samples
            if sample.name.endswith("_total")
        }


def test_counters_never_go_down_when_retention_and_erasure_delete_rows(warehouse, tmp_path, monkeypatch):
    """Prometheus reads a counter that goes down as a reset and a burst: pruning and erasing must not move them."""
    monkeypatch.setenv(TOMBSTONE_KEY_ENV, secrets.token_hex(32))
    twin = listing(
        40, url="https://mirror.example.net/kettle-4", description=listing(4)["description"] + " today", seller_id="s-X"
    )
    lines = [listing(n) for n in range(8)] + [listing(1, crawl_id="again"), twin, "{broken"]
    write_batch(tmp_path, "b1", lines, landed=1e9)
    ingest_raw_batch(warehouse, find_batch(tmp_path, "b1"))
    canonicalise_batch(warehouse, "b1", LadderSettings())
    deduplicate_batch(warehouse, "b1", "run-1", LadderSettings())
    cluster_batch(warehouse, "b1", NearSettings(params=NearDupParams(threshold=0.5)), run_id="run-1")
    before = _counters(warehouse)
    assert before[("scraper_records_seen_total", ())] == 11
    assert before[("scraper_records_quarantined_total", ())] == 1
    assert before[("scraper_duplicates_skipped_total", (("type", "exact"),))] == 1
    assert before[("scraper_near_duplicates_flagged_total", ())] >= 1

    assert erase_subject(warehouse, Subject.parse("field", "s-X", field="seller_id"), "req-1").removed["records"] == 1
    pruned = prune_retention(
        warehouse, RetentionSettings(decision_days=1, quarantine_days=1), now=utcnow() + timedelta(days=30)
    )
    with warehouse.engine.connect() as conn:  # the rows the counters once were counts of are gone
        left = {
            t.name: conn.execute(select(func.count()).select_from(t)).scalar_one()
            for t in (dedup_decisions, quarantine, near_duplicate_links)
        }
    assert pruned.pruned["dedup_decisions"] >= 9 and left == {
        "dedup_decisions": 0,
        "quarantine": 0,
        "near_duplicate_links": 0,
    }
    assert _counters(warehouse) == before
    # Breaks: a rebuild's figures (rebuild-... runs) were summed too, so rebuilding the index flagged every
    # linked record again.
    rebuild_index(warehouse, NearSettings(params=NearDupParams(threshold=0.5)))
    assert _counters(warehouse) == before


@pytest.mark.parametrize("warehouse_url", ["sqlite"], indirect=True)
def test_the_textfile_says_the_warehouse_is_down_rather_than_keep_the_last_counts(
    warehouse, warehouse_url, tmp_path, monkeypatch, capsys
):
    """Breaks: `metrics --textfile` wrote no `dedup_warehouse_up`, and a failed read left the last file in place,
    so node_exporter kept serving its counts as current and the documented alert could not fire."""
    from dedup_pipeline.cli import main

    _ladder(warehouse, tmp_path, "b1", [listing(n) for n in range(3)])
    path = tmp_path / "dedup.prom"
    monkeypatch.setenv("DEDUP_DATABASE_URL", warehouse_url)
    assert main(["metrics", "--textfile", str(path)]) == 0
    assert "dedup_warehouse_up 1.0" in path.read_text() and "scraper_records_seen_total 3.0" in path.read_text()
    monkeypatch.setenv("DEDUP_DATABASE_URL", "postgresql+psycopg://postgres@127.0.0.1:1/nowhere?connect_timeout=2")
    assert main(["metrics", "--textfile", str(path)]) == 1
    assert path.read_text().splitlines()[-1] == "dedup_warehouse_up 0.0" and "scraper_" not in path.read_text()
    assert capsys.readouterr().err.startswith("dedup-pipeline metrics: error:")


DEPLOY = Path(__file__).resolve().parent.parent / "deploy"
EXPORTED_NAME = re.compile(r"\b(?:scraper|dedup)_[a-z_]+\b")


@pytest.fixture
def served_metric_names(tmp_path):
    """The sample names the exporter serves after a batch on a Bloom seen-set (so its fill gauge is there too)."""
    from dedup_pipeline.store.warehouse import Warehouse

    warehouse = Warehouse(f"sqlite:///{tmp_path / 'served.sqlite'}").create_schema()
    lines = [listing(n) for n in range(5)] + [listing(1, crawl_id="again"), "{broken"]
    write_batch(tmp_path, "b1", lines, landed=1e9)
    ingest_raw_batch(warehouse, find_batch(tmp_path, "b1"))
    canonicalise_batch(warehouse, "b1", LadderSettings())
    deduplicate_batch(warehouse, "b1", "run-1", LadderSettings(), BloomSeenSet(tmp_path / "bloom"))
    server = serve(warehouse.engine, 0, "127.0.0.1", max_age=0)
    try:
        yield {name for name, _ in _scrape(f"http://127.0.0.1:{server.server_port}/metrics")}
    finally:
        server.shutdown()
        warehouse.dispose()


def _check_expression(expr: str, served: set[str]) -> None:
    promql_parser.parse(expr)  # raises ValueError on a syntax error
    named = set(EXPORTED_NAME.findall(expr))
    assert named and named <= served, (expr, named - served)


def test_the_shipped_alert_rules_parse_and_name_only_metrics_the_exporter_serves(served_metric_names):
    rules = [
        rule
        for group in yaml.safe_load((DEPLOY / "prometheus" / "dedup-alerts.yml").read_text())["groups"]
        for rule in group["rules"]
    ]
    assert len(rules) == 7
    for rule in rules:
        _check_expression(rule["expr"], served_metric_names)
        assert rule["labels"]["severity"] in {"warning", "critical"}
        assert rule["annotations"]["summary"] and rule["annotations"]["description"]


def test_the_shipped_dashboard_queries_parse_and_name_only_metrics_the_exporter_serves(served_metric_names):
    dashboard = json.loads((DEPLOY / "grafana" / "dedup-dashboard.json").read_text())
    targets = [target for panel in dashboard["panels"] for target in panel["targets"]]
    assert len(dashboard["panels"]) == 8 and len({panel["id"] for panel in dashboard["panels"]}) == 8
    for target in targets:
        _check_expression(target["expr"], served_metric_names)
    named = {name for target in targets for name in EXPORTED_NAME.findall(target["expr"])}
    # every counter and gauge of the exporter is on the dashboard
    assert named == {name for name in served_metric_names if not name.endswith("_created")}


def test_a_run_s_figures_carry_the_seeds_metric_names_and_labels():
    """The label mapping lives in dedup_pipeline.metrics alone; the exact rung's metadata takes it from there."""
    from collections import Counter

    figures = seed_figures(12, Counter({"exact_duplicate": 3, "stale": 1, "new": 8}))
    assert figures == {
        "scraper_records_seen_total": 12,  # exactly as Prometheus names them
        'scraper_duplicates_skipped_total{type="exact"}': 3,
        'scraper_duplicates_skipped_total{type="stale"}': 1,
        'scraper_duplicates_skipped_total{type="change_ignored"}': 0,
        'scraper_duplicates_skipped_total{type="erased"}': 0,
    }
