"""Batch MinHash signatures, bit-identical to datasketch 2.0's ``affine32``.

For a document with shingles ``S`` and permutation ``k``::

    h(s)     = fmix32(xxh32(utf8(s), seed=0))          # MurmurHash3 finaliser
    sig[k]   = min over s in S of (a[k] * h(s) + b[k]) mod 2**32

with ``a`` (odd) and ``b`` drawn exactly as datasketch's
``MinHash._init_permutations`` draws them from ``np.random.RandomState(seed)``.
The result equals ``datasketch.MinHash(num_perm, seed=seed, scheme="affine32",
hashfunc=xxh32)`` updated with the same shingles, so a signature can be
handed to datasketch as a ``LeanMinHash`` (:func:`to_lean_minhash`).

Speed comes from doing a chunk of documents at once, in compiled code
(:mod:`dedup_pipeline.core.xxh32`, numba): the chunk's shingle hashes are one
array, and one kernel call folds them into every document's permutation
minima. From texts, the shingles are slices of the chunk's normalised text,
hashed by a compiled XXH32 with no Python per shingle; from lists of shingles,
hashing is one C call per shingle (``xxhash.xxh32_intdigest``). The chunk
size bounds memory.

Empty documents keep datasketch's empty sentinel (every value 0xFFFFFFFF);
:func:`empty_mask` flags them and the similarity functions treat them as
sharing nothing, so they are never linked to anything.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from functools import lru_cache
from typing import TYPE_CHECKING

import numpy as np
from xxhash import xxh32_intdigest

if TYPE_CHECKING:
    from datasketch import LeanMinHash

    from dedup_pipeline.core.text import TextNormaliser

SCHEME = "affine32"
HASH_NAME = "xxh32"
EMPTY_VALUE = np.uint32(0xFFFFFFFF)

# Shingles per chunk of `minhash_signatures`: bounds the joined buffer (a few MB)
# while the Python work per chunk stays small.
DEFAULT_CHUNK = 1 << 16

Shingle = str | bytes


@lru_cache(maxsize=16)
def permutations(num_perm: int = 128, seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """The ``(a, b)`` parameters datasketch draws for ``affine32``.

    Mirrors ``datasketch.MinHash._init_permutations``: ``a`` is
    ``2 * randint(0, 2**31) + 1`` (odd, so ``h -> a*h + b`` is a bijection
    on 32-bit values) and ``b`` is ``randint(0, 2**32)``, both uint32 and in
    that draw order. The arrays are read-only because they are cached.
    """
    if num_perm < 1:
        raise ValueError("num_perm must be positive")
    gen = np.random.RandomState(seed)
    a = gen.randint(0, 1 << 31, num_perm, dtype=np.uint32) * np.uint32(2) + np.uint32(1)
    b = gen.randint(0, 1 << 32, num_perm, dtype=np.uint32)
    a.flags.writeable = False
    b.flags.writeable = False
    return a, b


def hash_documents(
    shingle_lists: Sequence[Sequence[Shingle]],
    hashfunc: Callable[[bytes], int] = xxh32_intdigest,
    dtype: type = np.uint32,
) -> np.ndarray:
    """``hashfunc`` of the UTF-8 bytes of every shingle of every document.

    The hashes are concatenated in document order. One C call per shingle,
    written straight into the array (this is the hot loop).
    """
    count = sum(map(len, shingle_lists))
    if count == 0:
        return np.empty(0, dtype=dtype)
    first = next(doc[0] for doc in shingle_lists if len(doc))
    flat = itertools.chain.from_iterable(shingle_lists)
    try:
        encoded = map(str.encode, flat) if isinstance(first, str) else flat
        return np.fromiter(map(hashfunc, encoded), dtype=dtype, count=count)
    except TypeError:  # a mix of str and bytes
        flat = itertools.chain.from_iterable(shingle_lists)
        encoded = (s.encode() if isinstance(s, str) else s for s in flat)
        return np.fromiter(map(hashfunc, encoded), dtype=dtype, count=count)


def hash_shingles(shingles: Sequence[Shingle]) -> np.ndarray:
    """xxh32 (seed 0) of each shingle's UTF-8 bytes, as a uint32 array."""
    return hash_documents([shingles])


