"""Near-duplicate parameters, identities and the library entry points."""

from __future__ import annotations

import dataclasses

import pytest

from dedup_pipeline.core.lsh import candidate_probability
from dedup_pipeline.core.near import (
    DEFAULT_THRESHOLD,
    NearDupParams,
    cluster_near_duplicates,
    make_params,
    near_duplicate_links,
)
from dedup_pipeline.core.text import TextNormaliser

ARTICLE = (
    "The city council met on Tuesday to discuss the new budget for public transport, "
    "including additional bus routes, longer opening hours for the metro and a plan to "
    "replace the oldest trams before the end of the decade. Several members asked how "
    "the extra services would be paid for, and the treasurer answered that fares would "
    "stay the same for at least two years while a regional grant covers the gap. "
    "Residents who spoke at the meeting welcomed the night buses but worried about "
    "construction noise near the depot, which the council promised to limit to daytime. "
    "A final vote on the plan is expected next month after a public consultation."
)
# The same article as another site serves it: light edits, a byline, different punctuation.
EDITED = (
    "By Staff Reporter | The City Council met on Wednesday to discuss the new budget for "
    "public transport -- including additional bus routes, longer opening hours for the "
    "metro and a plan to replace the oldest trams before the end of the decade. Several "
    "members asked how the extra services would be paid for; the treasurer answered that "
    "fares would stay the same for at least two years while a regional grant covers the "
    "gap. Residents who spoke at the meeting welcomed the night buses but worried about "
    "construction noise near the depot, which the council promised to limit to daytime. "
    "A final vote on the plan is expected next month after a public consultation. Share this."
)
RECIPE = (
    "A recipe for bread: mix flour, water, salt and yeast, knead for ten minutes, let it "
    "rise for two hours, shape the loaf and bake it in a very hot oven until the crust is "
    "dark and the loaf sounds hollow when tapped underneath. Let it cool on a rack before "
    "slicing, or the crumb will be gummy; it keeps for three days in a paper bag."
)
SAME_TOPIC = (
    "Public transport funding was on the agenda again: the council wants more buses and "
    "new trams, but the budget is tight and residents are divided about the depot plans."
)


@pytest.mark.parametrize(
    "options",
    [{}, {"verify": "exact"}, {"method": "simhash"}, {"num_perm": 256}, {"representative": "longest"}],
)
def test_edited_copy_clusters_with_its_article_and_unrelated_texts_do_not(options):
    texts = [RECIPE, ARTICLE, SAME_TOPIC, EDITED, "", RECIPE.upper()]
    labels = cluster_near_duplicates(texts, **options)
    assert labels[1] == labels[3]
    assert labels[0] == labels[5]
    assert len({labels[0], labels[1], labels[2], labels[4]}) == 4
    if options.get("representative") == "longest":
        assert labels[1] == 3  # the edited copy is the longer text
    else:
        assert labels == [0, 1, 2, 1, 4, 0]


def test_empty_and_short_texts_are_never_linked_to_anything():
    texts = ["", "   ", "!!!", "\n", "a", "b", "ok", "yes", "", "a"]
    for method in ("minhash", "simhash"):
        labels = cluster_near_duplicates(texts, method=method)
        # empty texts stay singletons; only the two identical short texts join
        assert labels == [0, 1, 2, 3, 4, 5, 6, 7, 8, 4], method
        links = near_duplicate_links(texts, NearDupParams(method=method))
        assert {(i, j) for i, j, _ in links} == {(4, 9)}


def test_links_are_sorted_pairs_with_similarities():
    texts = [ARTICLE, RECIPE, EDITED, ARTICLE]
    links = near_duplicate_links(texts)
    assert [(i, j) for i, j, _ in links] == [(0, 2), (0, 3), (2, 3)]
    assert links[1][2] == 1.0
    assert all(DEFAULT_THRESHOLD <= s <= 1.0 for _, _, s in links)
    exact = near_duplicate_links(texts, NearDupParams(verify="exact"))
    assert [(i, j) for i, j, _ in exact] == [(0, 2), (0, 3), (2, 3)]
    simhash = near_duplicate_links(texts, NearDupParams(method="simhash"))
    assert (0, 3, 1.0) in simhash
    assert all(s in {1 - d / 64 for d in range(4)} for _, _, s in simhash)  # distance <= 3


