"""Near-duplicate parameters, identities and the library entry points."""

from __future__ import annotations

import dataclasses
import json
import re
import unicodedata

import numpy as np
import pytest
import xxhash
from datasketch import LeanMinHash, MinHash, MinHashLSH, MinHashLSHForest
from hypothesis import given, settings
from hypothesis import strategies as st

from dedup_pipeline.core.lsh import candidate_probability
from dedup_pipeline.core.minhash import minhash_signatures
from dedup_pipeline.core.near import (
    DEFAULT_THRESHOLD,
    MIN_THRESHOLD_RECALL,
    NearDupParams,
    cluster_near_duplicates,
    codes,
    lowest_threshold,
    make_params,
    minhash_links,
    near_duplicate_links,
    serving_bands_rows,
    shingle_texts,
    threshold_recall,
    threshold_warning,
    to_lean_minhashes,
)
from dedup_pipeline.core.text import RULES_VERSION, TextNormaliser

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


@pytest.mark.parametrize("verify", ["auto", "exact", "estimate"])
@pytest.mark.parametrize("threshold", [0.3, 0.5, 0.8])
def test_links_from_texts_are_those_of_the_shingle_lists(verify, threshold):
    """The library signs texts by the compiled path and shingles only what verification needs: the links stay
    those of signing and verifying the full shingle lists."""
    curly = EDITED.replace("--", "—").replace("Staff Reporter", "“Staff Reporter”").replace("council", "council’s")
    texts = [ARTICLE, EDITED, curly, RECIPE, SAME_TOPIC, "Straße café – Köln", "strasse cafe koln", "", "!!!"]
    texts += [t.upper() for t in texts[:3]] + ["Новый бюджет городского совета", "новый бюджет городского совета!"]
    params = NearDupParams(threshold=threshold, verify=verify)
    shingles = shingle_texts(texts, params.normaliser)
    expected = minhash_links(minhash_signatures(shingles, params.num_perm, params.seed), params, shingles)
    assert len(expected) >= 4
    assert near_duplicate_links(texts, params) == expected


def test_results_are_deterministic():
    texts = [ARTICLE, EDITED, RECIPE, SAME_TOPIC] * 3
    assert cluster_near_duplicates(texts) == cluster_near_duplicates(list(texts))
    assert cluster_near_duplicates(texts) == [0, 0, 2, 3] * 3


def test_default_params_and_banding():
    params = NearDupParams()
    assert params.threshold == DEFAULT_THRESHOLD
    assert params.normaliser == TextNormaliser() and params.normaliser.shingle == "auto"
    assert NearDupParams(method="simhash").normaliser == TextNormaliser(shingle="char", ngram=4)
    assert params.bands * params.rows <= params.num_perm
    assert candidate_probability(params.threshold, params.bands, params.rows) > 0.95
    assert params.bands * (2 + 8 + 8) <= 600  # warehouse bytes per document
    assert NearDupParams(bands=16, rows=8).bands == 16


def test_identity_names_everything_that_shapes_the_index():
    base = NearDupParams()
    identity = base.identity()
    for part in ("scheme=affine32", "num_perm=128", f"bands={base.bands}", f"rows={base.rows}", "n=3", RULES_VERSION):
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


# A person record, its copy with typos in the surname and the street, and one with two fields swapped:
# one token in ten changed removes most of a short record's word 3-grams, but few of its words and characters.
PERSON = "margaret thompson 42 wattle street braddon canberra 2612 act 19710312 5512093"
PEOPLE = [
    PERSON,
    "margaret thomson 42 wattle streat braddon canberra 2612 act 19710312 5512093",
    "margaret thompson 42 wattle street canberra braddon 2612 act 19710312 5512093",
    "jonathan ellis 7 banksia crescent kambah canberra 2902 act 19850227 7731046",
    "margaret ellis 15 wattle street braddon canberra 2612 act 19520918 2209113",
]


def test_short_records_with_typos_and_swaps_cluster_at_the_defaults_but_not_under_word_3_grams():
    assert cluster_near_duplicates(PEOPLE) == [0, 0, 0, 3, 4]
    assert cluster_near_duplicates(PEOPLE, shingle="word", ngram=3) == [0, 1, 2, 3, 4]


def test_threshold_recall_is_the_candidate_probability_at_the_threshold():
    assert threshold_recall(0.5, 26, 3) == candidate_probability(0.5, 26, 3) == pytest.approx(1 - (1 - 0.125) ** 26)
    assert threshold_recall(0.5, 26, 3) > threshold_recall(0.4, 26, 3) > threshold_recall(0.3, 26, 3)
    params = NearDupParams()
    assert params.threshold_recall() == threshold_recall(params.threshold, params.bands, params.rows)
    assert NearDupParams(method="simhash").threshold_recall() == 1.0


