"""The decision log as JSON events and the Prometheus counters, from a real run of the ladder."""

from __future__ import annotations

import json
import logging

import pytest

from prometheus_client.parser import text_string_to_metric_families

from dedup_pipeline.decision_log import iter_events
from dedup_pipeline.ladder.canonical import canonicalise_batch
from dedup_pipeline.ladder.exact import deduplicate_batch
from dedup_pipeline.ladder.raw import ingest_raw_batch
from dedup_pipeline.ladder.settings import LadderSettings
from dedup_pipeline.landing import find_batch
from dedup_pipeline.metrics import prometheus_text
from dedup_pipeline.store.seen_set import BloomSeenSet
from dedup_pipeline_tests.helpers import listing, write_batch

SECRET = "private-marker-8c1f"


def test_decision_events_and_counters(warehouse, tmp_path, caplog):
    folder = tmp_path / "landing"
    lines = [listing(n, seller_id=SECRET) for n in range(10)] + [listing(n, crawl_id="again", seller_id=SECRET) for n in range(4)]
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
        for family in text_string_to_metric_families(text) for sample in family.samples
    }
    assert metrics[("scraper_records_seen_total", ())] == 15
    assert metrics[("scraper_duplicates_skipped_total", (("type", "exact"),))] == 4
    assert metrics[("scraper_records_stored_total", (("type", "new"),))] == 10
    assert metrics[("scraper_records_quarantined_total", ())] == 1
    assert ("dedup_seen_set_total", (("outcome", "hits"),)) in metrics
    assert metrics[("dedup_seen_set_fill", ())] == pytest.approx(10 / 10_000_000, rel=0.2)  # 10 digests, default size
