"""The measures of benchmarks/neardup_quality.py that explain a missed target: links below the threshold, pairs by
exact Jaccard (``--buckets``), and the sweep-only short-record rules."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.neardup_quality import LabelledSet, ShortVariant, below_threshold_share, similarity_buckets
from dedup_pipeline.core.text import TextNormaliser

WORDS = TextNormaliser(shingle="word", ngram=1)


def test_below_threshold_share_counts_the_links_under_the_threshold():
    shingles = [[b"a", b"b"], [b"a", b"b", b"c"], [b"x"]]  # J(0,1) = 2/3, J(0,2) = 0
    assert below_threshold_share(shingles, [(0, 1), (0, 2)], 0.5) == 0.5
    assert below_threshold_share(shingles, [(0, 1, 0.9)], 0.5) == 0.0  # links may carry a similarity
    assert below_threshold_share(shingles, [(0, 1)], 0.7) == 1.0
    assert below_threshold_share(shingles, [], 0.5) == 0.0


def _band(result: dict, start: float) -> dict:
    return next(row for row in result["rows"] if row["from"] == pytest.approx(start))


def test_buckets_of_a_cluster_set_count_true_pairs_recall_and_pairs_within_one_table():
    texts = ["a b c d", "A, b; c d", "a b c e", "x y z w"]  # J(0,1) = 1, J(0,2) = J(1,2) = 3/5, the rest 0
    data = LabelledSet("t", "short", texts, labels=["p", "p", "q", "r"], tables=[0, 0, 0, 1])
    result = similarity_buckets(data, WORDS, low=0.2)
    assert result["true_pairs"] == 1
    assert _band(result, 1.0) == {"from": 1.0, "pairs": 1, "true": 1, "false within a table": 0, "recall": 1.0}
    six = _band(result, 0.6)
    assert (six["pairs"], six["true"], six["false within a table"]) == (2, 0, 2)  # both false pairs in table 0
    assert sum(row["pairs"] for row in result["rows"]) == 3  # no pair with "x y z w"


def test_buckets_of_a_pair_set_count_only_the_labelled_pairs():
    texts = ["a b c d", "a b c d", "a b c e"]
    data = LabelledSet("t", "short", texts, pairs=np.array([[0, 1, 0], [0, 2, 1]]))  # (1, 2) is unlabelled
    result = similarity_buckets(data, WORDS, low=0.2)
    assert [(row["pairs"], row["true"]) for row in result["rows"] if row["pairs"]] == [(1, 0), (1, 1)]
    assert _band(result, 0.6)["recall"] == 1.0 and _band(result, 1.0)["recall"] == 0.0
    assert _band(result, 1.0)["false within a table"] is None  # one table: nothing to count


def test_short_variants_of_the_sweep():
    text = "Acer AS5750 laptop"
    in_words = ShortVariant("in-words").shingle_bytes(text)
    assert not any(b" " in s for s in in_words[3:]) and b"as57" in in_words and b"r as" not in in_words
    letters = ShortVariant("letters").shingle_bytes(text)
    assert letters[:3] == [b"acer", b"as5750", b"laptop"]  # every token is a word shingle
    assert not any(c.isdigit() for s in letters[3:] for c in s.decode()) and b"r la" in letters
    bigrams = ShortVariant("bigrams").shingle_bytes(text)
    assert b"acer as5750" in bigrams and b"r as" in bigrams
    long_text = " ".join(f"w{i}" for i in range(80))  # 75 tokens or more: the default word 3-grams
    assert ShortVariant("in-words").shingle_bytes(long_text) == TextNormaliser(shingle="word").shingle_bytes(long_text)