@pytest.mark.parametrize("verify", ["estimate", "exact"])
def test_threshold_controls_linking(verify):
    texts = [ARTICLE, EDITED]
    (link,) = near_duplicate_links(texts, NearDupParams(verify=verify))
    similarity = link[2]
    assert cluster_near_duplicates(texts, threshold=similarity, verify=verify) == [0, 0]
    assert cluster_near_duplicates(texts, threshold=min(similarity + 0.05, 1.0), verify=verify) == [0, 1]


def test_auto_verification_decides_a_pair_too_close_to_call_by_the_exact_jaccard():
    texts = [ARTICLE, EDITED]
    [(_, _, estimate)] = near_duplicate_links(texts, NearDupParams(verify="estimate"))
    [(_, _, exact)] = near_duplicate_links(texts, NearDupParams(verify="exact"))
    assert estimate != exact
    threshold = (estimate + exact) / 2  # the estimate and the exact Jaccard fall on either side of it
    decided = {
        verify: near_duplicate_links(texts, NearDupParams(threshold=threshold, verify=verify))
        for verify in ("estimate", "exact", "auto")
    }
    assert decided["auto"] == decided["exact"] != decided["estimate"]
    # far from the threshold the estimate decides alone: the stored similarity is the estimate
    assert (
        near_duplicate_links(texts, NearDupParams(threshold=min(estimate, exact) - 0.2, verify="auto"))[0][2]
        == estimate
    )


def test_results_are_deterministic():
    texts = [ARTICLE, EDITED, RECIPE, SAME_TOPIC] * 3
    assert cluster_near_duplicates(texts) == cluster_near_duplicates(list(texts))
    assert cluster_near_duplicates(texts) == [0, 0, 2, 3] * 3


def test_default_params_and_banding():
    params = NearDupParams()
    assert params.threshold == DEFAULT_THRESHOLD
    assert params.normaliser == TextNormaliser(shingle="word", ngram=3)
    assert NearDupParams(method="simhash").normaliser == TextNormaliser(shingle="char", ngram=4)
    assert params.bands * params.rows <= params.num_perm
    assert candidate_probability(params.threshold, params.bands, params.rows) > 0.95
    assert params.bands * (2 + 8 + 8) <= 600  # warehouse bytes per document
    assert NearDupParams(bands=16, rows=8).bands == 16


def test_identity_names_everything_that_shapes_the_index():
    base = NearDupParams()
    identity = base.identity()
    for part in ("scheme=affine32", "num_perm=128", f"bands={base.bands}", f"rows={base.rows}", "n=3", "text/1"):
        assert part in identity
    assert identity == NearDupParams().identity()
    changed = [
        NearDupParams(num_perm=64),
        NearDupParams(seed=2),
        NearDupParams(bands=16, rows=8),
        NearDupParams(normaliser=TextNormaliser(ngram=4)),
        NearDupParams(normaliser=TextNormaliser(digits="mask")),
        NearDupParams(method="simhash"),
    ]
    assert len({p.identity() for p in changed} | {identity}) == len(changed) + 1
    # settings that only act on query results do not change the index identity
    assert NearDupParams(verify="exact", representative="longest").identity() == identity
    assert NearDupParams(threshold=0.5, bands=base.bands, rows=base.rows).identity() == identity
    simhash = NearDupParams(method="simhash")
    assert NearDupParams(method="simhash", simhash_max_distance=4).identity() != simhash.identity()


def test_params_validate():
    for bad in (
        {"method": "lsh"},
        {"scheme": "legacy"},
        {"threshold": 0.0},
        {"verify": "maybe"},
        {"representative": "newest"},
        {"bands": 10},
        {"bands": 100, "rows": 2},
        {"simhash_max_distance": 64},
    ):
        with pytest.raises(ValueError):
            NearDupParams(**bad)
    with pytest.raises(dataclasses.FrozenInstanceError):
        NearDupParams().threshold = 0.1  # type: ignore[misc]


def test_make_params_routes_options():
    params = make_params(0.7, "minhash", ngram=5, shingle="char", verify="exact")
    assert params.normaliser == TextNormaliser(shingle="char", ngram=5)
    assert params.threshold == 0.7 and params.verify == "exact"
    assert make_params(method="simhash", ngram=5).normaliser == TextNormaliser(shingle="char", ngram=5)
    with pytest.raises(TypeError):
        make_params(colour="blue")
    with pytest.raises(TypeError):
        make_params(normaliser=TextNormaliser(), ngram=2)
