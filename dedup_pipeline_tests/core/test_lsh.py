"""LSH banding: parameter choice, deterministic band keys, candidate search, index."""

from __future__ import annotations

import numpy as np
import pytest
import xxhash
from datasketch import MinHashLSH
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks.common import LshIndex  # the in-memory reference index the benchmarks use
from dedup_pipeline.core.lsh import (
    band_keys,
    candidate_pairs,
    candidate_probability,
    choose_bands_rows,
    pairs_sharing_key,
    sorted_unique,
    xxh64_words,
)
from dedup_pipeline.core.minhash import minhash_signatures, to_lean_minhash
from dedup_pipeline.core.near import LSH_WEIGHTS, NearDupParams


@pytest.mark.parametrize(
    "threshold,num_perm,weights",
    [
        (0.5, 128, (0.5, 0.5)),
        (0.9, 128, (0.5, 0.5)),
        (0.3, 64, (0.3, 0.7)),
        (0.75, 256, (0.05, 0.95)),
        (0.2, 16, (0.9, 0.1)),
    ],
)
def test_choose_bands_rows_is_what_datasketch_chooses(threshold, num_perm, weights):
    lsh = MinHashLSH(threshold=threshold, num_perm=num_perm, weights=weights)
    assert choose_bands_rows(threshold, num_perm, *weights) == (lsh.b, lsh.r)


def test_the_default_banding_is_26_bands_of_3_rows():
    """threshold 0.5, 128 permutations, recall-leaning weights: the bands every default index is built with."""
    assert LSH_WEIGHTS == (0.05, 0.95)
    assert choose_bands_rows(0.5, 128, *LSH_WEIGHTS) == (26, 3)
    params = NearDupParams()
    assert (params.threshold, params.num_perm, params.bands, params.rows) == (0.5, 128, 26, 3)


def test_choose_bands_rows_validates_and_fits():
    bands, rows = choose_bands_rows(0.5, 128, 0.05, 0.95)
    assert bands * rows <= 128
    assert candidate_probability(0.5, bands, rows) > 0.95  # recall-leaning weights
    for bad in ((0.0, 128), (1.0, 128), (0.5, 1)):
        with pytest.raises(ValueError):
            choose_bands_rows(*bad)
    # where datasketch's optimum is a single band it refuses, and so do we, saying what to do instead
    with pytest.raises(ValueError, match="give bands and rows"):
        choose_bands_rows(0.95, 4, 0.05, 0.95)
    with pytest.raises(ValueError, match="give bands and rows"):
        choose_bands_rows(0.5, 128, 0.3, 0.3)  # weights must sum to 1


@settings(max_examples=80, deadline=None)
@given(
    rows=st.integers(1, 40),
    seed=st.sampled_from([0, 1, 25, 2**40]),
    data=st.data(),
)
def test_xxh64_words_is_xxh64_of_little_endian_bytes(rows, seed, data):
    row = st.lists(st.integers(0, 2**32 - 1), min_size=rows, max_size=rows)
    values = data.draw(st.lists(row, min_size=1, max_size=5))
    words = np.array(values, dtype=np.uint32)
    expected = [xxhash.xxh64_intdigest(row.astype("<u4").tobytes(), seed) for row in words]
    assert xxh64_words(words, seed).tolist() == expected


def test_band_keys_golden_values():
    # Pinned: the warehouse stores these keys, so they must never change
    # across processes, platforms or releases without a new index identity.
    sig = minhash_signatures([["the quick brown", "quick brown fox", "brown fox jumps"]])
    keys = band_keys(sig, 26, 3)
    assert keys.dtype == np.int64 and keys.shape == (1, 26)
    assert sig[0, :3].tolist() == [365911420, 560478200, 133709317]
    assert keys[0, :8].tolist() == GOLDEN_KEYS
    # key = xxh64(little-endian rows, seed=band), read as signed int64
    band = 5
    raw = xxhash.xxh64_intdigest(sig[0, band * 3 : band * 3 + 3].astype("<u4").tobytes(), band)
    assert keys[0, band] == np.uint64(raw).astype(np.int64)
    # byte order of the input array does not matter
    assert np.array_equal(band_keys(sig.astype(">u4"), 26, 3), keys)


GOLDEN_KEYS = [
    2332839501260476813,
    5906042559538298254,
    9172544354597426105,
    190997736128528819,
    3038461729609022810,
    -8866276794585499788,
    -5043836497280645590,
    4841497721813470315,
]


