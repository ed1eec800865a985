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
