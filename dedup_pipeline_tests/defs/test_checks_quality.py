"""The judgements behind the asset checks, on SQLite and the real PostgreSQL: collapse history, integrity, figures."""

from __future__ import annotations

import pytest
from sqlalchemy import inspect, insert, select, text, update

from dedup_pipeline.core.near import NearDupParams
from dedup_pipeline.cli.demo import write_demo_crawl
from dedup_pipeline.ladder.canonical import canonicalise_batch
from dedup_pipeline.ladder.exact import deduplicate_batch
from dedup_pipeline.ladder.near import cluster_batch
from dedup_pipeline.ladder.raw import ingest_raw_batch
from dedup_pipeline.ladder.settings import LadderSettings
from dedup_pipeline.landing import find_batch, list_batches
from dedup_pipeline.quality.collapse import BatchRate, CollapseRules, judge_collapse
from dedup_pipeline.quality.figures import batch_funnel, cluster_preview
from dedup_pipeline.quality.history import batch_rates
from dedup_pipeline.quality.integrity import check_batch_integrity
from dedup_pipeline.quality.quarantine import quarantine_report
from dedup_pipeline.store.schema import dedup_decisions, record_hashes, records
from dedup_pipeline.store.warehouse import utcnow
from dedup_pipeline_tests.helpers import listing, write_batch
from dedup_pipeline_tests.helpers import new_run_id

DAY = 86400.0
SETTINGS = LadderSettings(chunk_size=50)


def run_rungs(warehouse, folder, key, run_id=None, near=True):
    raw = ingest_raw_batch(warehouse, find_batch(folder, key))
    canonical = canonicalise_batch(warehouse, key, SETTINGS)
    exact = deduplicate_batch(warehouse, key, run_id or new_run_id(key), SETTINGS)
    clusters = cluster_batch(warehouse, key, NearDupParams(threshold=0.5)) if near else None
    return raw, canonical, exact, clusters


# ------------------------------------------------------------------ the verdict (pure)

def rates(*values, n=200):
    return [BatchRate(f"b{i}", n, round(v * n)) for i, v in enumerate(values)]


def test_fixed_band_applies_without_history():
    rules = CollapseRules(band_low=0.01, band_high=0.95, min_records=100)
    assert judge_collapse(BatchRate("x", 200, 40), [], rules).passed
    low = judge_collapse(BatchRate("x", 200, 0), [], rules)  # a first crawl, or a leak from day one: a warning
    assert not low.passed and not low.error and "below the fixed band" in low.note and "no history" in low.note
    high = judge_collapse(BatchRate("x", 200, 198), [], rules)
    assert not high.passed and not high.error and "above the fixed band" in high.note
    small = judge_collapse(BatchRate("x", 50, 0), [], rules)
    assert small.passed and "too small" in small.note


def test_history_catches_a_collapse_the_fixed_band_lets_through():
    rules = CollapseRules(band_low=0.01, min_records=100)
    history = rates(0.31, 0.33, 0.35, 0.32)
    leaked = judge_collapse(BatchRate("x", 200, 10), history, rules)  # 0.05: inside the fixed band
    assert not leaked.passed and leaked.error
    assert "collapsed toward zero" in leaked.note and leaked.trailing_median == pytest.approx(0.325)
    assert leaked.lower_bound == pytest.approx(0.325 * 0.25)
    normal = judge_collapse(BatchRate("x", 200, 56), history, rules)  # 0.28: ordinary variation
    assert normal.passed and normal.note == "in band"


def test_history_catches_a_jump_and_ignores_small_batches():
    rules = CollapseRules(min_records=100, min_history=3)
    history = rates(0.30, 0.32, 0.34) + [BatchRate("tiny", 10, 10)]  # the tiny batch is no evidence
    jump = judge_collapse(BatchRate("x", 200, 160), history, rules)  # 0.8, still inside the fixed band
    assert not jump.passed and not jump.error and "jumped far above" in jump.note
    assert jump.history == (0.30, 0.32, 0.34)
    too_little = judge_collapse(BatchRate("x", 200, 160), history[:2], rules)  # two batches: band only
    assert too_little.passed and too_little.trailing_median is None


# ------------------------------------------------------------------ history from the decision log

