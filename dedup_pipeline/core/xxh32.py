"""XXH32 of many byte slices of one buffer at once, with numpy.

``xxh32_slices(buffer, starts, lengths)[i]`` equals
``xxhash.xxh32_intdigest(buffer[starts[i]:starts[i] + lengths[i]])``: the
XXH32 algorithm written out with wrapping uint32 arithmetic, vectorised over
slices. Slices have different lengths, so each step of the algorithm runs on
the slices that still have input for it (stripes of 16 bytes, then words of
4, then single bytes); the work is proportional to the bytes hashed, and no
Python code runs per slice. The MinHash signatures hash every shingle of a
chunk of documents this way, as slices of the documents' normalised text.
"""

from __future__ import annotations

import numpy as np
from xxhash import xxh32_intdigest

_U = np.uint32
_P1, _P2, _P3, _P4, _P5 = _U(0x9E3779B1), _U(0x85EBCA77), _U(0xC2B2AE3D), _U(0x27D4EB2F), _U(0x165667B1)
_PAD = 16  # zero bytes after the buffer, so every 4-byte read at a valid position stays inside


def _rotl(x: np.ndarray, r: int) -> np.ndarray:
    return (x << _U(r)) | (x >> _U(32 - r))


class _Reader:
    """Little-endian uint32 reads at any byte position: the word starting at every byte, computed once.

    The words are read through a view whose elements overlap (stride 1) and
    copied into an aligned array, which random reads gather from three
    times faster than from the view itself.
    """

    def __init__(self, buffer: bytes):
        self.bytes = np.frombuffer(bytes(buffer) + bytes(_PAD), dtype=np.uint8)
        overlapping = np.ndarray((len(self.bytes) - 3,), dtype="<u4", buffer=self.bytes, strides=(1,))
        self.words = np.ascontiguousarray(overlapping, dtype=np.uint32)

    def word(self, positions: np.ndarray) -> np.ndarray:
        return self.words.take(positions)

    def byte(self, positions: np.ndarray) -> np.ndarray:
        return self.bytes.take(positions).astype(np.uint32)


def xxh32_slices(buffer: bytes, starts: np.ndarray, lengths: np.ndarray, seed: int = 0) -> np.ndarray:
    """XXH32 (``seed``) of ``buffer[starts[i] : starts[i] + lengths[i]]`` for every i, as uint32."""
    starts = np.asarray(starts, dtype=np.int64)
    lengths = np.asarray(lengths, dtype=np.int64)
    if starts.shape != lengths.shape:
        raise ValueError("starts and lengths must have the same shape")
    out = np.empty(starts.size, dtype=np.uint32)
    if not starts.size:
        return out
    if starts.min() < 0 or lengths.min() < 0 or (starts + lengths).max() > len(buffer):
        raise ValueError("a slice reaches outside the buffer")
    # Slices of one length take the same steps, so they are hashed together with no masking: sorted by
    # length, each length is one contiguous run. The rare long slice is one C call of the xxhash package.
    short = lengths <= MAX_VECTOR_LENGTH
    for i in np.flatnonzero(~short).tolist():
        out[i] = xxh32_intdigest(buffer[starts[i] : starts[i] + lengths[i]], seed)
    picked = np.flatnonzero(short)
    if not picked.size:
        return out
    order = picked[np.argsort(lengths[picked].astype(np.uint8), kind="stable")]
    by_length, from_start = lengths[order], starts[order]
    runs = np.flatnonzero(np.diff(by_length)) + 1
    read = _Reader(buffer)
    hashes = np.empty(order.size, dtype=np.uint32)
    with np.errstate(over="ignore"):
        for low, high in zip([0, *runs.tolist()], [*runs.tolist(), order.size]):
            hashes[low:high] = _hash_one_length(read, from_start[low:high], int(by_length[low]), _U(seed))
    out[order] = hashes
    return out


#: Longest slice hashed with numpy (a word 3-gram is about 18 bytes); longer ones go one by one.
MAX_VECTOR_LENGTH = 64


def _hash_one_length(read: _Reader, starts: np.ndarray, length: int, seed: np.uint32) -> np.ndarray:
    """XXH32 of the slices of ``length`` bytes at ``starts``: the algorithm's steps, each over all of them."""
    if length >= 16:
        v = [np.full(starts.size, x, dtype=np.uint32) for x in (seed + _P1 + _P2, seed + _P2, seed, seed - _P1)]
        for stripe in range(length // 16):
            for lane in range(4):
                v[lane] = _rotl(v[lane] + read.word(starts + (16 * stripe + 4 * lane)) * _P2, 13) * _P1
        h = _rotl(v[0], 1) + _rotl(v[1], 7) + _rotl(v[2], 12) + _rotl(v[3], 18)
    else:
        h = np.full(starts.size, seed + _P5, dtype=np.uint32)
    h += _U(length)
    at = 16 * (length // 16)
    for _ in range((length % 16) // 4):
        h = _rotl(h + read.word(starts + at) * _P3, 17) * _P4
        at += 4
    for _ in range(length % 4):
        h = _rotl(h + read.byte(starts + at) * _P5, 11) * _P1
        at += 1
    h ^= h >> _U(15)
    h *= _P2
    h ^= h >> _U(13)
    h *= _P3
    h ^= h >> _U(16)
    return h
