"""What the UI plots on the ladder's assets: the few figures an operator reads, the rest in one JSON entry."""

from __future__ import annotations

import dagster as dg

from dedup_pipeline.defs.assets import ladder_assets
from dedup_pipeline.defs.partitions import crawl_batches_partitions
from dedup_pipeline.defs.plots import PLOTTED_EXACT_FIGURES
from dedup_pipeline_tests.defs.common import ladder_resources
from dedup_pipeline_tests.helpers import listing, write_batch


def _exact(result) -> dict:
    (materialization,) = result.asset_materializations_for_node("deduplicated_records")
    return materialization.metadata


def test_deduplicated_records_plots_few_figures_and_a_replay_keeps_its_first_run_s_story(tmp_path):
    """Breaks: about 26 numeric entries (so 26 plots, most flat at zero), unrounded floats, the seeds' metric
    names without their `_total`, and a replay whose figures (all exact duplicates, rate 1.0) hid its first run."""
    folder, url = tmp_path / "landing", f"sqlite:///{tmp_path / 'w.sqlite'}"
    write_batch(folder, "a", [listing(n) for n in range(2)], landed=1e9)
    write_batch(folder, "b", [listing(n) for n in range(3)] + [listing(0, crawl_id="x")], landed=1e9 + 60)
    instance = dg.DagsterInstance.ephemeral()
    instance.add_dynamic_partitions(crawl_batches_partitions.name, ["a", "b"])
    resources = ladder_resources(url, folder)
    dg.materialize(ladder_assets, partition_key="a", instance=instance, resources=resources)
    first = dg.materialize(ladder_assets, partition_key="b", instance=instance, resources=resources)
    meta = _exact(first)
    numeric = {k for k, v in meta.items() if isinstance(v, (dg.IntMetadataValue, dg.FloatMetadataValue))}
    assert numeric == set(PLOTTED_EXACT_FIGURES) | {"dagster/row_count"}
    assert meta["collapse_rate"].value == 0.75  # 3 of 4 exact duplicates
    figures = meta["figures"].value
    assert figures["scraper_records_seen_total"] == 4 and figures['scraper_duplicates_skipped_total{type="exact"}'] == 3
    assert meta["stale"].value == 0 and figures["collapse_rate/this_run"] == 0.75  # a count per decision, plotted
    assert meta["first_run"].value == {"exact_duplicate": 3, "new": 1, "collapse_rate": 0.75}
    near = next(iter(first.asset_materializations_for_node("near_duplicate_clusters"))).metadata
    assert near["scraper_near_duplicates_flagged_total"].value == near["near_duplicates"].value

    replay = _exact(dg.materialize(ladder_assets, partition_key="b", instance=instance, resources=resources))
    assert replay["exact_duplicate"].value == 4 and replay["new"].value == 0  # what this run did
    assert replay["figures"].value["collapse_rate/this_run"] == 1.0
    assert replay["collapse_rate"].value == 0.75 and replay["first_run"].value == meta["first_run"].value


def test_float_figures_are_rounded():
    from dedup_pipeline.defs.plots import exact_metadata

    meta = exact_metadata({"collapse_rate": 1 / 3, "seen_set_fill": 2 / 3, "batch_id": "b"}, {"new": 1}, 1 / 3)
    assert meta["collapse_rate"] == 0.3333 and meta["figures"].value == {"seen_set_fill": 0.6667}
    assert meta["batch_id"] == "b" and meta["first_run"].value == {"new": 1, "collapse_rate": 0.3333}
