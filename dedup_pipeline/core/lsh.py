"""LSH banding for MinHash signatures.

A signature of ``num_perm`` values is cut into ``bands`` bands of ``rows``
values; two documents become candidates when any band matches exactly. The
chance of that for Jaccard similarity ``s`` is ``1 - (1 - s**rows)**bands``.

Band keys are what a persistent index stores, one ``(band, key, record_id)``
row per band and document, so they must not depend on the process or the
platform::

    key(band) = xxh64(little-endian uint32 bytes of the band's rows, seed=band)

read as a signed int64 (two's complement) so it fits a SQL ``BIGINT``. Using
the band number as the seed makes equal row values in different bands give
different keys, so an index on ``key`` alone cannot mix bands either.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence

import numpy as np
from xxhash import xxh64_intdigest

from dedup_pipeline.core.minhash import empty_mask

KEY_SCHEME = "xxh64-le32-bandseed"


def _band_probability(s: np.ndarray, bands: np.ndarray, rows: np.ndarray) -> np.ndarray:
    return 1.0 - (1.0 - s ** rows) ** bands


def choose_bands_rows(
    threshold: float,
    num_perm: int,
    fp_weight: float = 0.5,
    fn_weight: float = 0.5,
) -> tuple[int, int]:
    """``(bands, rows)`` minimising the weighted false positive/negative areas.

    Same objective as datasketch's ``_optimal_param``: over every ``bands *
    rows <= num_perm``, minimise ``fp_weight * FP + fn_weight * FN`` where
    ``FP`` is the area under the candidate probability below ``threshold`` and
    ``FN`` the area above it that the probability misses. The integrands are
    polynomials of degree ``bands * rows <= num_perm``, so Gauss-Legendre
    quadrature with ``num_perm // 2 + 1`` nodes computes them exactly (up to
    rounding). Ties go to fewer bands, then fewer rows, as in datasketch.
    """
    if not 0.0 < threshold < 1.0:
        raise ValueError("threshold must be in (0, 1)")
    if num_perm < 1:
        raise ValueError("num_perm must be positive")
    nodes, weights = np.polynomial.legendre.leggauss(num_perm // 2 + 1)
    pairs = np.array([(b, r) for b in range(1, num_perm + 1) for r in range(1, num_perm // b + 1)])
    bands, rows = pairs[:, :1].astype(float), pairs[:, 1:].astype(float)
    # Map the nodes from [-1, 1] to [0, threshold] and to [threshold, 1].
    lo = threshold / 2 * (nodes + 1)
    hi = threshold + (1 - threshold) / 2 * (nodes + 1)
    fp = threshold / 2 * (_band_probability(lo, bands, rows) @ weights)
    fn = (1 - threshold) / 2 * ((1 - _band_probability(hi, bands, rows)) @ weights)
    best = int(np.argmin(fp_weight * fp + fn_weight * fn))  # first minimum = fewest bands, rows
    return int(pairs[best, 0]), int(pairs[best, 1])


def candidate_probability(similarity: float, bands: int, rows: int) -> float:
    """Chance that two documents with this Jaccard similarity share a band."""
    return float(1.0 - (1.0 - similarity**rows) ** bands)


def band_keys(signatures: np.ndarray, bands: int, rows: int) -> np.ndarray:
    """Per-band bucket keys, shape ``(n, bands)``, int64.

    Raises ``ValueError`` for empty-document signatures (see
    :func:`dedup_pipeline.core.minhash.empty_mask`): they must never be
    banded, so callers drop them first.
    """
    signatures = np.atleast_2d(signatures)
    n, num_perm = signatures.shape
    if bands < 1 or rows < 1 or bands * rows > num_perm:
        raise ValueError(f"bands * rows = {bands} * {rows} must be in [1, num_perm={num_perm}]")
    if n and empty_mask(signatures).any():
        raise ValueError("empty-document signatures must not be banded; drop rows flagged by empty_mask")
    le = np.ascontiguousarray(signatures, dtype="<u4")
    width = 4 * rows
    keys = np.empty((n, bands), dtype=np.uint64)
    for band in range(bands):
        data = np.ascontiguousarray(le[:, band * rows : (band + 1) * rows]).tobytes()
        keys[:, band] = np.fromiter(
            (xxh64_intdigest(data[i : i + width], band) for i in range(0, n * width, width)),
            dtype=np.uint64,
            count=n,
        )
    return keys.view(np.int64)


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
    unique = np.unique(np.concatenate(codes))
    return np.column_stack((unique // n, unique % n)) if n else np.empty((0, 2), dtype=np.int64)


class LshIndex:
    """In-memory LSH index over band keys: insert, query and remove many.

    Ids may be any hashable values. Empty-document signatures are refused on
    insert and match nothing on query.
    """

    def __init__(self, bands: int, rows: int) -> None:
        if bands < 1 or rows < 1:
            raise ValueError("bands and rows must be positive")
        self.bands = bands
        self.rows = rows
        self._tables: list[dict[int, list[Hashable]]] = [{} for _ in range(bands)]
        self._keys: dict[Hashable, tuple[int, ...]] = {}

    def __len__(self) -> int:
        return len(self._keys)

    def __contains__(self, item: Hashable) -> bool:
        return item in self._keys

    def insert_many(self, ids: Sequence[Hashable], signatures: np.ndarray) -> None:
        """Index each ``ids[i]`` under the bands of ``signatures[i]``."""
        if len(ids) != len(signatures):
            raise ValueError("ids and signatures differ in length")
        if len(set(ids)) != len(ids) or any(i in self._keys for i in ids):
            raise ValueError("ids must be unique and not yet indexed")
        keys = band_keys(signatures, self.bands, self.rows).tolist()
        tables = self._tables
        for item, row in zip(ids, keys):
            self._keys[item] = tuple(row)
            for table, key in zip(tables, row):
                bucket = table.get(key)
                if bucket is None:
                    table[key] = [item]
                else:
                    bucket.append(item)

    def query_many(self, signatures: np.ndarray) -> list[set[Hashable]]:
        """Candidate ids for each signature: ids sharing at least one band."""
        signatures = np.atleast_2d(signatures)
        results: list[set[Hashable]] = [set() for _ in range(len(signatures))]
        usable = np.flatnonzero(~empty_mask(signatures)) if len(signatures) else np.empty(0, int)
        keys = band_keys(signatures[usable], self.bands, self.rows).tolist()
        for position, row in zip(usable.tolist(), keys):
            found = results[position]
            for table, key in zip(self._tables, row):
                bucket = table.get(key)
                if bucket is not None:
                    found.update(bucket)
        return results

    def remove(self, item: Hashable) -> None:
        """Drop ``item`` from every band; ``KeyError`` if it is not indexed."""
        for table, key in zip(self._tables, self._keys.pop(item)):
            bucket = table[key]
            bucket.remove(item)
            if not bucket:
                del table[key]

    def remove_many(self, ids: Iterable[Hashable]) -> None:
        for item in ids:
            self.remove(item)