def sliding_batches(folder, count, leak_in=None, per_batch=120, step=80):
    """Batch k holds listings [80k, 80k+120): 40 of them seen in batch k-1 (collapse rate 1/3)."""
    keys = []
    for k in range(count):
        extra = (lambda n: {"view_count": 1000 * k + n}) if k == leak_in else (lambda n: {})
        lines = [listing(n, **extra(n)) for n in range(step * k, step * k + per_batch)]
        keys.append(f"2026-11-{k + 1:02d}")
        write_batch(folder, keys[-1], lines, landed=1_700_000_000 + k * DAY)
    return keys


def test_history_is_the_first_decision_per_line_and_survives_a_replay(warehouse, tmp_path):
    folder = tmp_path / "landing"
    keys = sliding_batches(folder, 5, leak_in=4)
    for key in keys:
        run_rungs(warehouse, folder, key, near=False)
    replay = run_rungs(warehouse, folder, keys[2], run_id="replay", near=False)[2]
    assert replay.collapse_rate == 1.0  # a replay finds everything stored...

    with warehouse.engine.connect() as conn:
        current, history = batch_rates(conn, keys[2], window=10)
        assert (current.records_in, current.duplicates) == (120, 40)  # ...but the batch's rate is its first run's
        assert [h.batch_id for h in history] == [keys[1], keys[0]]
        assert [h.rate for h in history] == [pytest.approx(1 / 3), 0.0]
        leaked, before = batch_rates(conn, keys[4], window=3)
    assert [h.batch_id for h in before] == [keys[3], keys[2], keys[1]]
    # A field that changes every crawl (view_count) leaked into content/1: the overlap is "changed", not a duplicate.
    assert leaked.duplicates == 0 and leaked.records_in == 120
    verdict = judge_collapse(leaked, before, CollapseRules(min_records=100))
    assert not verdict.passed and verdict.error and "collapsed toward zero" in verdict.note


def test_history_is_the_batch_s_own_source_and_counts_only_judged_batches(warehouse, tmp_path):
    """Breaks: a new source's first crawl lands after batches of another source; a small batch sits in a source's
    history. Once, the first crawl was judged against the other source's median (an ERROR, "a leaked field"),
    and the small batch used up a place in the window without being judged.

    Must hold: history is the batch's own source (dated keys name it; keys naming none are one source), the
    window holds `window` judged batches, and a first crawl with no history is at most a warning.
    """
    folder = tmp_path / "landing"
    keys = []
    for k in range(4):  # shop-a: 40 of each batch's 120 listings seen the day before (rate 1/3 from day 2)
        keys.append(f"2026-11-{k + 1:02d}-shop-a")
        write_batch(folder, keys[-1], [listing(n) for n in range(80 * k, 80 * k + 120)], landed=1_700_000_000 + k * DAY)
    write_batch(folder, "2026-11-05-shop-b", [listing(5000 + n) for n in range(150)], landed=1_700_000_000 + 4 * DAY)
    write_batch(folder, "2026-11-06-shop-a", [listing(n) for n in range(300, 330)], landed=1_700_000_000 + 5 * DAY)
    write_batch(folder, "2026-11-07-shop-a", [listing(n) for n in range(320, 440)], landed=1_700_000_000 + 6 * DAY)
    for key in [*keys, "2026-11-05-shop-b", "2026-11-06-shop-a", "2026-11-07-shop-a"]:
        run_rungs(warehouse, folder, key, near=False)
    with warehouse.engine.connect() as conn:
        first_crawl, none_before = batch_rates(conn, "2026-11-05-shop-b", window=3, min_records=100)
        _, judged = batch_rates(conn, "2026-11-07-shop-a", window=3, min_records=100)
    assert none_before == [] and first_crawl.rate == 0.0
    verdict = judge_collapse(first_crawl, none_before, CollapseRules(min_records=100))
    assert not verdict.passed and not verdict.error and "no history of this source" in verdict.note
    assert [h.batch_id for h in judged] == [keys[3], keys[2], keys[1]]  # not shop-b, not the 30-line batch


# ------------------------------------------------------------------ integrity

