"""The fast signature path (shingles as slices of one buffer, compiled XXH32, minima) against the per-shingle one."""

from __future__ import annotations

import re
import unicodedata

import numba
import numpy as np
import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

from dedup_pipeline.core.minhash import minhash_signatures, minhash_signatures_from_texts
from dedup_pipeline.core.text import TextNormaliser, _bmp_folds
from dedup_pipeline.core.xxh32 import xxh32_slices

NORMALISERS = st.builds(
    lambda short, **settings: TextNormaliser(short_words=short[0], short_chars=short[1], **settings),
    # auto: word and/or character n-grams, and small cut-offs, so that a list of texts mixes short and long ones
    st.tuples(st.integers(0, 3), st.integers(0, 5)).filter(any),
    unicode_form=st.sampled_from(["NFC", "NFKC", "NFD", "NFKD", "none"]),
    casefold=st.booleans(),
    strip_punctuation=st.booleans(),
    digits=st.sampled_from(["keep", "mask"]),
    shingle=st.sampled_from(["word", "char", "auto"]),
    ngram=st.integers(1, 5),
    short_below=st.integers(0, 12),
)
# ASCII controls and separators, Unicode spaces, combining marks, ligatures, CJK, emoji, RTL: every rule has work.
# Pure ASCII texts take their own fast path, so a third of the texts are drawn from ASCII alone, runs of spaces
# included. Chunks free of the separator take the compiled rules 2-4 (characters beyond the BMP one by one after
# it), so a third are drawn from characters that casefold to several (ß, ΐ, ŉ), to another width (Ⱥ, K, ſ), digits.
TEXT = st.one_of(
    st.text(
        st.sampled_from(list("ab Z9_.,\t\n\x1c\x1f\x0b") + list("éÿ\u0301ﬁ漢字🙂𐐀\u00a0\u2003\u200fשל")), max_size=60
    ),
    st.text(
        st.sampled_from(list("aB Z9_.,\t\n\x1c") + list("ÉßẞİΐΰŉǰȺ\u212aſ’“”—…Жжё٣߁\u00a0\u2003\u0301漢ﬁ")),
        max_size=60,
    ),
    st.text(
        st.sampled_from(list("ab Z9_.,!") + [" ", "\t", "\n", "\r", "\x0b", "\x0c", "\x1c", "\x1f", "\x00"]),
        max_size=60,
    ),
)


@settings(max_examples=300, deadline=None)
@given(
    data=st.binary(max_size=300),
    cuts=st.lists(st.tuples(st.integers(0, 300), st.integers(0, 300)), max_size=40),
    seed=st.sampled_from([0, 1, 2**32 - 1]),
)
def test_xxh32_of_slices_equals_the_xxhash_package(data, cuts, seed):
    starts = np.array([min(a, len(data)) for a, _ in cuts], dtype=np.int64)
    lengths = np.array([min(b, len(data) - a) for a, (_, b) in zip(starts.tolist(), cuts)], dtype=np.int64)
    want = [xxhash.xxh32_intdigest(data[a : a + n], seed) for a, n in zip(starts.tolist(), lengths.tolist())]
    assert xxh32_slices(data, starts, lengths, seed).tolist() == want


def test_every_length_through_several_stripes_and_long_slices():
    data = bytes(range(256)) * 40
    lengths = np.array([*range(70), 1000, 9000], dtype=np.int64)
    starts = np.arange(lengths.size, dtype=np.int64) * 7
    want = [xxhash.xxh32_intdigest(data[a : a + n]) for a, n in zip(starts.tolist(), lengths.tolist())]
    assert xxh32_slices(data, starts, lengths).tolist() == want


def test_a_slice_outside_the_buffer_is_refused():
    with pytest.raises(ValueError, match="outside the buffer"):
        xxh32_slices(b"abc", np.array([2]), np.array([2]))
    assert xxh32_slices(b"", np.array([], dtype=np.int64), np.array([], dtype=np.int64)).size == 0


@settings(max_examples=200, deadline=None)
@given(normaliser=NORMALISERS, texts=st.lists(TEXT, max_size=12))
def test_shingle_spans_are_the_shingles_of_every_text(normaliser, texts):
    spans = normaliser.shingle_spans(texts)
    cut = [spans.buffer[a : a + n] for a, n in zip(spans.starts.tolist(), spans.lengths.tolist())]
    assert cut == [s for text in texts for s in normaliser.shingle_bytes(text)]
    assert spans.counts.tolist() == [len(normaliser.shingle_bytes(text)) for text in texts]
    assert [normaliser.normalised_bytes(text) for text in texts] == [
        normaliser.normalise(text).encode() for text in texts
    ]


