"""SimHash fingerprints, Hamming distance and pigeonhole candidate search."""

from __future__ import annotations

import numpy as np
import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

from dedup_pipeline.core.simhash import (
    block_bounds,
    hamming_distance,
    simhash_candidates,
    simhash_fingerprints,
    similarity,
)
from dedup_pipeline.core.text import TextNormaliser

u64 = st.integers(0, 2**64 - 1)


def reference_simhash(shingles) -> int:
    """Charikar's SimHash written plainly: +1/-1 per bit per occurrence."""
    totals = [0] * 64
    for s in shingles:
        h = xxhash.xxh64_intdigest(s.encode() if isinstance(s, str) else s)
        for bit in range(64):
            totals[bit] += 1 if (h >> bit) & 1 else -1
    return sum(1 << bit for bit in range(64) if totals[bit] > 0)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.sampled_from(["a", "b", "c", "dé", "e f", "日本"]), max_size=25), max_size=8))
def test_fingerprints_match_reference(docs):
    fps = simhash_fingerprints(docs, chunk_size=7)
    assert fps.dtype == np.uint64 and fps.shape == (len(docs),)
    assert [int(f) for f in fps] == [reference_simhash(d) for d in docs]


def test_repeated_shingles_weigh_more():
    assert simhash_fingerprints([["x", "x", "x", "y"]])[0] == simhash_fingerprints([["x"]])[0]
    assert simhash_fingerprints([[]])[0] == 0


@settings(max_examples=200, deadline=None)
@given(u64, u64, u64)
def test_hamming_distance_is_a_metric(a, b, c):
    assert hamming_distance(a, a) == 0
    assert hamming_distance(a, b) == hamming_distance(b, a) == bin(a ^ b).count("1")
    assert hamming_distance(a, c) <= hamming_distance(a, b) + hamming_distance(b, c)
    arr = hamming_distance(np.array([a, b], dtype=np.uint64), np.array([b, c], dtype=np.uint64))
    assert arr.tolist() == [hamming_distance(a, b), hamming_distance(b, c)]


def test_similarity_is_one_minus_distance_over_64():
    assert similarity(0) == 1.0
    assert similarity(3) == 1 - 3 / 64
    assert similarity(np.array([64])).tolist() == [0.0]


@pytest.mark.parametrize("k", [0, 1, 3, 7, 63])
def test_blocks_cover_all_bits_once(k):
    bits = [low + i for low, width in block_bounds(k) for i in range(width)]
    assert sorted(bits) == list(range(64)) and len(block_bounds(k)) == k + 1
    with pytest.raises(ValueError):
        block_bounds(64)


@pytest.mark.parametrize("k", [0, 2, 3, 5])
def test_candidates_are_exactly_the_close_pairs(k):
    rng = np.random.default_rng(k)
    fps = rng.integers(0, 2**63, 400, dtype=np.int64).astype(np.uint64) * np.uint64(2)
    for _ in range(200):  # plant near copies at distance 0..6
        a, b = rng.integers(0, 400, 2)
        flips = rng.choice(64, rng.integers(0, 7), replace=False)
        fps[b] = fps[a] ^ np.uint64(sum(1 << int(f) for f in flips))
    i, j, d = simhash_candidates(fps, k)
    full = hamming_distance(fps[:, None], fps[None, :])
    ei, ej = np.nonzero(np.triu(full <= k, 1))
    assert i.tolist() == ei.tolist() and j.tolist() == ej.tolist()
    assert d.tolist() == full[ei, ej].tolist()
    assert simhash_candidates(fps[:1], k)[0].size == 0


def test_edited_prose_is_close_and_unrelated_prose_is_far():
    normaliser = TextNormaliser(shingle="char", ngram=4)
    base = (
        "The city council met on Tuesday to discuss the new budget for public transport, "
        "including additional bus routes, longer opening hours for the metro and a plan "
        "to replace the oldest trams before the end of the decade. Several members asked "
        "how the extra services would be paid for, and the treasurer answered that fares "
        "would stay the same for at least two years while a regional grant covers the gap. "
        "Residents who spoke at the meeting welcomed the night buses but worried about "
        "construction noise near the depot, which the council promised to limit to daytime. "
        "A final vote on the plan is expected next month after a public consultation."
    )
    edited = base.replace("Tuesday", "Wednesday")
    other = (
        "A recipe for bread: mix flour, water, salt and yeast, knead for ten minutes, "
        "let it rise for two hours, shape the loaf and bake it in a very hot oven until "
        "the crust is dark and the loaf sounds hollow when tapped underneath. Let it cool "
        "on a rack before slicing, or the crumb will be gummy; it keeps for three days."
    )
    fps = simhash_fingerprints([normaliser.shingle_bytes(t) for t in (base, edited, other)])
    assert hamming_distance(fps[0], fps[1]) <= 3
    assert hamming_distance(fps[0], fps[2]) > 10
