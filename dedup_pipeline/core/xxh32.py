"""The near rung's hot loops, compiled with numba: XXH32 of byte slices, and MinHash minima over them.

``xxh32_slices(buffer, starts, lengths)[i]`` equals
``xxhash.xxh32_intdigest(buffer[starts[i]:starts[i] + lengths[i]])``: the
XXH32 algorithm written out once, compiled to machine code, so hashing the
shingles of a chunk of texts (slices of their normalised text) runs no Python
per shingle. :func:`minhash_minima` turns a chunk's shingle hashes into
MinHash signatures.

Compiling takes about a second, so the machine code is cached on disk: in
``NUMBA_CACHE_DIR`` when it is set, else next to this file, else in the user's
cache folder; with none of them writable, each process compiles again. Every kernel lives in this
one module on purpose: the cache is invalidated when this file changes, not
when a file it calls into does.

Arithmetic is on ``uint64`` values masked to 32 bits: numba would promote
mixed ``uint32``/``int`` arithmetic to ``float64``.
"""

from __future__ import annotations

import numpy as np
from numba import njit


def _compiled(**options):
    """``numba.njit`` with the on-disk cache when there is a writable place for it, else without."""

    def decorate(function):
        try:
            return njit(cache=True, **options)(function)
        except RuntimeError:  # numba found no writable cache folder
            return njit(**options)(function)

    return decorate


_U = np.uint64
_MASK = _U(0xFFFFFFFF)
_P1, _P2, _P3, _P4, _P5 = _U(0x9E3779B1), _U(0x85EBCA77), _U(0xC2B2AE3D), _U(0x27D4EB2F), _U(0x165667B1)
_FMIX1, _FMIX2 = _U(0x85EBCA6B), _U(0xC2B2AE35)
_TWO_32 = _U(1 << 32)


@_compiled(inline="always")
def _rotl(x, r):
    return ((x << _U(r)) | (x >> _U(32 - r))) & _MASK


@_compiled(inline="always")
def _word(data, at):
    """The little-endian uint32 at byte ``at``."""
    return _U(data[at]) | (_U(data[at + 1]) << _U(8)) | (_U(data[at + 2]) << _U(16)) | (_U(data[at + 3]) << _U(24))


@_compiled()
def xxh32_at(data, start, length, seed):
    """XXH32 (``seed``) of ``data[start:start + length]`` (a uint8 array), as a uint64 below 2**32."""
    at = start
    end = start + length
    seed = _U(seed)
    if length >= 16:
        v1 = (seed + _P1 + _P2) & _MASK
        v2 = (seed + _P2) & _MASK
        v3 = seed
        v4 = (seed + _TWO_32 - _P1) & _MASK
        while at + 16 <= end:
            v1 = (_rotl((v1 + _word(data, at) * _P2) & _MASK, 13) * _P1) & _MASK
            v2 = (_rotl((v2 + _word(data, at + 4) * _P2) & _MASK, 13) * _P1) & _MASK
            v3 = (_rotl((v3 + _word(data, at + 8) * _P2) & _MASK, 13) * _P1) & _MASK
            v4 = (_rotl((v4 + _word(data, at + 12) * _P2) & _MASK, 13) * _P1) & _MASK
            at += 16
        h = (_rotl(v1, 1) + _rotl(v2, 7) + _rotl(v3, 12) + _rotl(v4, 18)) & _MASK
    else:
        h = (seed + _P5) & _MASK
    h = (h + _U(length)) & _MASK
    while at + 4 <= end:
        h = (_rotl((h + _word(data, at) * _P3) & _MASK, 17) * _P4) & _MASK
        at += 4
    while at < end:
        h = (_rotl((h + _U(data[at]) * _P5) & _MASK, 11) * _P1) & _MASK
        at += 1
    h ^= h >> _U(15)
    h = (h * _P2) & _MASK
    h ^= h >> _U(13)
    h = (h * _P3) & _MASK
    return h ^ (h >> _U(16))


@_compiled(inline="always")
def fmix32(h):
    """MurmurHash3's 32-bit finaliser, which datasketch applies to a hash before permuting it."""
    h ^= h >> _U(16)
    h = (h * _FMIX1) & _MASK
    h ^= h >> _U(13)
    h = (h * _FMIX2) & _MASK
    return h ^ (h >> _U(16))


@_compiled()
def _xxh32_each(data, starts, lengths, seed, out):
    for i in range(starts.size):
        out[i] = xxh32_at(data, starts[i], lengths[i], seed)