def document_chunks(shingle_lists: Sequence[Sequence[Shingle]], chunk_size: int):
    """Split documents into runs holding about ``chunk_size`` shingles.

    Yields ``(start, stop, docs, offsets)``: the documents ``start:stop`` (at
    least one), the indices of the non-empty ones, and where each of those
    starts in the chunk's concatenated shingles (for ``ufunc.reduceat``).
    """
    lengths = np.fromiter(map(len, shingle_lists), dtype=np.int64, count=len(shingle_lists))
    ends = np.cumsum(lengths)
    start = 0
    while start < len(lengths):
        base = ends[start] - lengths[start]
        stop = max(int(np.searchsorted(ends, base + chunk_size, side="right")), start + 1)
        docs = start + np.flatnonzero(lengths[start:stop])
        yield start, stop, docs, ends[docs] - lengths[docs] - base
        start = stop


def minhash_signatures(
    shingle_lists: Sequence[Sequence[Shingle]],
    num_perm: int = 128,
    seed: int = 1,
    chunk_size: int = DEFAULT_CHUNK,
) -> np.ndarray:
    """MinHash signatures of many documents, shape ``(n, num_perm)``, uint32.

    ``shingle_lists[i]`` holds the shingles of document ``i`` as ``str``
    (hashed as UTF-8) or ``bytes``; duplicates are harmless. Documents with no
    shingle get the empty sentinel row (see :func:`empty_mask`).
    """
    out = np.full((len(shingle_lists), num_perm), EMPTY_VALUE, dtype=np.uint32)
    for start, stop, docs, _ in document_chunks(shingle_lists, chunk_size):
        if docs.size:
            chunk = shingle_lists[start:stop]
            counts = np.fromiter(map(len, chunk), dtype=np.int64, count=len(chunk))
            _minima(hash_documents(chunk), counts, num_perm, seed, out[start:stop])
    return out


def minhash_signatures_from_texts(
    texts: Sequence[str],
    normaliser: TextNormaliser,
    num_perm: int = 128,
    seed: int = 1,
    texts_per_chunk: int = 256,
) -> np.ndarray:
    """``minhash_signatures([normaliser.shingle_bytes(t) for t in texts], num_perm, seed)``, without per-shingle Python.

    The shingles of a chunk of texts are slices of one buffer
    (:meth:`TextNormaliser.shingle_spans`), hashed by the compiled
    :func:`~dedup_pipeline.core.xxh32.xxh32_slices`; only the normalisation
    runs per text. The chunk bounds memory (about 300 shingles per 2 KB text).
    """
    from dedup_pipeline.core.xxh32 import xxh32_slices  # see _minima on this late import

    out = np.full((len(texts), num_perm), EMPTY_VALUE, dtype=np.uint32)
    for start in range(0, len(texts), texts_per_chunk):
        spans = normaliser.shingle_spans(texts[start : start + texts_per_chunk])
        hashes = xxh32_slices(spans.buffer, spans.starts, spans.lengths)
        _minima(hashes, spans.counts, num_perm, seed, out[start : start + len(spans.counts)])
    return out


def _minima(hashes: np.ndarray, counts: np.ndarray, num_perm: int, seed: int, out: np.ndarray) -> None:
    """Fill the rows of ``out`` of documents with shingles: document d owns the next ``counts[d]`` hashes."""
    # Imported here, not at the top: numba's compiler adds about 150 MB to a process, which only the
    # processes that compute signatures should pay (not the code server, not the other rungs' steps).
    from dedup_pipeline.core.xxh32 import minhash_minima

    counts = np.ascontiguousarray(counts, dtype=np.int64)
    if counts.sum() != hashes.size or out.shape != (counts.size, num_perm):  # the kernel checks no bounds
        raise ValueError("counts, hashes and output rows do not match")
    a, b = permutations(num_perm, seed)
    minhash_minima(hashes, counts, a, b, out)


def empty_mask(signatures: np.ndarray) -> np.ndarray:
    """True for rows that are the empty sentinel (documents without shingles).

    A non-empty document cannot produce this row in practice: every
    permutation is a bijection, so it would need its minimum at 2**32-1 under
    all ``num_perm`` permutations at once.
    """
    signatures = np.atleast_2d(signatures)
    return np.all(signatures == EMPTY_VALUE, axis=1)