def test_threshold_warning_only_when_pairs_at_the_threshold_are_likely_missed():
    assert threshold_warning(0.5, 26, 3) is None  # what 26 x 3 was built for
    assert threshold_warning(0.9, 26, 3) is None  # higher thresholds lose nothing
    warning = threshold_warning(0.3, 26, 3)
    assert warning is not None and "0.509" in warning and "26 bands of 3 rows" in warning
    lowest = lowest_threshold(26, 3)
    assert threshold_recall(lowest, 26, 3) == pytest.approx(MIN_THRESHOLD_RECALL)
    assert threshold_warning(lowest + 1e-6, 26, 3) is None and threshold_warning(lowest - 1e-3, 26, 3) is not None
    assert threshold_warning(0.5, 26, 3, min_recall=0.99) is not None  # 0.969 < 0.99
    with pytest.raises(ValueError):
        lowest_threshold(26, 3, 1.0)


@pytest.mark.parametrize("bands, rows", [(26, 3), (9, 14), (20, 5), (128, 1)])
def test_the_least_threshold_a_warning_names_does_not_warn_itself(bands, rows):
    """Breaks: the floor was printed rounded to the nearest 0.001 (0.439 for 26 x 3, whose floor is 0.43926), and
    a threshold of 0.439 then warned again."""
    floor = float(re.search(r"at least (\d\.\d+)", threshold_warning(0.01, bands, rows)).group(1))
    assert threshold_warning(floor, bands, rows) is None
    assert threshold_warning(round(floor - 0.001, 3), bands, rows) is not None


@pytest.mark.parametrize("threshold", [0.95, 0.99])
def test_near_one_the_advice_pins_bands_that_serve_the_threshold(threshold):
    """Breaks: the bands chosen for 0.99 (2 x 59) serve it with probability 0.80, and the warning's advice was to
    build the index "for 0.99": the same bands, the same warning."""
    chosen = NearDupParams(threshold=threshold)
    warning = chosen.threshold_warning()
    if warning is None:  # the chosen bands serve it: nothing to advise
        assert serving_bands_rows(threshold, 128) == (chosen.bands, chosen.rows)
        return
    pinned = json.loads(re.search(r"--config '([^']*)'", warning).group(1))
    assert set(pinned) == {"threshold", "bands", "rows"} and pinned["threshold"] == threshold
    assert (pinned["bands"], pinned["rows"]) == serving_bands_rows(threshold, 128)
    assert NearDupParams(**pinned).threshold_warning() is None
    assert f"NearDupParams(threshold={threshold:g}, bands={pinned['bands']}, rows={pinned['rows']})" in warning


def test_a_threshold_no_index_can_serve_says_so_instead_of_advising_a_rebuild():
    warning = NearDupParams(threshold=0.01).threshold_warning()
    assert serving_bands_rows(0.01, 128) is None
    assert "rebuild-near-index" not in warning and "No index of 128 permutations serves 0.01" in warning
    assert "the lowest any serves is 0.018, with 128 bands of 1 row" in warning
    assert NearDupParams(threshold=0.02).threshold_warning() is None


def test_bands_and_rows_pinned_keep_the_index_identity_whatever_the_threshold():
    built = NearDupParams()
    for threshold in (0.3, 0.6, 0.8):
        moved = built.with_threshold(threshold)
        assert (moved.bands, moved.rows, moved.threshold) == (built.bands, built.rows, threshold)
        assert moved.identity() == built.identity()
        assert dataclasses.replace(built, threshold=threshold).identity() == built.identity()
        assert make_params(threshold, bands=built.bands, rows=built.rows).identity() == built.identity()
        assert NearDupParams.from_dict(moved.as_dict()) == moved
    # left to choose, the bands follow the threshold, and so does the identity
    assert NearDupParams(threshold=0.8).identity() != built.identity()
    assert built.with_threshold(0.3).threshold_warning() == threshold_warning(0.3, built.bands, built.rows)
    assert built.with_threshold(0.6).threshold_warning() is None
    # queries at the new threshold: the pinned bands find the same candidates, verification decides
    texts = [ARTICLE, EDITED, RECIPE]
    [(_, _, similarity)] = near_duplicate_links(texts, built.with_threshold(0.3))
    assert near_duplicate_links(texts, built.with_threshold(similarity + 0.01)) == []


def test_identities_name_earlier_versions_only_where_the_keys_are_unchanged():
    params = NearDupParams()
    assert params.identities() == (params.identity(),)
    # Word 3-grams with marks stripped as text/2 did are text/1's; with them kept (text/3), not for every text.
    assert NearDupParams(normaliser=TextNormaliser(shingle="word", ngram=3)).identities()[1:] == ()
    pinned = NearDupParams(normaliser=TextNormaliser(shingle="word", ngram=3, marks="strip"))
    current, earlier = pinned.identities()
    assert current == pinned.identity() and earlier == current.replace(";text/2;", ";text/1;")
    assert earlier.startswith("neardup/2;method=minhash") and ";shingle=word;n=3" in earlier


