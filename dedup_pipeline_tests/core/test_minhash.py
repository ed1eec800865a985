"""Batch MinHash: bit-identical to datasketch affine32, empty documents flagged."""

from __future__ import annotations

import numpy as np
import pytest
import xxhash
from datasketch import LeanMinHash, MinHash
from hypothesis import given, settings
from hypothesis import strategies as st

from dedup_pipeline.core.minhash import (
    EMPTY_VALUE,
    empty_mask,
    estimated_jaccard,
    estimated_jaccard_pairs,
    hash_shingles,
    minhash_signatures,
    permutations,
    signature_from_bytes,
    signature_to_bytes,
    to_lean_minhash,
)
from dedup_pipeline.core.text import TextNormaliser


def xxh32_hash(value) -> int:
    return xxhash.xxh32_intdigest(value.encode("utf-8") if isinstance(value, str) else value)


def datasketch_signature(shingles, num_perm=128, seed=1) -> np.ndarray:
    m = MinHash(num_perm, seed=seed, scheme="affine32", hashfunc=xxh32_hash)
    m.update_batch(shingles)
    return m.hashvalues


def test_permutations_are_datasketchs():
    for num_perm, seed in [(128, 1), (64, 7), (3, 12345)]:
        a, b = permutations(num_perm, seed)
        theirs = MinHash(num_perm, seed=seed, scheme="affine32").permutations
        assert a.dtype == b.dtype == np.uint32
        assert np.array_equal(a, theirs[0]) and np.array_equal(b, theirs[1])
        assert np.all(a % 2 == 1)


@settings(max_examples=60, deadline=None)
@given(
    docs=st.lists(st.lists(st.text(max_size=12), max_size=40), min_size=1, max_size=12),
    num_perm=st.sampled_from([1, 16, 128]),
    seed=st.sampled_from([1, 2, 2**31]),
    chunk=st.sampled_from([1, 5, 1 << 15]),
)
def test_bit_identical_to_datasketch(docs, num_perm, seed, chunk):
    ours = minhash_signatures(docs, num_perm, seed, chunk_size=chunk)
    assert ours.shape == (len(docs), num_perm) and ours.dtype == np.uint32
    for shingles, row in zip(docs, ours):
        assert np.array_equal(row, datasketch_signature(shingles, num_perm, seed))


def test_bit_identical_on_seeded_random_texts():
    rng = np.random.default_rng(3)
    words = ["alpha", "beta", "γάμμα", "delta", "ε", "ζήτα", "日本", "x", "yy", "zzz"]
    texts = [" ".join(rng.choice(words, rng.integers(0, 80))) for _ in range(200)]
    normaliser = TextNormaliser()
    shingles = [normaliser.shingle_bytes(t) for t in texts]
    ours = minhash_signatures(shingles)
    for doc, row in zip(shingles, ours):
        assert np.array_equal(row, datasketch_signature(doc))
    # str and bytes shingles give the same signatures; so does a mixed list
    as_str = [normaliser.shingles(t) for t in texts]
    assert np.array_equal(minhash_signatures(as_str), ours)
    mixed = [[s if k % 2 else s.encode() for k, s in enumerate(doc)] for doc in as_str]
    assert np.array_equal(minhash_signatures(mixed), ours)


def test_hash_shingles_is_xxh32_of_utf8():
    shingles = ["a", "é", "", "日本語"]
    expected = [xxhash.xxh32_intdigest(s.encode()) for s in shingles]
    assert hash_shingles(shingles).tolist() == expected
    assert hash_shingles([s.encode() for s in shingles]).tolist() == expected
    assert hash_shingles([]).size == 0


def test_lean_minhash_round_trip():
    shingles = TextNormaliser().shingle_bytes("the quick brown fox jumps over the lazy dog again and again")
    sig = minhash_signatures([shingles])[0]
    lean = to_lean_minhash(sig)
    assert isinstance(lean, LeanMinHash) and lean.scheme == "affine32" and lean.seed == 1
    assert np.array_equal(lean.hashvalues, sig)
    buf = bytearray(lean.bytesize())
    lean.serialize(buf)
    restored = LeanMinHash.deserialize(buf)
    assert np.array_equal(restored.hashvalues, sig) and restored.scheme == "affine32"
    # and it is comparable with a sketch datasketch computed itself
    theirs = MinHash(128, seed=1, scheme="affine32", hashfunc=xxhash.xxh32_intdigest)
    theirs.update_batch(shingles)
    assert restored.jaccard(theirs) == 1.0
    assert np.array_equal(signature_from_bytes(signature_to_bytes(sig)), sig)
    assert len(signature_to_bytes(sig)) == 4 * 128


def test_empty_documents_get_the_sentinel_and_never_look_similar():
    sigs = minhash_signatures([[], ["a b c"], [], ["a b c"]])
    assert np.all(sigs[0] == EMPTY_VALUE) and np.all(sigs[2] == EMPTY_VALUE)
    assert np.array_equal(sigs[0], datasketch_signature([]))  # datasketch's empty sketch
    assert empty_mask(sigs).tolist() == [True, False, True, False]
    assert empty_mask(sigs[0]).tolist() == [True]
    assert estimated_jaccard(sigs[0], sigs[2]) == 0.0
    assert estimated_jaccard(sigs[0], sigs[1]) == 0.0
    assert estimated_jaccard(sigs[1], sigs[3]) == 1.0
    pairs = estimated_jaccard_pairs(sigs, [0, 0, 1], [2, 1, 3])
    assert pairs.tolist() == [0.0, 0.0, 1.0]
    assert minhash_signatures([]).shape == (0, 128)


def test_estimated_jaccard_tracks_true_jaccard():
    a = [f"s{i}" for i in range(300)]
    b = [f"s{i}" for i in range(100, 400)]  # true Jaccard 200 / 400 = 0.5
    sigs = minhash_signatures([a, b], num_perm=512)
    assert abs(estimated_jaccard(sigs[0], sigs[1]) - 0.5) < 0.08
    with pytest.raises(ValueError):
        estimated_jaccard(sigs[0], sigs[1][:10])


def test_estimated_jaccard_pairs_matches_scalar_version():
    rng = np.random.default_rng(0)
    docs = [[f"w{x}" for x in rng.integers(0, 60, 30)] for _ in range(40)]
    sigs = minhash_signatures(docs)
    left, right = rng.integers(0, 40, 500), rng.integers(0, 40, 500)
    vec = estimated_jaccard_pairs(sigs, left, right, chunk=64)
    assert vec.tolist() == [estimated_jaccard(sigs[i], sigs[j]) for i, j in zip(left, right)]