def test_integrity_passes_on_a_clean_warehouse_and_counts_each_violation(warehouse, tmp_path):
    folder = tmp_path / "landing"
    keys = sliding_batches(folder, 2)
    for key in keys:
        run_rungs(warehouse, folder, key, near=False)
    with warehouse.engine.connect() as conn:
        clean = check_batch_integrity(conn, keys[1])
    # the batch's 120 listings: 80 it stored, 40 re-crawled unchanged from batch 1 (their rows are dated to it)
    assert clean.passed and clean.rows_checked == 120 and clean.active_version == "content/1"

    with warehouse.engine.begin() as conn:
        victim = conn.execute(select(records.c.record_id).where(records.c.last_batch_id == keys[1]).limit(1)).scalar()
        conn.execute(update(record_hashes).where(record_hashes.c.record_id == victim, record_hashes.c.hash_version == "content/2")
                     .values(content_hash=b"\x01" * 31))
        conn.execute(insert(dedup_decisions).values(
            batch_id=keys[1], line_no=999, run_id="rogue", natural_key="k", hash_version="content/9",
            content_hash=b"\x02" * 32, decision="new", decided_at=utcnow()))
    with warehouse.engine.connect() as conn:
        broken = check_batch_integrity(conn, keys[1])
        other = check_batch_integrity(conn, keys[0])
    assert (broken.malformed_hashes, broken.unknown_versions) == (1, 1) and not broken.passed
    assert (broken.duplicate_content, broken.duplicate_keys) == (0, 0)
    assert other.passed  # scoped to the batch's rows


@pytest.mark.postgres
def test_integrity_finds_duplicates_once_the_constraints_are_gone(pg_database_url, tmp_path):
    from dedup_pipeline.store.warehouse import Warehouse
    from sqlalchemy import create_engine

    engine = create_engine(pg_database_url)
    with engine.begin() as conn:
        conn.execute(text("DROP SCHEMA public CASCADE; CREATE SCHEMA public"))
    engine.dispose()
    warehouse = Warehouse(pg_database_url).create_schema()
    folder = tmp_path / "landing"
    [key] = sliding_batches(folder, 1)
    run_rungs(warehouse, folder, key, near=False)
    with warehouse.engine.begin() as conn:  # a migration that dropped the constraints, then a buggy writer
        for constraint in inspect(conn).get_unique_constraints("records"):
            conn.execute(text(f'ALTER TABLE records DROP CONSTRAINT "{constraint["name"]}"'))
        row = conn.execute(select(records).limit(1)).mappings().one()
        conn.execute(insert(records).values({k: v for k, v in row.items() if k != "record_id"}))
    with warehouse.engine.connect() as conn:
        report = check_batch_integrity(conn, key)
    warehouse.dispose()
    assert (report.duplicate_content, report.duplicate_keys) == (2, 2) and not report.passed


# ------------------------------------------------------------------ figures and quarantine

def test_funnel_and_cluster_preview_match_the_rung_reports(warehouse, tmp_path):
    folder = tmp_path / "landing"
    write_demo_crawl(folder)
    reports = {b.key: run_rungs(warehouse, folder, b.key) for b in list_batches(folder)}
    with warehouse.engine.connect() as conn:
        for key, (raw, canonical, exact, near) in reports.items():
            funnel = batch_funnel(conn, key)
            assert (funnel["lines"], funnel["parsed"], funnel["canonical"], funnel["exact_survivors"]) == (
                raw.lines, raw.parsed, canonical.canonical, exact.survivors)
            # near duplicates found when the batch ran stay clustered; later batches can only add more
            assert 0 <= funnel["near_distinct"] <= exact.survivors - len(near.near_duplicates)
        syndication = reports["2026-11-02-syndication"][3]
        assert batch_funnel(conn, "2026-11-02-syndication")["near_distinct"] == 0  # every copy has its original
        preview = cluster_preview(conn, syndication.clusters)
        quarantined = quarantine_report(conn, "2026-11-01-shop")
    assert {row["cluster_id"]: row["records"] for row in preview} == syndication.clusters
    assert all(row["batches"] == 2 and 0.5 <= row["min_similarity"] <= row["max_similarity"] <= 1 for row in preview)
    assert all(row["representative"] >= row["cluster_id"] for row in preview)
    raw = reports["2026-11-01-shop"][0]
    assert quarantined.lines == raw.lines and quarantined.quarantined == 2
    assert quarantined.by_rung == {"raw": 1, "canonical": 1} and sum(n for _, _, n in quarantined.top_reasons) == 2