@_compiled()
def minhash_minima(hashes, counts, a, b, out):
    """MinHash rows of documents whose shingle hashes are consecutive runs of ``hashes``.

    Document ``d`` owns the next ``counts[d]`` hashes (raw XXH32 values); its
    row ``out[d]`` becomes, per permutation k, the minimum over them of
    ``(a[k] * fmix32(h) + b[k]) mod 2**32``. Rows of documents without
    shingles are left as they are (the caller's sentinel). The inner loop
    runs over one document's hashes for one permutation, so it vectorises.
    """
    mixed = np.empty(max(counts.max(), 1) if counts.size else 1, dtype=np.uint32)
    s = 0
    for d in range(counts.size):
        n = counts[d]
        if n == 0:
            continue
        for j in range(n):
            mixed[j] = fmix32(_U(hashes[s + j]))
        s += n
        for k in range(a.size):
            ak = a[k]
            bk = b[k]
            low = np.uint32(0xFFFFFFFF)
            for j in range(n):
                low = min(low, np.uint32(ak * mixed[j] + bk))
            out[d, k] = low


def _check_slices(size: int, starts: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``starts`` and ``lengths`` as int64 arrays, refused when a slice reaches outside ``size`` bytes.

    The kernel does not check bounds (that is what makes it fast), so it is called only after this check.
    """
    starts = np.ascontiguousarray(starts, dtype=np.int64)
    lengths = np.ascontiguousarray(lengths, dtype=np.int64)
    if starts.shape != lengths.shape:
        raise ValueError("starts and lengths must have the same shape")
    if starts.size and (starts.min() < 0 or lengths.min() < 0 or (starts + lengths).max() > size):
        raise ValueError("a slice reaches outside the buffer")
    return starts, lengths


def xxh32_slices(buffer: bytes, starts: np.ndarray, lengths: np.ndarray, seed: int = 0) -> np.ndarray:
    """XXH32 (``seed``) of ``buffer[starts[i] : starts[i] + lengths[i]]`` for every i, as uint32."""
    starts, lengths = _check_slices(len(buffer), starts, lengths)
    out = np.empty(starts.size, dtype=np.uint32)
    if starts.size:
        _xxh32_each(np.frombuffer(buffer, dtype=np.uint8), starts, lengths, seed, out)
    return out


@_compiled(inline="always")
def _bmp_character(data, i):
    """The code point of the two- or three-byte UTF-8 character at byte ``i``, and its width."""
    b = np.int64(data[i])
    if b < 0xE0:
        return ((b & 0x1F) << 6) | (np.int64(data[i + 1]) & 0x3F), 2
    return ((b & 0x0F) << 12) | ((np.int64(data[i + 1]) & 0x3F) << 6) | (np.int64(data[i + 2]) & 0x3F), 3


@_compiled()
def _fold_and_strip(data, ascii_table, folds, out, wide):
    """Copy UTF-8 ``data`` to ``out``, each ASCII byte through ``ascii_table`` and each BMP character replaced by
    its (up to three) code points in ``folds`` (0 ends them early), written as UTF-8. A character beyond the BMP
    is copied as it is and where it landed in ``out`` is noted in ``wide``. Returns the lengths used of both."""
    o = 0
    w = 0
    i = 0
    n = data.size
    while i < n:
        b = data[i]
        if b < 0x80:
            out[o] = ascii_table[b]
            o += 1
            i += 1
            continue
        if b >= 0xF0:
            wide[w] = o
            w += 1
            for k in range(4):
                out[o + k] = data[i + k]
            o += 4
            i += 4
            continue
        code, width = _bmp_character(data, i)
        i += width
        for k in range(3):
            c = np.int64(folds[code, k])
            if c == 0:
                break
            if c < 0x80:
                out[o] = c
                o += 1
            elif c < 0x800:
                out[o] = 0xC0 | (c >> 6)
                out[o + 1] = 0x80 | (c & 0x3F)
                o += 2
            else:
                out[o] = 0xE0 | (c >> 12)
                out[o + 1] = 0x80 | ((c >> 6) & 0x3F)
                out[o + 2] = 0x80 | (c & 0x3F)
                o += 3
    return o, w


def fold_and_strip(data: bytes, ascii_table: np.ndarray, folds: np.ndarray, wide_rules) -> bytes:
    """:func:`_fold_and_strip` of UTF-8 ``data``; each character beyond the BMP then becomes ``wide_rules(it)``.

    ``folds`` must not grow a character's UTF-8 more than three times (see core.text, which builds it).
    """
    source = np.frombuffer(data, dtype=np.uint8)
    out = np.empty(3 * source.size, dtype=np.uint8)
    wide = np.empty(source.size // 4 + 1, dtype=np.int64)
    length, count = _fold_and_strip(source, ascii_table, folds, out, wide)
    result = out[:length].tobytes()
    if not count:
        return result
    pieces, last = [], 0
    for at in wide[:count].tolist():
        pieces += [result[last:at], wide_rules(result[at : at + 4])]
        last = at + 4
    pieces.append(result[last:])
    return b"".join(pieces)
