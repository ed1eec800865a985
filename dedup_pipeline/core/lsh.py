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

from dedup_pipeline.core.minhash import empty_mask

#: Name of the band-key rule above, for index identities.
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


_U = np.uint64
_P1, _P2, _P3, _P4, _P5 = (
    _U(0x9E3779B185EBCA87), _U(0xC2B2AE3D27D4EB4F), _U(0x165667B19E3779F9),
    _U(0x85EBCA77C2B2AE63), _U(0x27D4EB2F165667C5),
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
    document would become a candidate of every other. :class:`LshIndex` and
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

    Stored like the warehouse table, column-wise: per band, a sorted array of
    keys and the slot (insertion number) of each, so inserting or querying a
    batch is a few numpy calls per band rather than a Python dict operation
    per key. New entries are merged into the sorted arrays at the next query;
    removal marks a slot dead, and dead slots are dropped once they outnumber
    live ones. Ids may be any hashable values. Empty-document signatures are
    refused on insert and match nothing on query.
    """

    def __init__(self, bands: int, rows: int) -> None:
        if bands < 1 or rows < 1:
            raise ValueError("bands and rows must be positive")
        self.bands = bands
        self.rows = rows
        self._ids: list[Hashable] = []  # slot -> id (dead slots included)
        self._slots: dict[Hashable, int] = {}  # id -> slot, live entries only
        self._alive = np.zeros(0, dtype=bool)
        self._sorted_keys = np.empty((bands, 0), dtype=np.int64)
        self._sorted_slots = np.empty((bands, 0), dtype=np.int64)
        self._pending: list[np.ndarray] = []  # key blocks of slots not yet merged

    def __len__(self) -> int:
        return len(self._slots)

    def __contains__(self, item: Hashable) -> bool:
        return item in self._slots

    def insert_many(self, ids: Sequence[Hashable], signatures: np.ndarray) -> None:
        """Index each ``ids[i]`` under the bands of ``signatures[i]``."""
        ids = list(ids)
        if len(ids) != len(signatures):
            raise ValueError("ids and signatures differ in length")
        if len(set(ids)) != len(ids) or any(i in self._slots for i in ids):
            raise ValueError("ids must be unique and not yet indexed")
        if not ids:
            return
        if empty_mask(signatures).any():
            raise ValueError("empty-document signatures cannot be indexed (see empty_mask)")
        keys = band_keys(signatures, self.bands, self.rows)
        first = len(self._ids)
        self._ids.extend(ids)
        self._slots.update(zip(ids, range(first, first + len(ids))))
        self._alive = np.concatenate((self._alive, np.ones(len(ids), dtype=bool)))
        self._pending.append(keys)

    def _merge_pending(self) -> None:
        if not self._pending:
            return
        new_keys = np.concatenate(self._pending).T
        new_slots = np.arange(len(self._ids) - new_keys.shape[1], len(self._ids))
        self._pending = []
        keys = np.concatenate((self._sorted_keys, new_keys), axis=1)
        slots = np.concatenate((self._sorted_slots, np.broadcast_to(new_slots, new_keys.shape)), axis=1)
        # Two sorted runs per band: the stable sort (timsort) merges them in linear time.
        order = np.argsort(keys, axis=1, kind="stable")
        self._sorted_keys = np.take_along_axis(keys, order, axis=1)
        self._sorted_slots = np.take_along_axis(slots, order, axis=1)

    def query_slots(self, signatures: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Unique ``(query position, slot)`` pairs of live matches, sorted."""
        self._merge_pending()
        signatures = np.asarray(signatures, dtype=np.uint32).reshape(-1, np.shape(signatures)[-1])
        queries = np.flatnonzero(~empty_mask(signatures)) if len(signatures) else np.empty(0, dtype=np.int64)
        keys = band_keys(signatures[queries], self.bands, self.rows)
        found_q, found_s = [np.empty(0, dtype=np.int64)], [np.empty(0, dtype=np.int64)]
        for band in range(self.bands):
            sorted_keys = self._sorted_keys[band]
            lo = np.searchsorted(sorted_keys, keys[:, band], side="left")
            count = np.searchsorted(sorted_keys, keys[:, band], side="right") - lo
            total = int(count.sum())
            if total:
                # Expand each query's run [lo, lo + count) of the sorted array.
                run_start = np.repeat(lo - (np.cumsum(count) - count), count)
                found_q.append(np.repeat(queries, count))
                found_s.append(self._sorted_slots[band][run_start + np.arange(total)])
        q, slot = np.concatenate(found_q), np.concatenate(found_s)
        live = self._alive[slot]
        width = max(len(self._ids), 1)
        code = np.unique(q[live] * width + slot[live])
        return code // width, code % width

    def query_many(self, signatures: np.ndarray) -> list[set[Hashable]]:
        """Candidate ids for each signature: ids sharing at least one band."""
        n = len(np.asarray(signatures).reshape(-1, np.shape(signatures)[-1]))
        q, slot = self.query_slots(signatures)
        ids = [self._ids[s] for s in slot.tolist()]
        bounds = np.searchsorted(q, np.arange(n + 1)).tolist()
        return [set(ids[bounds[i] : bounds[i + 1]]) for i in range(n)]

    def remove(self, item: Hashable) -> None:
        """Drop ``item``; ``KeyError`` if it is not indexed."""
        self._alive[self._slots.pop(item)] = False
        if len(self._ids) > 2 * len(self._slots) + 1024:
            self._compact()

    def remove_many(self, ids: Iterable[Hashable]) -> None:
        for item in ids:
            self.remove(item)

    def _compact(self) -> None:
        """Drop dead slots and renumber the live ones."""
        self._merge_pending()
        renumber = np.cumsum(self._alive) - 1
        keep = self._alive[self._sorted_slots]  # every band holds each slot once
        live = int(self._alive.sum())
        self._sorted_keys = self._sorted_keys[keep].reshape(self.bands, live)
        self._sorted_slots = renumber[self._sorted_slots[keep]].reshape(self.bands, live)
        self._ids = [i for i, alive in zip(self._ids, self._alive.tolist()) if alive]
        self._slots = {item: slot for slot, item in enumerate(self._ids)}
        self._alive = np.ones(len(self._ids), dtype=bool)