def estimated_jaccard(sig_a: np.ndarray, sig_b: np.ndarray) -> float:
    """Fraction of equal values; 0.0 when either signature is empty.

    (datasketch returns 1.0 for two empty sketches; here empty documents
    share nothing, so they are never linked.)
    """
    sig_a = np.asarray(sig_a)
    sig_b = np.asarray(sig_b)
    if sig_a.shape != sig_b.shape:
        raise ValueError("signatures have different numbers of permutations")
    if empty_mask(sig_a)[0] or empty_mask(sig_b)[0]:
        return 0.0
    return float(np.count_nonzero(sig_a == sig_b)) / sig_a.size


def estimated_jaccard_pairs(
    signatures: np.ndarray,
    left: np.ndarray,
    right: np.ndarray,
    chunk: int = 1 << 14,
) -> np.ndarray:
    """Vectorised :func:`estimated_jaccard` for pairs ``(left[p], right[p])``.

    ``left`` and ``right`` index rows of ``signatures``; returns float64 of
    the same length. Pairs are processed in chunks to bound memory.
    """
    left = np.asarray(left, dtype=np.int64)
    right = np.asarray(right, dtype=np.int64)
    if left.shape != right.shape:
        raise ValueError("left and right must have the same length")
    num_perm = signatures.shape[1]
    empty = empty_mask(signatures)
    out = np.empty(left.size, dtype=np.float64)
    for s in range(0, left.size, chunk):
        li, ri = left[s : s + chunk], right[s : s + chunk]
        equal = np.count_nonzero(signatures[li] == signatures[ri], axis=1)
        out[s : s + chunk] = equal / num_perm
    out[empty[left] | empty[right]] = 0.0
    return out


#: Bits of each permutation's minimum that the warehouse index keeps (b-bit MinHash, Li and Koenig 2010).
SIGNATURE_BITS = 8


def pack_bbit(signatures: np.ndarray, bits: int = SIGNATURE_BITS) -> np.ndarray:
    """The lowest ``bits`` bits (8 or 16) of every value, as uint8 or uint16: a compact signature to store.

    Two documents' b-bit values agree where their full minima do, and also by
    chance (probability ``2**-bits``) where they differ;
    :func:`bbit_jaccard_pairs` corrects for that. Empty-document rows become
    all ones, as their sentinel.
    """
    kinds = {8: np.uint8, 16: np.uint16}
    if bits not in kinds:
        raise ValueError(f"bits must be 8 or 16, got {bits}")
    return (np.asarray(signatures, dtype=np.uint32) & np.uint32((1 << bits) - 1)).astype(kinds[bits])


def bbit_jaccard_pairs(packed: np.ndarray, left: np.ndarray, right: np.ndarray, chunk: int = 1 << 14) -> np.ndarray:
    """Estimated Jaccard similarity of pairs of b-bit signatures (rows of ``packed``, from :func:`pack_bbit`).

    With ``m`` the fraction of equal b-bit values and ``r = 2**-bits`` the
    chance that two different minima agree in their low bits, the unbiased
    estimate is ``(m - r) / (1 - r)``, clipped to [0, 1]. Its standard error
    at 8 bits is within 1% of the full signature's.
    """
    packed = np.asarray(packed)
    left = np.asarray(left, dtype=np.int64)
    right = np.asarray(right, dtype=np.int64)
    chance = 2.0 ** -(8 * packed.dtype.itemsize)
    out = np.empty(left.size, dtype=np.float64)
    for s in range(0, left.size, chunk):
        equal = np.count_nonzero(packed[left[s : s + chunk]] == packed[right[s : s + chunk]], axis=1)
        out[s : s + chunk] = equal / packed.shape[1]
    return np.clip((out - chance) / (1.0 - chance), 0.0, 1.0)


def to_lean_minhash(signature: np.ndarray, seed: int = 1) -> LeanMinHash:
    """Wrap one signature as a ``datasketch.LeanMinHash`` (scheme affine32)."""
    from datasketch import LeanMinHash  # lazy: datasketch imports scipy

    return LeanMinHash(seed=seed, hashvalues=np.asarray(signature, dtype=np.uint32), scheme=SCHEME)


def signature_to_bytes(signature: np.ndarray) -> bytes:
    """Little-endian uint32 bytes of one signature (4 * num_perm bytes)."""
    return np.ascontiguousarray(signature, dtype="<u4").tobytes()


def signature_from_bytes(data: bytes) -> np.ndarray:
    """Inverse of :func:`signature_to_bytes`."""
    return np.frombuffer(data, dtype="<u4").astype(np.uint32)
