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
   A script's combining marks (the vowel signs of Devanagari or Tamil,
   Arabic's harakat) belong to their word (``marks="keep"``, ``text/3``);
   ``marks="strip"`` makes them punctuation too, as ``text/2`` did, which
   breaks the words of those scripts into bare consonants. The
   script-neutral diacritics that NFKC leaves (a spacing accent's) are
   punctuation under both.
5. Whitespace is always collapsed to single spaces and trimmed.

Shingles are word n-grams (tokens joined by one space) or character n-grams
of the normalised text (spaces included). A non-empty document shorter than
the n-gram size yields exactly one shingle, its whole normalised text; an
empty document (or one that normalises to nothing) yields no shingle at all,
so empty documents never share a shingle with anything.

``shingle="auto"`` (the default) chooses by the document's length: a text of
fewer than ``short_below`` tokens (after normalisation) is shingled as its word
``short_words``-grams followed by its character ``short_chars``-grams, one set
of both (a size of 0 leaves that kind out); a longer text as its word
``ngram``-grams. One typo in a 10-token record removes 3 of its 8 word 3-grams,
but only 1 of 10 words and about 4 of 50 character 4-grams; a long text has
words enough for 3-grams, which keep distinct texts on one topic apart and cost
a sixth of the shingles of character n-grams.
"""

from __future__ import annotations

import itertools
import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache, lru_cache, partial
from typing import ClassVar

import numpy as np

#: Version of the rule *implementations* below. Bump it (``text/2``...) when
#: the code of a rule changes what it outputs for some input; the golden test
#: in ``test_text.py`` fails when that happens without a bump.
RULES_VERSION = "text/3"

#: The rules of ``marks="strip"``: ``text/3`` but for combining marks, which it counted as punctuation. An index
#: built under it keeps its name (:meth:`TextNormaliser.identity`).
MARKS_STRIPPED_VERSION = "text/2"

#: The version before ``shingle="auto"``: its rules 1-5 and its word and char shingles are those of ``text/2``, so
#: an identity under it names the same shingles as ``marks="strip"`` (see :meth:`TextNormaliser.identities`).
PREVIOUS_RULES_VERSION = "text/1"

_UNICODE_FORMS = ("NFC", "NFKC", "NFD", "NFKD", "none")
_MARK_POLICIES = ("keep", "strip")
_MARK_CATEGORIES = ("Mn", "Mc", "Me")
#: The script-neutral combining diacritics (accents, tildes, dots for any Latin, Greek or Cyrillic letter). NFKC
#: composes them with the letter before them where Unicode can, so those left are a spacing accent's ("´" becomes
#: " " and U+0301) or stacked ones: punctuation, as before, so that "Men´s" stays "men s".
_GENERIC_MARKS = ((0x0300, 0x036F), (0x1AB0, 0x1AFF), (0x1DC0, 0x1DFF), (0x20D0, 0x20FF), (0xFE20, 0xFE2F))


def _is_word_char(char: str, marks: bool) -> bool:
    """Rule 4's letters and digits: ``str.isalnum``, and with `marks` the combining marks of a script (categories
    Mn, Mc, Me but the script-neutral diacritics of :data:`_GENERIC_MARKS`): Devanagari's vowel signs, Arabic's
    harakat."""
    if char.isalnum():
        return True
    if not marks or unicodedata.category(char) not in _MARK_CATEGORIES:
        return False
    code = ord(char)
    return not any(low <= code <= high for low, high in _GENERIC_MARKS)


_DIGIT_POLICIES = ("keep", "mask")
_SHINGLE_KINDS = ("word", "char", "auto")

_DIGIT = re.compile(r"\d")
# Rule 4 for ASCII text as a translate table, about 20x faster than the regex
# ``[\W_]+`` (re's \w is exactly str.isalnum() plus "_").
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


#: Joins texts that the rules then process as one string (see TextNormaliser._non_ascii_bytes).
_SEPARATOR = "\x1f"
_SEPARATOR_BYTE = _SEPARATOR.encode()


@lru_cache(maxsize=2)
def _bmp_word(marks: bool) -> np.ndarray:
    """One flag per BMP code point: does rule 4 keep it (:func:`_is_word_char`: ``str.isalnum``, which is what
    re's ``\\w`` is but ``_``, and with `marks` the combining marks)?"""
    return np.frombuffer(bytes(_is_word_char(chr(c), marks) for c in range(0x10000)), dtype=np.uint8)


@lru_cache(maxsize=1)
def _separator_table() -> np.ndarray:
    """Rule 4 for ASCII bytes (after casefolding): letters and digits stay, the separator stays, all else is a space."""
    table = np.full(128, 0x20, dtype=np.uint8)
    for c in range(128):
        if chr(c).isalnum():
            table[c] = c
    table[ord(_SEPARATOR)] = ord(_SEPARATOR)
    return table


@lru_cache(maxsize=1)
def _ascii_strip_table() -> np.ndarray:
    table = _separator_table().copy()
    table[ord(_SEPARATOR)] = 0x20
    return table


def _strip_non_alnum(text: str, marks: bool) -> str:
    """Rule 4 for non-ASCII text: every run of characters that are neither letters nor digits (nor, with `marks`,
    combining marks) becomes a space.

    With `marks` off, the same as ``re.sub(r"[\\W_]+", " ", text)`` up to the length of the runs (rule 5 collapses
    them anyway).
    """
    data = text.encode("utf-8", "surrogatepass")
    return _strip_only(data, _ascii_strip_table(), marks).decode("utf-8", "surrogatepass")


def _strip_only(data: bytes, ascii_table: np.ndarray, marks: bool) -> bytes:
    """Rule 4 alone of UTF-8 ``data``, by the compiled pass of rules 2-4 with rules 2 and 3 off; ASCII bytes go
    through ``ascii_table`` (:func:`_ascii_strip_table`, or :func:`_separator_table` to keep the separator)."""
    from dedup_pipeline.core.xxh32 import fold_and_strip

    # Without casefolding every row is one code point (the table is never None): itself when kept, else a space.
    wide = partial(_wide_rules, casefold=False, digits="keep", marks=marks)
    return fold_and_strip(data, ascii_table, _bmp_folds(False, "keep", marks), wide)


#: Marks where one text ends in a buffer of many: a byte that UTF-8 never uses.
_TEXT_END = b"\xff"


@cache
def _bmp_folds(casefold: bool, digits: str, marks: bool) -> np.ndarray | None:
    """Rules 2-4 for each BMP code point beyond ASCII: the code points it becomes, up to three (0 after the last).

    Row ``c`` holds ``chr(c)`` casefolded (when ``casefold``), its decimal digits masked (when ``digits="mask"``),
    and each resulting character that is neither letter nor digit a space: rules 2-4 act character by character,
    so a text's rules 2-4 are its characters' rows in turn. None if some character would become more than three,
    leave the BMP, or grow its UTF-8 more than three times (no Unicode version so far does).
    """
    folded = [chr(c).casefold() for c in range(0x10000)] if casefold else [chr(c) for c in range(0x10000)]
    single = np.fromiter(map(len, folded), dtype=np.int64, count=0x10000) == 1
    code = np.zeros(0x10000, dtype=np.int64)
    code[single] = np.fromiter(map(ord, itertools.compress(folded, single)), dtype=np.int64)
    folds = np.zeros((0x10000, 3), dtype=np.uint16)
    keep = _bmp_word(marks)[code].astype(bool)
    folds[:, 0] = np.where(keep, code, 0x20)
    if digits == "mask":
        folds[_bmp_decimal()[code].astype(bool), 0] = ord("0")
    for c in np.flatnonzero(~single).tolist():  # the few characters that casefold to several (ß, ŉ, ΐ...)
        text = _DIGIT.sub("0", folded[c]) if digits == "mask" else folded[c]
        out = [ord(char) if _is_word_char(char, marks) else 0x20 for char in text]
        width = sum(1 if o < 0x80 else 2 if o < 0x800 else 3 for o in out)
        if len(out) > 3 or max(out) > 0xFFFF or width > 3 * (2 if c < 0x800 else 3):
            return None
        folds[c] = 0
        folds[c, : len(out)] = out
    folds[:0x80] = 0  # ASCII takes the byte table
    return folds


@lru_cache(maxsize=1)
def _bmp_decimal() -> np.ndarray:
    """One flag per BMP code point: is it a decimal digit (what re's ``\\d`` matches)?"""
    return np.frombuffer(bytes(chr(c).isdecimal() for c in range(0x10000)), dtype=np.uint8)


@lru_cache(maxsize=4096)
def _wide_rules(char: bytes, casefold: bool, digits: str, marks: bool) -> bytes:
    """Rules 2-4 of one character beyond the BMP, as UTF-8 (the per-character rule :func:`_bmp_folds` tabulates)."""
    text = char.decode("utf-8")
    text = text.casefold() if casefold else text
    text = _DIGIT.sub("0", text) if digits == "mask" else text
    return "".join(c if _is_word_char(c, marks) else " " for c in text).encode("utf-8")


@cache
def _fold_ascii_table(casefold: bool, digits: str) -> np.ndarray:
    """Rules 2-4 for ASCII bytes, and the text separator becomes :data:`_TEXT_END`."""
    table = np.frombuffer(_ascii_byte_table(casefold, digits, True)[:128], dtype=np.uint8).copy()
    table[ord(_SEPARATOR)] = _TEXT_END[0]
    return table


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

    The defaults (``shingle="auto"``: word unigrams and character 4-grams for
    texts of fewer than 75 tokens, word 3-grams for longer ones) were chosen
    on the quality data, see ``benchmarks/neardup_quality.py --sweep``.
    ``TextNormaliser(shingle="word", ngram=3)`` is the earlier default, shingle
    for shingle. ``short_below``, ``short_words`` and ``short_chars`` only act
    under ``shingle="auto"``.
    """

    unicode_form: str = "NFKC"
    casefold: bool = True
    strip_punctuation: bool = True
    digits: str = "keep"
    shingle: str = "auto"
    ngram: int = 3
    short_below: int = 75
    short_words: int = 1
    short_chars: int = 4
    marks: str = "keep"

    version: ClassVar[str] = RULES_VERSION

    def __post_init__(self) -> None:
        if self.unicode_form not in _UNICODE_FORMS:
            raise ValueError(f"unicode_form must be one of {_UNICODE_FORMS}, got {self.unicode_form!r}")
        if self.digits not in _DIGIT_POLICIES:
            raise ValueError(f"digits must be one of {_DIGIT_POLICIES}, got {self.digits!r}")
        if self.marks not in _MARK_POLICIES:
            raise ValueError(f"marks must be one of {_MARK_POLICIES}, got {self.marks!r}")
        if self.shingle not in _SHINGLE_KINDS:
            raise ValueError(f"shingle must be one of {_SHINGLE_KINDS}, got {self.shingle!r}")
        for name in ("ngram", "short_below", "short_words", "short_chars"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < (1 if name == "ngram" else 0):
                raise ValueError(
                    f"{name} must be a {'positive' if name == 'ngram' else 'non-negative'} int, got {value!r}"
                )
        if self.shingle == "auto" and self.short_below and not (self.short_words or self.short_chars):
            raise ValueError("shingle='auto' needs short_words or short_chars for texts shorter than short_below")

    @property
    def _keep_marks(self) -> bool:
        return self.marks == "keep"

    def identity(self) -> str:
        """A stable string naming the rule version and every setting that shapes the shingles: ``marks="strip"``
        is named by its own version, ``text/2``, as the indexes built under it are."""
        return self._identity(self.version if self._keep_marks else MARKS_STRIPPED_VERSION)

    def identities(self) -> tuple[str, ...]:
        """:meth:`identity`, then the identities that earlier rule versions gave these same shingles.

        Under ``text/1`` and ``text/2`` (``marks="strip"``) the word and char kinds are one rule, so an index
        built under the ``text/1`` identity of a word or char normaliser holds the keys this one makes;
        ``shingle="auto"`` is new in ``text/2`` and has no earlier name.
        """
        if self.shingle == "auto" or self._keep_marks:
            return (self.identity(),)
        return self.identity(), self._identity(PREVIOUS_RULES_VERSION)

    def _identity(self, version: str) -> str:
        identity = (
            f"{version};unicode={self.unicode_form};casefold={int(self.casefold)};"
            f"punct={'strip' if self.strip_punctuation else 'keep'};digits={self.digits};"
            f"shingle={self.shingle};n={self.ngram}"
        )
        if self.shingle == "auto":
            identity += f";short_below={self.short_below};short_words={self.short_words};short_chars={self.short_chars}"
        return identity

    def _apply_rules(self, text: str) -> str:
        """Rules 1-4; whitespace is not collapsed yet."""
        text = self._rules_1_to_3(text)
        if self.strip_punctuation:
            text = text.translate(_ASCII_NOT_ALNUM) if text.isascii() else _strip_non_alnum(text, self._keep_marks)
        return text

    def _rules_1_to_3(self, text: str) -> str:
        if self.unicode_form != "none":
            text = unicodedata.normalize(self.unicode_form, text)
        if self.casefold:
            text = text.casefold()
        if self.digits == "mask":
            text = _DIGIT.sub("0", text)
        return text

    def _non_ascii_bytes(self, texts: list[str]) -> list[bytes]:
        """Rules 1-4 of many non-ASCII texts, as UTF-8 (whitespace not collapsed).

        Rules 1-3 run per text (the normalisation's quick check makes most of
        them free); rule 4 runs compiled over all of them at once, joined by a
        separator it leaves alone. A text holding the separator itself takes
        rule 4 on its own.
        """
        if not self.strip_punctuation:  # rule 5 must see Unicode whitespace, which only str.split knows
            return [self.normalise(t).encode("utf-8", "surrogatepass") for t in texts]
        done = [self._rules_1_to_3(t).encode("utf-8", "surrogatepass") for t in texts]
        alone = {i for i, data in enumerate(done) if _SEPARATOR_BYTE in data}
        together = [data for i, data in enumerate(done) if i not in alone]
        if together:
            joined = _strip_only(_SEPARATOR_BYTE.join(together), _separator_table(), self._keep_marks)
            stripped = iter(joined.split(_SEPARATOR_BYTE))
        return [
            _strip_only(data, _ascii_strip_table(), self._keep_marks) if i in alone else next(stripped)
            for i, data in enumerate(done)
        ]

    def _joined_rules_1_to_4(self, texts: Sequence[str]) -> bytes | None:
        """Rules 1-4 of texts of which some are not ASCII, joined by :data:`_TEXT_END`, whitespace as spaces.

        Rule 1 runs per non-ASCII text (ASCII is the same in every normal form); rules 2-4 run compiled over all
        of the chunk at once, a table row per character (:func:`_bmp_folds`), with no string per text. None
        where that does not apply: all texts ASCII (the byte-table path is faster), punctuation kept (rule 5
        must then see Unicode whitespace), or a text holding the separator. The few characters beyond the BMP
        (emoji...) are left as they are by the compiled pass and take the rules one by one after it.
        """
        if not self.strip_punctuation or all(map(str.isascii, texts)):
            return None
        form = self.unicode_form
        text = _SEPARATOR.join(t if form == "none" or t.isascii() else unicodedata.normalize(form, t) for t in texts)
        folds = _bmp_folds(self.casefold, self.digits, self._keep_marks)
        if text.count(_SEPARATOR) != len(texts) - 1 or folds is None:
            return None
        from dedup_pipeline.core.xxh32 import fold_and_strip

        return fold_and_strip(
            text.encode("utf-8", "surrogatepass"),
            _fold_ascii_table(self.casefold, self.digits),
            folds,
            partial(_wide_rules, casefold=self.casefold, digits=self.digits, marks=self._keep_marks),
        )

    def normalise(self, text: str) -> str:
        """Apply rules 1-5 and return the normalised text."""
        return " ".join(self._apply_rules(text).split())

    def _kinds(self, tokens: int) -> tuple[tuple[str, int], ...]:
        """The shingle kinds and sizes of a non-empty text of this many tokens, in the order they are emitted."""
        if self.shingle != "auto":
            return ((self.shingle, self.ngram),)
        if tokens >= self.short_below:
            return (("word", self.ngram),)
        return tuple((kind, n) for kind, n in (("word", self.short_words), ("char", self.short_chars)) if n)

    def shingles(self, text: str) -> list[str]:
        """Shingles of ``text`` in document order (duplicates kept); under ``"auto"``, word shingles first."""
        norm = self.normalise(text)
        if not norm:
            return []
        tokens = norm.split(" ")
        out: list[str] = []
        for kind, n in self._kinds(len(tokens)):
            if kind == "word":
                out += [norm] if len(tokens) <= n else list(map(" ".join, zip(*(tokens[i:] for i in range(n)))))
            else:
                out += [norm] if len(norm) <= n else [norm[i : i + n] for i in range(len(norm) - n + 1)]
        return out

    def shingle_bytes(self, text: str) -> list[bytes]:
        """``[s.encode("utf-8") for s in self.shingles(text)]``, computed faster.

        The hashing in :mod:`dedup_pipeline.core.minhash` works on bytes, so
        this cuts the shingles from the normalised text encoded once
        (:meth:`normalised_bytes`): word shingles are joined from its tokens.
        """
        data = self.normalised_bytes(text)
        if not data:
            return []
        tokens = data.split(b" ")
        out: list[bytes] = []
        for kind, n in self._kinds(len(tokens)):
            if kind == "word":
                out += [data] if len(tokens) <= n else list(map(b" ".join, zip(*(tokens[i:] for i in range(n)))))
                continue
            norm = data.decode("utf-8")
            if len(norm) <= n:
                out.append(data)
            elif len(data) == len(norm):  # ASCII: character and byte offsets agree
                out += [data[i : i + n] for i in range(len(data) - n + 1)]
            else:
                out += [norm[i : i + n].encode("utf-8") for i in range(len(norm) - n + 1)]
        return out

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
        joined = self._joined_rules_1_to_4(texts)
        if joined is None:
            table = _ascii_spacing_table(self.casefold, self.digits, self.strip_punctuation)
            others = iter(self._non_ascii_bytes([text for text in texts if not text.isascii()]))
            joined = _TEXT_END.join(
                text.encode("ascii").translate(table) if text.isascii() else next(others) for text in texts
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
        Under ``"auto"`` each text's kinds are chosen from its token count, and
        the kinds' spans are merged into text order by one stable sort.
        """
        buffer, sizes = self.normalised_buffer(texts)
        data = np.frombuffer(buffer, dtype=np.uint8)
        doc_starts = np.cumsum(sizes + 1) - (sizes + 1)
        words = _units(data, doc_starts, "word") if self.shingle != "char" else None
        if self.shingle != "auto":
            units = words if words is not None else _units(data, doc_starts, "char")
            starts, lengths, counts = _gram_spans(*units, self.ngram, None)
            return ShingleSpans(buffer, starts, lengths, counts)
        short = words[2] < self.short_below
        parts = [_gram_spans(*words, self.ngram, ~short)]
        if short.any():
            if self.short_words:
                parts.append(_gram_spans(*words, self.short_words, short))
            if self.short_chars:
                parts.append(_gram_spans(*_units(data, doc_starts, "char"), self.short_chars, short))
        counts = sum(part[2] for part in parts)
        if len(parts) == 1:
            return ShingleSpans(buffer, parts[0][0], parts[0][1], counts)
        # Each part lists its texts' spans in text order: a stable sort by text interleaves them, part by part.
        text_of = np.concatenate([np.repeat(np.arange(counts.size), part[2]) for part in parts])
        order = np.argsort(text_of, kind="stable")
        starts = np.concatenate([part[0] for part in parts])[order]
        lengths = np.concatenate([part[1] for part in parts])[order]
        return ShingleSpans(buffer, starts, lengths, counts)


def _units(data: np.ndarray, doc_starts: np.ndarray, kind: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Where each token (``"word"``) or character (``"char"``) of a normalised buffer starts and ends, and how many
    each text has."""
    if kind == "word":  # the separators are spaces like any other
        spaces = np.flatnonzero(data == 0x20)
        unit_starts = np.concatenate(([0], spaces + 1))
        unit_ends = np.concatenate((spaces, [len(data)]))
        keep = unit_ends > unit_starts  # empty texts leave empty tokens
    else:  # UTF-8 lead bytes; the separators are not part of any text
        unit_starts = np.flatnonzero((data & 0xC0) != 0x80)
        unit_ends = np.concatenate((unit_starts[1:], [len(data)]))
        keep = np.ones(unit_starts.size, dtype=bool)
        keep[np.searchsorted(unit_starts, doc_starts[1:] - 1)] = False
    unit_starts, unit_ends = unit_starts[keep], unit_ends[keep]
    # Units start in ascending order: each text's first unit is found by one search per text, not per unit.
    per_text = np.diff(np.searchsorted(unit_starts, np.append(doc_starts, len(data) + 1)))
    return unit_starts, unit_ends, per_text


def _gram_spans(
    unit_starts: np.ndarray, unit_ends: np.ndarray, units: np.ndarray, n: int, take: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Starts and lengths of the n-grams of units of the texts that ``take`` flags (all when None), and their counts.

    A text of ``u`` units has ``u - n + 1`` n-grams, or one (all of it) when ``0 < u <= n``.
    """
    counts = np.where(units > n, units - n + 1, units > 0).astype(np.int64)
    if take is not None:
        counts[~take] = 0
    first_unit = np.repeat(np.cumsum(units) - units, counts)
    first_unit += np.arange(first_unit.size) - np.repeat(np.cumsum(counts) - counts, counts)
    last_unit = first_unit + np.repeat(np.minimum(units, n), counts) - 1
    starts = unit_starts[first_unit]
    return starts, unit_ends[last_unit] - starts, counts
