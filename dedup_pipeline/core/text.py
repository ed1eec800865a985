"""Explicit, versioned text normalisation and shingling.

A :class:`TextNormaliser` turns a document into the list of shingles that the
MinHash and SimHash signatures are computed from. Every rule that changes
which shingles come out is either a field of the dataclass or covered by
:data:`RULES_VERSION`, and :meth:`TextNormaliser.identity` names both, so
signatures made under different rules are never compared as equal.

Rules, in order:

1. Unicode normalisation (``unicode_form``, default NFKC: folds full-width
   forms, ligatures and compatibility characters).
2. ``casefold`` (stronger than ``lower``: "Straße" and "STRASSE" agree).
3. ``digits``: ``"keep"``, or ``"mask"`` to map every decimal digit to ``0``
   (so counters, prices and dates that change between crawls do not break
   shingles, while the shape of the number stays).
4. ``strip_punctuation``: every run of characters that are neither letters nor
   digits (punctuation, symbols, underscores, whitespace) becomes one space.
5. Whitespace is always collapsed to single spaces and trimmed.

Shingles are word n-grams (tokens joined by one space) or character n-grams
of the normalised text (spaces included). A non-empty document shorter than
the n-gram size yields exactly one shingle, its whole normalised text; an
empty document (or one that normalises to nothing) yields no shingle at all,
so empty documents never share a shingle with anything.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from typing import ClassVar

import numpy as np

#: Version of the rule *implementations* below. Bump it (``text/2``...) when
#: the code of a rule changes what it outputs for some input; the golden test
#: in ``test_text.py`` fails when that happens without a bump.
RULES_VERSION = "text/1"

_UNICODE_FORMS = ("NFC", "NFKC", "NFD", "NFKD", "none")
_DIGIT_POLICIES = ("keep", "mask")
_SHINGLE_KINDS = ("word", "char")

_NOT_ALNUM = re.compile(r"[\W_]+")
_DIGIT = re.compile(r"\d")
# The same rule for ASCII text as a translate table, about 20x faster than the
# regex (re's \w is exactly str.isalnum() plus "_").
_ASCII_NOT_ALNUM = str.maketrans({c: " " for c in range(128) if not chr(c).isalnum()})


@cache
def _ascii_byte_table(casefold: bool, digits: str, strip_punctuation: bool) -> bytes:
    """Rules 2-4 for ASCII text as one ``bytes.translate`` table (rule 1 never changes ASCII).

    ASCII controls 0x1C-0x1F become spaces whatever the rules, because
    ``str.split`` (rule 5) splits on them and ``bytes.split`` does not.
    """
    table = bytearray(range(256))
    for c in range(128):
        char = chr(c)
        if casefold:
            table[c] = ord(char.casefold())  # ASCII casefolds to one ASCII character
        if digits == "mask" and char.isdigit():
            table[c] = ord("0")
        if (strip_punctuation and not char.isalnum()) or 0x1C <= c <= 0x1F:
            table[c] = ord(" ")
    return bytes(table)


@cache
def _ascii_spacing_table(casefold: bool, digits: str, strip_punctuation: bool) -> bytes:
    """:func:`_ascii_byte_table`, and ASCII whitespace (what ``bytes.split`` splits on) becomes a space."""
    table = bytearray(_ascii_byte_table(casefold, digits, strip_punctuation))
    for c in b"\t\n\r\x0b\x0c":
        table[c] = ord(" ")
    return bytes(table)


#: Marks where one text ends in a buffer of many: a byte that UTF-8 never uses.
_TEXT_END = b"\xff"


@dataclass(frozen=True)
class ShingleSpans:
    """The shingles of many texts as slices of one buffer (see :meth:`TextNormaliser.shingle_spans`).

    Shingle ``i`` is ``buffer[starts[i] : starts[i] + lengths[i]]``; ``counts[d]`` shingles belong
    to text ``d``, in text order.
    """

    buffer: bytes
    starts: np.ndarray
    lengths: np.ndarray
    counts: np.ndarray


@dataclass(frozen=True)
class TextNormaliser:
    """Normalisation and shingling rules; immutable and hashable.

    The defaults (word 3-grams) were chosen on the quality data, see
    ``benchmarks/neardup_quality.py``.
    """

    unicode_form: str = "NFKC"
    casefold: bool = True
    strip_punctuation: bool = True
    digits: str = "keep"
    shingle: str = "word"
    ngram: int = 3

    version: ClassVar[str] = RULES_VERSION

    def __post_init__(self) -> None:
        if self.unicode_form not in _UNICODE_FORMS:
            raise ValueError(f"unicode_form must be one of {_UNICODE_FORMS}, got {self.unicode_form!r}")
        if self.digits not in _DIGIT_POLICIES:
            raise ValueError(f"digits must be one of {_DIGIT_POLICIES}, got {self.digits!r}")
        if self.shingle not in _SHINGLE_KINDS:
            raise ValueError(f"shingle must be one of {_SHINGLE_KINDS}, got {self.shingle!r}")
        if not isinstance(self.ngram, int) or self.ngram < 1:
            raise ValueError(f"ngram must be a positive int, got {self.ngram!r}")

    def identity(self) -> str:
        """A stable string naming the rule version and every setting."""
        return (
            f"{self.version};unicode={self.unicode_form};casefold={int(self.casefold)};"
            f"punct={'strip' if self.strip_punctuation else 'keep'};digits={self.digits};"
            f"shingle={self.shingle};n={self.ngram}"
        )

    def _apply_rules(self, text: str) -> str:
        """Rules 1-4; whitespace is not collapsed yet."""
        if self.unicode_form != "none":
            text = unicodedata.normalize(self.unicode_form, text)
        if self.casefold:
            text = text.casefold()
        if self.digits == "mask":
            text = _DIGIT.sub("0", text)
        if self.strip_punctuation:
            text = text.translate(_ASCII_NOT_ALNUM) if text.isascii() else _NOT_ALNUM.sub(" ", text)
        return text

    def normalise(self, text: str) -> str:
        """Apply rules 1-5 and return the normalised text."""
        return " ".join(self._apply_rules(text).split())

    def shingles(self, text: str) -> list[str]:
        """Shingles of ``text`` in document order (duplicates kept)."""
        norm = self.normalise(text)
        if not norm:
            return []
        n = self.ngram
        if self.shingle == "word":
            tokens = norm.split(" ")
            if len(tokens) <= n:
                return [norm]
            return list(map(" ".join, zip(*(tokens[i:] for i in range(n)))))
        if len(norm) <= n:
            return [norm]
        return [norm[i : i + n] for i in range(len(norm) - n + 1)]

    def shingle_bytes(self, text: str) -> list[bytes]:
        """``[s.encode("utf-8") for s in self.shingles(text)]``, computed faster.

        The hashing in :mod:`dedup_pipeline.core.minhash` works on bytes, so
        this cuts the shingles from the normalised text encoded once
        (:meth:`normalised_bytes`): word shingles are joined from its tokens.
        """
        data = self.normalised_bytes(text)
        if not data:
            return []
        n = self.ngram
        if self.shingle == "word":
            tokens = data.split(b" ")
            if len(tokens) <= n:
                return [data]
            return list(map(b" ".join, zip(*(tokens[i:] for i in range(n)))))
        norm = data.decode("utf-8")
        if len(norm) <= n:
            return [data]
        if len(data) == len(norm):  # ASCII: character and byte offsets agree
            return [data[i : i + n] for i in range(len(data) - n + 1)]
        return [norm[i : i + n].encode("utf-8") for i in range(len(norm) - n + 1)]

    def normalised_bytes(self, text: str) -> bytes:
        """``normalise(text).encode("utf-8")``; ASCII text takes one byte-table pass instead of rules 1-4."""
        if text.isascii():
            return b" ".join(text.encode("ascii").translate(self._byte_table).split())
        return self.normalise(text).encode("utf-8")

    @property
    def _byte_table(self) -> bytes:
        return _ascii_byte_table(self.casefold, self.digits, self.strip_punctuation)

    def normalised_buffer(self, texts: Sequence[str]) -> tuple[bytes, np.ndarray]:
        """``b" ".join(map(self.normalised_bytes, texts))`` and the length of each text's part in it.

        ASCII texts take rules 1-4 as one byte-table pass each (their
        whitespace becomes spaces); rule 5 then runs once over all of them, as
        numpy passes over the whole buffer: runs of spaces shrink to one, and
        the spaces left next to a text's ends (which :data:`_TEXT_END` marks)
        go. Other texts come normalised already, so the passes leave them as
        they are.
        """
        if not texts:
            return b"", np.zeros(0, dtype=np.int64)
        table = _ascii_spacing_table(self.casefold, self.digits, self.strip_punctuation)
        joined = _TEXT_END.join(
            text.encode("ascii").translate(table) if text.isascii() else self.normalise(text).encode("utf-8")
            for text in texts
        )
        data = np.frombuffer(joined, dtype=np.uint8)
        not_space = data != 0x20
        first_of_run = not_space.copy()
        first_of_run[1:] |= not_space[:-1]
        data = data[first_of_run]
        end = np.concatenate(([True], data == _TEXT_END[0], [True]))
        data = data[~((data == 0x20) & (end[:-2] | end[2:]))]
        ends = np.flatnonzero(data == _TEXT_END[0])
        data[ends] = 0x20
        sizes = np.diff(np.concatenate(([-1], ends, [data.size]))) - 1
        return data.tobytes(), sizes

    def shingle_spans(self, texts: Sequence[str]) -> ShingleSpans:
        """The shingles of every text as slices of their normalised UTF-8, joined by single spaces.

        Slice for slice equal to :meth:`shingle_bytes` of each text: a word
        n-gram of normalised text is one contiguous run of it (its tokens are
        one space apart), and a character n-gram too. Only the normalisation
        runs per text; the slicing is a few numpy passes over the whole buffer.
        """
        buffer, sizes = self.normalised_buffer(texts)
        data = np.frombuffer(buffer, dtype=np.uint8)
        doc_starts = np.cumsum(sizes + 1) - (sizes + 1)
        if self.shingle == "word":  # units are tokens; the separators are spaces like any other
            spaces = np.flatnonzero(data == 0x20)
            unit_starts = np.concatenate(([0], spaces + 1))
            unit_ends = np.concatenate((spaces, [len(data)]))
            keep = unit_ends > unit_starts  # empty texts leave empty tokens
        else:  # units are characters: UTF-8 lead bytes; the separators are not part of any text
            unit_starts = np.flatnonzero((data & 0xC0) != 0x80)
            unit_ends = np.concatenate((unit_starts[1:], [len(data)]))
            keep = np.ones(unit_starts.size, dtype=bool)
            keep[np.searchsorted(unit_starts, doc_starts[1:] - 1)] = False
        unit_starts, unit_ends = unit_starts[keep], unit_ends[keep]
        units = np.bincount(np.searchsorted(doc_starts, unit_starts, side="right") - 1, minlength=len(sizes))
        n = self.ngram
        counts = np.where(units > n, units - n + 1, units > 0).astype(np.int64)
        first_unit = np.repeat(np.cumsum(units) - units, counts)
        first_unit += np.arange(first_unit.size) - np.repeat(np.cumsum(counts) - counts, counts)
        last_unit = first_unit + np.repeat(np.minimum(units, n), counts) - 1
        starts = unit_starts[first_unit]
        return ShingleSpans(buffer, starts, unit_ends[last_unit] - starts, counts)