@settings(max_examples=300, deadline=None)
@given(normaliser=NORMALISERS, texts=st.lists(TEXT, max_size=12))
def test_normalised_buffer_is_every_normalised_text_joined_by_spaces(normaliser, texts):
    buffer, sizes = normaliser.normalised_buffer(texts)
    parts = [normaliser.normalised_bytes(text) for text in texts]
    assert buffer == b" ".join(parts)
    assert sizes.tolist() == [len(part) for part in parts]


@settings(max_examples=60, deadline=None)
@given(normaliser=NORMALISERS, texts=st.lists(TEXT, max_size=30), chunk=st.integers(1, 7))
def test_signatures_from_texts_equal_the_per_shingle_path(normaliser, texts, chunk):
    want = minhash_signatures([normaliser.shingle_bytes(text) for text in texts], 64, 3)
    got = minhash_signatures_from_texts(texts, normaliser, 64, 3, texts_per_chunk=chunk)
    assert got.dtype == np.uint32 and np.array_equal(got, want)


def test_auto_spans_interleave_the_kinds_of_short_texts_in_text_order():
    normaliser = TextNormaliser(short_below=3, short_words=1, short_chars=2)
    texts = ["ab cd", "one two three four", "", "é x", "x"]
    spans = normaliser.shingle_spans(texts)
    cut = [spans.buffer[a : a + n] for a, n in zip(spans.starts.tolist(), spans.lengths.tolist())]
    assert cut == [
        b"ab",
        b"cd",
        b"ab",
        b"b ",
        b" c",
        b"cd",  # short: words, then character 2-grams
        b"one two three",
        b"two three four",  # long: word 3-grams
        "é".encode(),
        b"x",
        "é ".encode(),
        b" x",
        b"x",
        b"x",  # one character: its word and its whole text
    ]
    assert spans.counts.tolist() == [6, 2, 0, 4, 2]


def test_a_megabyte_token_is_one_shingle_hashed_exactly():
    token = "x" * 1_000_000
    normaliser = TextNormaliser(shingle="word", ngram=3)
    [signature] = minhash_signatures_from_texts([f"a {token} b"], normaliser, 32, 1)
    assert np.array_equal(signature, minhash_signatures([normaliser.shingle_bytes(f"a {token} b")], 32, 1)[0])


def test_kernels_compile_without_a_writable_cache_folder(monkeypatch):
    """A read-only install with no writable cache folder compiles in each process instead of failing to import."""
    from dedup_pipeline.core import xxh32

    def njit_without_cache_folder(*args, cache=False, **options):
        if cache:
            raise RuntimeError("cannot cache function: no locator available")
        return numba.njit(*args, **options)

    monkeypatch.setattr(xxh32, "njit", njit_without_cache_folder)

    @xxh32._compiled()
    def twice(x):
        return 2 * x

    assert twice(21) == 42


def test_minima_refuse_counts_that_do_not_match_the_hashes():
    from dedup_pipeline.core.minhash import _minima

    out = np.zeros((2, 4), dtype=np.uint32)
    with pytest.raises(ValueError, match="do not match"):
        _minima(np.arange(5, dtype=np.uint32), np.array([2, 2]), 4, 1, out)
    with pytest.raises(ValueError, match="do not match"):
        _minima(np.arange(4, dtype=np.uint32), np.array([2, 2]), 8, 1, out)


def is_script_mark(char: str) -> bool:
    """A combining mark but the script-neutral diacritics (U+0300-036F, 1AB0-1AFF, 1DC0-1DFF, 20D0-20FF, FE20-FE2F)."""
    generic = ((0x0300, 0x036F), (0x1AB0, 0x1AFF), (0x1DC0, 0x1DFF), (0x20D0, 0x20FF), (0xFE20, 0xFE2F))
    code = ord(char)
    return unicodedata.category(char) in ("Mn", "Mc", "Me") and not any(lo <= code <= hi for lo, hi in generic)


@pytest.mark.parametrize("casefold", [True, False])
@pytest.mark.parametrize("digits", ["keep", "mask"])
@pytest.mark.parametrize("marks", [True, False])
def test_the_compiled_rules_table_is_the_rules_of_every_bmp_character(casefold, digits, marks):
    folds = _bmp_folds(casefold, digits, marks)
    for c in range(0x80, 0x10000):
        text = chr(c).casefold() if casefold else chr(c)
        text = re.sub(r"\d", "0", text) if digits == "mask" else text
        kept = [char.isalnum() or (marks and is_script_mark(char)) for char in text]
        want = [ord(char) if keep else 0x20 for char, keep in zip(text, kept)]
        assert folds[c].tolist() == want + [0] * (3 - len(want)), hex(c)