@pytest.mark.parametrize("normaliser", [TextNormaliser(), TextNormaliser(shingle="word", ngram=3)])
def test_lean_minhashes_are_datasketchs_own_sketches_of_the_shingles(normaliser):
    params = NearDupParams(num_perm=64, seed=7, normaliser=normaliser)
    texts = [*PEOPLE, ARTICLE, EDITED, "", "!!!"]
    leans = to_lean_minhashes(texts, params)
    assert len(leans) == len(texts) and all(isinstance(m, LeanMinHash) for m in leans)
    for text, lean in zip(texts, leans):
        theirs = MinHash(num_perm=64, seed=7, scheme="affine32", hashfunc=xxhash.xxh32_intdigest)
        theirs.update_batch(normaliser.shingle_bytes(text))
        assert np.array_equal(lean.hashvalues, theirs.hashvalues) and lean.seed == 7
    # ... so datasketch's own indexes take them
    forest = MinHashLSHForest(num_perm=64)
    for i, lean in enumerate(leans[:7]):
        forest.add(i, lean)
    forest.index()
    assert 6 in forest.query(leans[5], 2)  # the edited copy is the article's nearest neighbour
    lsh = MinHashLSH(num_perm=64, params=(16, 4))
    for i, lean in enumerate(leans[:7]):
        lsh.insert(i, lean)
    assert {5, 6} <= set(lsh.query(leans[5])) and 0 not in lsh.query(leans[5])
    with pytest.raises(ValueError):
        to_lean_minhashes(texts, NearDupParams(method="simhash"))


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            'Sony Bravia KDL-40V5100 40" LCD TV (2009)',
            {"kdl40v5100"},
        ),  # joined across its hyphen; 40 and 2009 are numbers
        ("Adobe Photoshop CS3 upgrade, part no. 29/AB-7", {"cs3", "29ab7"}),
        ("ＫＤＬ４０Ｖ５１００ and kdl40v5100", {"kdl40v5100"}),  # NFKC and case-folded: one code
        ("a1 b2 x 12 and 4.5 kg", set()),  # too short, or no letter
        ("Plain words, no digits at all", set()),
    ],
)
def test_codes_are_the_tokens_that_mix_letters_and_digits(text, expected):
    assert codes(text) == expected


def _codes_token_by_token(text: str) -> frozenset[str]:
    """The rule as the docstring states it, one token at a time: fold, drop the joiners between two letters or
    digits, split into runs of letters and digits, keep those of 3 or more characters that mix decimal digits
    with other characters."""
    folded = re.sub(r"(?<=[^\W_])[-/.](?=[^\W_])", "", unicodedata.normalize("NFKC", text).casefold())
    return frozenset(
        t for t in re.findall(r"[^\W_]+", folded) if len(t) >= 3 and re.search(r"\d", t) and not t.isdecimal()
    )


@settings(max_examples=1000, deadline=None)
@given(st.text(alphabet=st.sampled_from("aZ09-/._ ,xß²４Ｋ－é\u0301٣①") | st.characters(), max_size=40))
def test_codes_are_found_as_the_rule_states_them_token_by_token(text):
    """Breaks: a fast path that splits or joins tokens differently (joiners at either end or doubled, underscores,
    characters NFKC or case folding change, digits of other scripts)."""
    expected = _codes_token_by_token(text) if re.search(r"\d", text) else frozenset()  # no decimal digit: no code
    assert codes(text) == expected
    assert codes(text) == expected  # the second time from what codes() remembers


def test_codes_remembers_a_bounded_number_of_texts_and_each_text_s_own_codes():
    """Breaks: more texts than the cache holds, each naming its own code, asked for twice in turn.

    Must hold: the cache never holds more than CODES_CACHE texts, and every answer is the text's own codes."""
    from dedup_pipeline.core import near

    texts = [f"Sleeve iCC{n}PNK for iPad" for n in range(near.CODES_CACHE + 100)]
    for _ in range(2):
        for n, text in enumerate(texts):
            assert codes(text) == {f"icc{n}pnk"}
        assert len(near._CODES_SEEN) == near.CODES_CACHE


@pytest.mark.parametrize("method", ["minhash", "simhash"])
def test_two_texts_naming_different_codes_are_not_linked_unless_the_rule_is_off(method):
    """Breaks: one long text three times, once with another model number, once with the same one spelt
    another way. Must hold: the other model number is kept apart (a text naming no code is not)."""
    base = ARTICLE + " Model {}."
    texts = [base.format("XR-2000"), base.format("XR-3000"), base.format("xr2000"), ARTICLE]
    on = {(a, b) for a, b, _ in near_duplicate_links(texts, make_params(method=method))}
    off = {(a, b) for a, b, _ in near_duplicate_links(texts, make_params(method=method, require_shared_code=False))}
    assert off == {(0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3)}
    assert on == {(0, 2), (0, 3), (1, 3), (2, 3)}


def test_the_shared_code_rule_is_a_link_setting_outside_the_index_identity():
    rule_off = NearDupParams(require_shared_code=False)
    assert NearDupParams().require_shared_code and rule_off.identity() == NearDupParams().identity()
    assert NearDupParams.from_dict(rule_off.as_dict()) == rule_off
    stored_before = {k: v for k, v in NearDupParams().as_dict().items() if k != "require_shared_code"}
    assert NearDupParams.from_dict(stored_before).require_shared_code  # link settings stored by earlier versions
