"""LSH banding for MinHash signatures.

A signature of ``num_perm`` values is cut into ``bands`` bands of ``rows``
values; two documents become candidates when any band matches exactly. The
chance of that for Jaccard similarity ``s`` is ``1 - (1 - s**rows)**bands``.

Band keys are what a persistent index stores, so they must not depend on the
process or the platform::

    key(band) = xxh64(little-endian uint32 bytes of the band's rows, seed=band)

read as a signed int64 (two's complement). The warehouse's index (layout
near-index/2) keeps their low 32 bits (`fold_to_int32`) in one INTEGER column
per band of each record's `near_index` row, each column under its own index.
Using the band number as the seed makes equal row values in different bands
give different keys, so keys of two bands never collide by construction.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

#: Name of the band-key rule above, for index identities.
KEY_SCHEME = "xxh64-le32-bandseed"


@lru_cache(maxsize=256)
def choose_bands_rows(
    threshold: float,
    num_perm: int,
    fp_weight: float = 0.5,
    fn_weight: float = 0.5,
) -> tuple[int, int]:
    """``(bands, rows)`` minimising the weighted false positive/negative areas, as datasketch chooses them.

    Reads the public ``b`` and ``r`` of ``datasketch.MinHashLSH(threshold, num_perm, weights=(fp_weight,
    fn_weight))``, which searches every ``bands * rows <= num_perm`` for the least ``fp_weight * FP + fn_weight *
    FN`` (``FP`` the area under the candidate probability below ``threshold``, ``FN`` the area above it that the
    probability misses). datasketch is imported here, not at the top, because it imports scipy. Where
    datasketch refuses (its optimum has one band, or the weights do not sum to 1), the ValueError says so:
    give ``bands`` and ``rows`` yourself then.
    """
    if not 0.0 < threshold < 1.0:
        raise ValueError("threshold must be in (0, 1)")
    if num_perm < 2:
        raise ValueError("num_perm must be at least 2")
    from datasketch import MinHashLSH

    try:
        lsh = MinHashLSH(threshold=threshold, num_perm=num_perm, weights=(fp_weight, fn_weight))
    except ValueError as error:
        raise ValueError(
            f"datasketch chooses no bands/rows for threshold={threshold}, num_perm={num_perm}, "
            f"weights=({fp_weight}, {fn_weight}): {error}; give bands and rows explicitly"
        ) from error
    return int(lsh.b), int(lsh.r)


def candidate_probability(similarity: float, bands: int, rows: int) -> float:
    """Chance that two documents with this Jaccard similarity share a band."""
    return float(1.0 - (1.0 - similarity**rows) ** bands)


_U = np.uint64
_P1, _P2, _P3, _P4, _P5 = (
    _U(0x9E3779B185EBCA87),
    _U(0xC2B2AE3D27D4EB4F),
    _U(0x165667B19E3779F9),
    _U(0x85EBCA77C2B2AE63),
    _U(0x27D4EB2F165667C5),
)


def _rotl(x: np.ndarray, r: int) -> np.ndarray:
    return (x << _U(r)) | (x >> _U(64 - r))


def _round(acc, lane: np.ndarray) -> np.ndarray:
    return _rotl(acc + lane * _P2, 31) * _P1


def xxh64_words(words: np.ndarray, seed: int = 0) -> np.ndarray:
    """XXH64 of each row's little-endian uint32 bytes, vectorised over rows.

    Equals ``[xxhash.xxh64_intdigest(row.astype("<u4").tobytes(), seed) for
    row in words]``: the XXH64 algorithm written out with numpy uint64
    arithmetic (wrapping is the intended mod 2**64). Every row has the same
    length, so the steps are the same for all rows and need no masking.
    """
    words = np.asarray(words, dtype=np.uint32)
    n, m = words.shape
    w = words.astype(np.uint64)
    lanes = [w[:, i] | (w[:, i + 1] << _U(32)) for i in range(0, m - 1, 2)]  # 8-byte reads
    s = _U(seed)
    with np.errstate(over="ignore"):
        if 4 * m >= 32:
            v = [np.full(n, x, dtype=np.uint64) for x in (s + _P1 + _P2, s + _P2, s, s - _P1)]
            stripes = (4 * m) // 32
            for k in range(stripes):
                v = [_round(v[i], lanes[4 * k + i]) for i in range(4)]
            h = _rotl(v[0], 1) + _rotl(v[1], 7) + _rotl(v[2], 12) + _rotl(v[3], 18)
            for i in range(4):
                h = (h ^ _round(_U(0), v[i])) * _P1 + _P4
            rest = lanes[4 * stripes :]
        else:
            h = np.full(n, s + _P5, dtype=np.uint64)
            rest = lanes
        h = h + _U(4 * m)
        for lane in rest:
            h = _rotl(h ^ _round(_U(0), lane), 27) * _P1 + _P4
        if m % 2:
            h = _rotl(h ^ (w[:, m - 1] * _P1), 23) * _P2 + _P3
        h ^= h >> _U(33)
        h *= _P2
        h ^= h >> _U(29)
        h *= _P3
        h ^= h >> _U(32)
    return h


def band_keys(signatures: np.ndarray, bands: int, rows: int) -> np.ndarray:
    """Per-band bucket keys, shape ``(n, bands)``, int64.

    Rows of empty documents (flagged by
    :func:`dedup_pipeline.core.minhash.empty_mask`) get keys too, all equal
    to each other; they must never be stored or indexed, or every empty
    document would become a candidate of every other. The warehouse index and
    :func:`dedup_pipeline.core.near.minhash_links` drop them.
    """
    signatures = np.asarray(signatures, dtype=np.uint32).reshape(-1, np.shape(signatures)[-1])
    n, num_perm = signatures.shape
    if bands < 1 or rows < 1 or bands * rows > num_perm:
        raise ValueError(f"bands * rows = {bands} * {rows} must be in [1, num_perm={num_perm}]")
    keys = np.empty((n, bands), dtype=np.uint64)
    for band in range(bands):
        keys[:, band] = xxh64_words(signatures[:, band * rows : (band + 1) * rows], seed=band)
    return keys.view(np.int64)


#: Name of the warehouse index's band keys: the low 32 bits of :func:`band_keys`, for a SQL INTEGER column.
KEY_SCHEME_32 = "xxh64lo32-le32-bandseed"


def fold_to_int32(keys: np.ndarray) -> np.ndarray:
    """The low 32 bits of int64 keys, as int32 (two's complement): what a SQL INTEGER column holds.

    Two different keys that fold to one value only make a false candidate,
    which verification drops; at 2**-32 a band, that is rare.
    """
    return (np.asarray(keys, dtype=np.int64) & np.int64(0xFFFFFFFF)).astype(np.uint32).view(np.int32)


def sorted_unique(values: np.ndarray) -> np.ndarray:
    """``np.unique(values)`` of a 1-D integer array, by sorting: numpy 2.4's ``np.unique`` finds them with a hash
    table first, 4 to 10 times slower than a sort on the pair codes and ids this package dedups."""
    ordered = np.sort(np.asarray(values).ravel())
    return ordered[np.r_[True, ordered[1:] != ordered[:-1]]] if ordered.size else ordered


def pairs_sharing_key(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """All position pairs ``(i, j)``, ``i < j``, whose ``keys`` are equal.

    Vectorised: sort, find runs of equal keys, and emit every pair inside each
    run. A run of ``m`` equal keys gives ``m * (m - 1) / 2`` pairs.
    """
    keys = np.asarray(keys)
    order = np.argsort(keys, kind="stable")
    sorted_keys = keys[order]
    run_start = np.flatnonzero(np.r_[True, sorted_keys[1:] != sorted_keys[:-1]])
    run_len = np.diff(np.r_[run_start, keys.size])
    # For the element at sorted position p in run [s, s + m): partners p+1 .. s+m-1.
    run_end = np.repeat(run_start + run_len, run_len)
    position = np.arange(keys.size)
    partners = run_end - position - 1
    first = np.repeat(position, partners)
    step = np.arange(first.size) - np.repeat(np.cumsum(partners) - partners, partners)
    i, j = order[first], order[first + 1 + step]
    return np.minimum(i, j), np.maximum(i, j)


def candidate_pairs(keys: np.ndarray) -> np.ndarray:
    """Unique pairs of rows sharing a key in at least one band, shape ``(m, 2)``.

    Rows are positions in ``keys`` (from :func:`band_keys`); pairs are sorted
    and have ``i < j``.
    """
    keys = np.atleast_2d(keys)
    n = keys.shape[0]
    codes = [np.empty(0, dtype=np.int64)]
    for band in range(keys.shape[1]):
        i, j = pairs_sharing_key(keys[:, band])
        codes.append(i.astype(np.int64) * n + j)
    unique = sorted_unique(np.concatenate(codes))
    return np.column_stack((unique // n, unique % n)) if n else np.empty((0, 2), dtype=np.int64)
