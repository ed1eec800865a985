"""64-bit SimHash fingerprints and Hamming-distance candidate search.

Fingerprint of a document (Charikar): every shingle occurrence is hashed with
``xxh64`` (seed 0) of its UTF-8 bytes; bit ``j`` of the fingerprint is set
when more than half of the occurrences have bit ``j`` set. Counting
occurrences weights each distinct shingle by its term frequency. Bits are
numbered from the least significant (bit 0 = ``value & 1``).

Two fingerprints within Hamming distance ``k`` agree exactly on at least one
of ``k + 1`` disjoint bit blocks (pigeonhole), so :func:`simhash_candidates`
groups fingerprints by each block and only compares within groups, instead
of comparing all pairs. Similarity is reported as ``1 - distance / 64``.
The default cut, distance <= 3, is the usual one for prose (Manku et al.).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from xxhash import xxh64_intdigest

from dedup_pipeline.core.lsh import candidate_pairs
from dedup_pipeline.core.minhash import Shingle, document_chunks, hash_documents

BITS = 64
HASH_NAME = "xxh64"
DEFAULT_MAX_DISTANCE = 3
DEFAULT_CHUNK = 1 << 15


def simhash_fingerprints(
    shingle_lists: Sequence[Sequence[Shingle]],
    chunk_size: int = DEFAULT_CHUNK,
) -> np.ndarray:
    """SimHash fingerprints of many documents, uint64, shape ``(n,)``.

    Documents without shingles get 0; :func:`dedup_pipeline.core.near`
    keeps them out of the candidate search (check ``len(shingles) == 0``).
    """
    out = np.zeros(len(shingle_lists), dtype=np.uint64)
    for start, stop, docs, offsets in document_chunks(shingle_lists, chunk_size):
        if not docs.size:
            continue
        hashes = hash_documents(shingle_lists[start:stop], xxh64_intdigest, np.uint64).astype("<u8")
        # (N, 64) matrix of bits, column j = bit j of each hash.
        bits = np.unpackbits(hashes.view(np.uint8).reshape(-1, 8), axis=1, bitorder="little")
        ones = np.add.reduceat(bits, offsets, axis=0, dtype=np.int32)
        counts = np.diff(np.r_[offsets, len(hashes)])
        majority = 2 * ones > counts[:, None]
        out[docs] = np.packbits(majority, axis=1, bitorder="little").view("<u8").ravel()
    return out


def hamming_distance(a, b):
    """Number of differing bits; ints give an int, arrays an array."""
    if isinstance(a, (int, np.integer)) and isinstance(b, (int, np.integer)):
        return (int(a) ^ int(b)).bit_count()
    return np.bitwise_count(np.bitwise_xor(np.asarray(a, dtype=np.uint64), np.asarray(b, dtype=np.uint64)))


def similarity(distance):
    """``1 - distance / 64`` (a float, or a float array for an array)."""
    return 1.0 - np.asarray(distance, dtype=np.float64) / BITS


def block_bounds(max_distance: int) -> list[tuple[int, int]]:
    """``max_distance + 1`` disjoint bit ranges ``(low, width)`` covering 64 bits."""
    if not 0 <= max_distance < BITS:
        raise ValueError("max_distance must be in [0, 63]")
    blocks = max_distance + 1
    widths = [BITS // blocks + (1 if i < BITS % blocks else 0) for i in range(blocks)]
    lows = np.cumsum([0] + widths[:-1]).tolist()
    return list(zip(lows, widths))


def simhash_candidates(
    fingerprints: np.ndarray,
    max_distance: int = DEFAULT_MAX_DISTANCE,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """All pairs ``(i, j)``, ``i < j``, with Hamming distance <= ``max_distance``.

    Returns ``(i, j, distance)`` arrays, sorted by ``(i, j)``. Exact: the
    pigeonhole blocks only prune pairs that cannot be within the distance.
    """
    fps = np.asarray(fingerprints, dtype=np.uint64)
    n = fps.size
    if n < 2:
        empty = np.empty(0, dtype=np.int64)
        return empty, empty, empty
    blocks = [(fps >> np.uint64(low)) & np.uint64((1 << width) - 1) for low, width in block_bounds(max_distance)]
    pairs = candidate_pairs(np.column_stack(blocks))  # the blocks as LSH bands: pairs sharing one, sorted
    i, j = pairs[:, 0], pairs[:, 1]
    distance = hamming_distance(fps[i], fps[j]).astype(np.int64)
    keep = distance <= max_distance
    return i[keep], j[keep], distance[keep]