def test_band_keys_shapes_and_validation():
    sigs = minhash_signatures([["a"], ["b"], []])
    assert band_keys(sigs, 16, 8).shape == (3, 16)
    assert band_keys(sigs[0], 16, 8).shape == (1, 16)
    # equal rows in different bands still give different keys (band is the seed)
    same = np.full((1, 8), 7, dtype=np.uint32)
    assert len(set(band_keys(same, 4, 2)[0].tolist())) == 4
    with pytest.raises(ValueError):
        band_keys(sigs, 17, 8)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 6), max_size=40))
def test_pairs_sharing_key_is_exactly_the_equal_pairs(keys):
    i, j = pairs_sharing_key(np.array(keys, dtype=np.int64))
    expected = {(a, b) for a in range(len(keys)) for b in range(a + 1, len(keys)) if keys[a] == keys[b]}
    assert len(i) == len(expected) and set(zip(i.tolist(), j.tolist())) == expected


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(-(2**63), 2**63 - 1) | st.integers(-3, 3), max_size=60))
def test_sorted_unique_is_np_unique(values):
    array = np.array(values, dtype=np.int64)
    found = sorted_unique(array)
    assert found.dtype == np.int64 and found.tolist() == np.unique(array).tolist()


def test_candidate_pairs_unions_bands():
    keys = np.array([[1, 2], [1, 3], [4, 3], [5, 6], [5, 2]], dtype=np.int64)
    assert candidate_pairs(keys).tolist() == [[0, 1], [0, 4], [1, 2], [3, 4]]
    assert candidate_pairs(np.empty((0, 2), dtype=np.int64)).shape == (0, 2)


def _corpus(n=600, seed=0):
    rng = np.random.default_rng(seed)
    bases = [[f"w{x}" for x in rng.integers(0, 400, 25)] for _ in range(40)]
    docs = []
    for _ in range(n):
        doc = list(bases[rng.integers(0, 40)])
        for _ in range(rng.integers(0, 10)):
            doc[rng.integers(0, 25)] = f"x{rng.integers(0, 10**9)}"
        docs.append(doc)
    return minhash_signatures(docs)


def test_lsh_index_agrees_with_datasketch_through_inserts_and_removes():
    sigs = _corpus()
    ids = [f"doc{i}" for i in range(len(sigs))]
    ours = LshIndex(16, 4)
    theirs = MinHashLSH(num_perm=128, params=(16, 4))
    removed = 0
    for start in range(0, len(sigs), 250):
        ours.insert_many(ids[start : start + 250], sigs[start : start + 250])
        for i in range(start, min(start + 250, len(sigs))):
            theirs.insert(ids[i], to_lean_minhash(sigs[i]))
        for i in range(start, min(start + 250, len(sigs)), 4):
            ours.remove(ids[i])
            theirs.remove(ids[i])
            removed += 1
        assert ours.query_many(sigs) == [set(theirs.query(to_lean_minhash(s))) for s in sigs]
    assert len(ours) == len(sigs) - removed
    assert ids[1] in ours and ids[0] not in ours


def test_lsh_index_compaction_keeps_answers():
    sigs = _corpus(n=1500, seed=1)
    ids = list(range(len(sigs)))
    index = LshIndex(16, 4)
    index.insert_many(ids, sigs)
    before = index.query_many(sigs)
    index.remove_many(ids[:1300])  # dead slots outnumber live ones: compaction
    assert len(index._ids) < 1500
    assert index.query_many(sigs) == [{i for i in found if i >= 1300} for found in before]
    index.insert_many(ids[:10], sigs[:10])  # removed ids may come back
    assert 0 in index.query_many(sigs[:1])[0]


def test_lsh_index_refuses_bad_input_and_ignores_empty_queries():
    sigs = minhash_signatures([["a b c"], [], ["a b c"]])
    index = LshIndex(16, 8)
    with pytest.raises(ValueError):
        index.insert_many([1, 2], sigs[:2])  # an empty document
    index.insert_many([1], sigs[:1])
    with pytest.raises(ValueError):
        index.insert_many([1], sigs[2:])  # already indexed
    with pytest.raises(ValueError):
        index.insert_many([5, 5], sigs[[0, 2]])  # duplicate ids
    with pytest.raises(KeyError):
        index.remove(99)
    assert index.query_many(sigs) == [{1}, set(), {1}]
