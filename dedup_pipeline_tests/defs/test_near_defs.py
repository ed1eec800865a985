"""The near-duplicate asset in Dagster: the runaway-cluster check blocks, the resource's method defaults."""

from __future__ import annotations

import dagster as dg

from dedup_pipeline.core.near import DEFAULT_NORMALISERS, SKETCH_SETTINGS, NearDupParams
from dedup_pipeline.core.text import TextNormaliser
from dedup_pipeline.defs.checks import RUNAWAY_CHECK
from dedup_pipeline.defs.resources import NearDupResource
from dedup_pipeline_tests.defs.test_checks_dagster import evaluations, run, values
from dedup_pipeline_tests.helpers import listing, write_batch


def test_the_resource_leaves_each_method_its_own_shingles():
    assert (
        NearDupResource().params().normaliser
        == DEFAULT_NORMALISERS["minhash"]
        == TextNormaliser(shingle="auto", ngram=3)
    )
    simhash = NearDupResource(method="simhash").params()
    assert simhash.normaliser == DEFAULT_NORMALISERS["simhash"] == TextNormaliser(shingle="char", ngram=4)
    # identities are those of the library defaults, so existing indexes are not refused
    assert NearDupResource().params().identity() == NearDupParams().identity()
    assert simhash.identity() == NearDupParams(method="simhash").identity()
    # an explicit setting still wins, and changes the identity
    assert NearDupResource(ngram=5).params().normaliser == TextNormaliser(shingle="auto", ngram=5)
    assert NearDupResource(method="simhash", shingle="word").params().normaliser == TextNormaliser(
        shingle="word", ngram=4
    )
    assert NearDupResource(ngram=5).params().identity() != NearDupParams().identity()
    assert NearDupResource(verify="exact").params().verify == "exact"
    # every sketch setting is the index's unless given, and given it is the run's own
    assert NearDupResource(threshold=0.7).settings().from_index == set(SKETCH_SETTINGS)
    pinned = NearDupResource(bands=20, rows=4, shingle="word").settings()
    assert pinned.from_index == set(SKETCH_SETTINGS) - {"bands", "rows", "shingle"}
    assert (pinned.params.bands, pinned.params.rows, pinned.params.normaliser.shingle) == (20, 4, "word")


def test_a_runaway_cluster_fails_the_run_and_names_the_cluster(tmp_path):
    folder, url = tmp_path / "landing", f"sqlite:///{tmp_path / 'w.sqlite'}"
    text = "Refurbished stainless steel kettle with a whistle, a wooden handle and a copper base, boils fast"
    write_batch(folder, "ok", [listing(n) for n in range(60)], landed=1e9)
    write_batch(folder, "copies", [listing(100 + n, description=f"{text} lot {n}") for n in range(60)], landed=1e9 + 1)
    instance = dg.DagsterInstance.ephemeral()
    instance.add_dynamic_partitions("crawl_batches", ["ok", "copies"])

    ok = run(instance, url, folder, "ok")
    assert ok.success and evaluations(ok)[("near_duplicate_clusters", RUNAWAY_CHECK)].passed

    result = run(instance, url, folder, "copies")
    assert not result.success  # the check blocks
    check = evaluations(result)[("near_duplicate_clusters", RUNAWAY_CHECK)]
    assert not check.passed and check.severity == dg.AssetCheckSeverity.ERROR
    meta = values(check.metadata)
    assert meta["batch_records"] == 60 and meta["offending_sizes"] == [60] and len(meta["offending_clusters"]) == 1
    assert "kettle" not in str(meta)  # ids and counts only, never field values
    near = values(result.asset_materializations_for_node("near_duplicate_clusters")[0].metadata)
    assert near["largest_cluster"] == 60 and near["cluster_sizes"] == {"60": 1}


def test_a_pass_carries_the_severity_of_the_failures_that_stand_so_not_judged_shows_yellow(tmp_path):
    """Breaks: the UI colours a check's summary over batches by the newest evaluation's severity whenever any
    batch's latest result failed, and a pass carried Dagster's default ERROR: the blocking runaway check, whose
    only failures were "not judged" warnings, showed red in the asset graph.

    Must hold: a pass carries WARN while the other batches' standing failures are warnings, and ERROR once one
    is a judged error; the check still blocks the run it judged a runaway.
    """
    folder, url = tmp_path / "landing", f"sqlite:///{tmp_path / 'w.sqlite'}"
    text = "Refurbished stainless steel kettle with a whistle, a wooden handle and a copper base, boils fast"
    write_batch(folder, "small", [listing(n) for n in range(10)], landed=1e9)
    write_batch(folder, "ok", [listing(100 + n) for n in range(60)], landed=1e9 + 1)
    write_batch(folder, "copies", [listing(200 + n, description=f"{text} lot {n}") for n in range(60)], landed=1e9 + 2)
    write_batch(folder, "later", [listing(300 + n) for n in range(60)], landed=1e9 + 3)
    instance = dg.DagsterInstance.ephemeral()
    instance.add_dynamic_partitions("crawl_batches", ["small", "ok", "copies", "later"])

    def runaway(key: str):
        result = run(instance, url, folder, key)
        return result, evaluations(result)[("near_duplicate_clusters", RUNAWAY_CHECK)]

    small = runaway("small")[1]
    assert not small.passed and small.severity == dg.AssetCheckSeverity.WARN  # not judged
    ok = runaway("ok")[1]
    assert ok.passed and ok.severity == dg.AssetCheckSeverity.WARN  # the only standing failure is a warning
    blocked, copies = runaway("copies")
    assert not blocked.success and not copies.passed and copies.severity == dg.AssetCheckSeverity.ERROR
    later = runaway("later")[1]
    assert later.passed and later.severity == dg.AssetCheckSeverity.ERROR  # a judged runaway stands: red


def test_a_setting_only_the_other_method_reads_is_refused_not_ignored():
    """Breaks: bands and rows with `method: simhash` (or simhash_max_distance with MinHash) were accepted and did
    nothing, so a run looked tuned while it was not.

    Must hold: the run's settings refuse them, naming them; left to the index's method (empty), they wait for
    the index to say which method it is.
    """
    import pytest

    with pytest.raises(ValueError, match=r"bands, rows: MinHash setting\(s\), which method='simhash' does not use"):
        NearDupResource(method="simhash", bands=4, rows=4).params()
    with pytest.raises(ValueError, match="simhash_max_distance: SimHash setting"):
        NearDupResource(method="minhash", simhash_max_distance=5).params()
    assert NearDupResource(simhash_max_distance=5).params().simhash_max_distance == 5  # the index decides
    assert NearDupResource(method="simhash", simhash_max_distance=5).params().simhash_max_distance == 5
