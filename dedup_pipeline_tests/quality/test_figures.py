"""The figures the UI plots (dedup_pipeline.quality.figures) and the quarantine report, against the rungs' reports."""

from __future__ import annotations

from dedup_pipeline.cli.demo import write_demo_crawl
from dedup_pipeline.landing import list_batches
from dedup_pipeline.quality.figures import batch_funnel, cluster_preview
from dedup_pipeline.quality.quarantine import quarantine_report
from dedup_pipeline_tests.quality.common import run_rungs


def test_funnel_and_cluster_preview_match_the_rung_reports(warehouse, tmp_path):
    folder = tmp_path / "landing"
    write_demo_crawl(folder)
    reports = {b.key: run_rungs(warehouse, folder, b.key) for b in list_batches(folder)}
    with warehouse.engine.connect() as conn:
        for key, (raw, canonical, exact, near) in reports.items():
            funnel = batch_funnel(conn, key)
            assert (funnel["lines"], funnel["parsed"], funnel["canonical"], funnel["exact_survivors"]) == (
                raw.lines,
                raw.parsed,
                canonical.canonical,
                exact.survivors,
            )
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


def test_the_funnel_keeps_its_canonical_stage_once_staged_rows_are_gone(warehouse, tmp_path):
    """Breaks: the canonical stage counted the staged rows still there, so after the staging retention (or an
    erasure) removed them, a batch read "canonical 0" above "new or changed 30": a funnel that widened.

    Must hold: once decided, the canonical stage is the lines the exact rung decided.
    """
    from sqlalchemy import delete

    from dedup_pipeline.store.schema import canonical_records
    from dedup_pipeline_tests.helpers import listing, write_batch

    folder = tmp_path / "landing"
    write_batch(folder, "b1", [listing(n) for n in range(30)] + ["{broken"], landed=1e9)
    run_rungs(warehouse, folder, "b1")
    with warehouse.engine.begin() as conn:
        before = batch_funnel(conn, "b1")
        conn.execute(delete(canonical_records))
        after = batch_funnel(conn, "b1")
    assert before == after and (after["parsed"], after["canonical"], after["exact_survivors"]) == (30, 30, 30)
