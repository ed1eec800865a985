"""Text normalisation and shingling: explicit rules, versioned identity."""

from __future__ import annotations

import dataclasses
import itertools
import re
import unicodedata

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dedup_pipeline.core.text import PREVIOUS_RULES_VERSION, RULES_VERSION, TextNormaliser


def stripped_rule(text: str) -> str:
    return TextNormaliser(marks="strip").normalise(text)


SAMPLE = "Ｆｕｌｌ-width ﬁne Straße!  It's 3.14\u00a0€ — café\tnaïve_x 2024"


#: The default shingles of text/1, which text/2 names explicitly and must reproduce exactly (marks stripped).
TEXT_1 = TextNormaliser(shingle="word", ngram=3)
TEXT_1_EXACTLY = TextNormaliser(shingle="word", ngram=3, marks="strip")


def test_golden_normalisation_pins_the_rule_version():
    # If this fails, a rule's output changed: bump RULES_VERSION (text/3...)
    # and update the expectations, never the other way round.
    assert RULES_VERSION == "text/3" and PREVIOUS_RULES_VERSION == "text/1"
    n = TextNormaliser()
    assert n.normalise(SAMPLE) == "full width fine strasse it s 3 14 café naïve x 2024"
    assert TextNormaliser(digits="mask").normalise(SAMPLE) == "full width fine strasse it s 0 00 café naïve x 0000"
    assert TextNormaliser(strip_punctuation=False).normalise(SAMPLE) == (
        "full-width fine strasse! it's 3.14 € — café naïve_x 2024"
    )
    assert TextNormaliser(unicode_form="none", casefold=False).normalise(SAMPLE) == (
        "Ｆｕｌｌ width ﬁne Straße It s 3 14 café naïve x 2024"
    )
    assert TEXT_1.shingles("One two, three. Four") == ["one two three", "two three four"]
    assert TextNormaliser(shingle="char", ngram=4).shingles("Ab, cd") == ["ab c", "b cd"]
    # text/2's default: a short text is its words, then its character 4-grams, one set of both
    assert n.shingles("Jon Smith, 12 High St") == [
        "jon",
        "smith",
        "12",
        "high",
        "st",
        "jon ",
        "on s",
        "n sm",
        " smi",
        "smit",
        "mith",
        "ith ",
        "th 1",
        "h 12",
        " 12 ",
        "12 h",
        "2 hi",
        " hig",
        "high",
        "igh ",
        "gh s",
        "h st",
    ]
    # ... and a long one its word 3-grams, as text/1 shingled every text
    long_text = " ".join(f"w{i}" for i in range(n.short_below))
    assert n.shingles(long_text) == TEXT_1.shingles(long_text)
    assert n.identity() == (
        "text/3;unicode=NFKC;casefold=1;punct=strip;digits=keep;shingle=auto;n=3;short_below=75;short_words=1;short_chars=4"
    )
    assert TEXT_1.identity() == "text/3;unicode=NFKC;casefold=1;punct=strip;digits=keep;shingle=word;n=3"
    # text/3: combining marks stay in their words; marks="strip" is text/2's rule, under text/2's name
    assert n.normalise("हिन्दी भाषा, தமிழ் மொழி; العَرَبِيَّة") == "हिन्दी भाषा தமிழ் மொழி العَرَبِيَّة"
    # a spacing accent, which NFKC makes a space and a script-neutral mark, stays punctuation: "Men´s" is "men s"
    assert n.normalise("Men´s Watch") == stripped_rule("Men´s Watch") == "men s watch"
    assert stripped_rule("हिन्दी भाषा, தமிழ் மொழி; İstanbul") == "ह न द भ ष தம ழ ம ழ i stanbul"
    stripped = TextNormaliser(marks="strip")
    assert stripped.identity() == n.identity().replace("text/3;", "text/2;")
    assert stripped.normalise(SAMPLE) == n.normalise(SAMPLE)  # no mark in it: the same under both


def test_text_1_shingles_are_reproduced_by_explicit_settings_and_keep_their_old_name():
    """Pinning text/1's defaults gives its shingles, and names the index text/1 built as one of its identities."""
    text = "The quick brown fox, jumps over the lazy dog; again and again"
    assert TEXT_1.shingles(text) == [
        "the quick brown",
        "quick brown fox",
        "brown fox jumps",
        "fox jumps over",
        "jumps over the",
        "over the lazy",
        "the lazy dog",
        "lazy dog again",
        "dog again and",
        "again and again",
    ]
    assert TEXT_1.shingles("a b") == ["a b"]
    assert TEXT_1_EXACTLY.identities() == (
        TEXT_1_EXACTLY.identity(),
        "text/1;unicode=NFKC;casefold=1;punct=strip;digits=keep;shingle=word;n=3",
    )
    assert TextNormaliser(shingle="char", ngram=4, marks="strip").identities()[1].startswith("text/1;")
    assert TEXT_1.identities() == (TEXT_1.identity(),)  # with marks kept, not every text/1 key is the same
    assert TextNormaliser().identities() == (TextNormaliser().identity(),)  # auto is new in text/2


def test_auto_chooses_the_shingles_by_the_token_count():
    n = TextNormaliser(short_below=4, short_words=1, short_chars=3)
    assert n.shingles("a bb ccc") == ["a", "bb", "ccc", "a b", " bb", "bb ", "b c", " cc", "ccc"]  # 3 tokens: short
    assert n.shingles("a bb ccc d") == ["a bb ccc", "bb ccc d"]  # 4 tokens: long, word 3-grams
    assert TextNormaliser(short_below=4, short_words=0, short_chars=3).shingles("ab c") == ["ab ", "b c"]
    assert TextNormaliser(short_below=4, short_words=2, short_chars=0).shingles("ab c d") == ["ab c", "c d"]
    assert TextNormaliser(short_below=0).shingles("a b c d") == ["a b c", "b c d"]  # nothing is short
    # short and long texts keep their own kinds: a word never equals a 3-gram of words
    assert set(n.shingles("x y z")).isdisjoint(n.shingles("x y z w"))


def test_one_typo_costs_a_short_record_far_less_under_auto_than_under_word_3_grams():
    a = "margaret thompson 42 wattle street canberra 2600 act 19710312 5512093"
    b = "margaret thompson 42 wattle streat canberra 2600 act 19710312 5512093"  # 3 of 8 word 3-grams gone

    def jaccard(normaliser):
        x, y = set(normaliser.shingles(a)), set(normaliser.shingles(b))
        return len(x & y) / len(x | y)

    assert jaccard(TEXT_1) < 0.5 and jaccard(TextNormaliser()) > 0.8


def test_identity_is_deterministic_and_names_version_and_every_rule():
    n = TextNormaliser()
    assert n.identity() == TextNormaliser().identity()
    assert n.identity().startswith(RULES_VERSION + ";")
    assert n.version == RULES_VERSION
    changes = {
        "unicode_form": "NFC",
        "casefold": False,
        "strip_punctuation": False,
        "digits": "mask",
        "shingle": "char",
        "ngram": 4,
        "short_below": 7,
        "short_words": 2,
        "short_chars": 5,
        "marks": "strip",
    }
    assert set(changes) == {f.name for f in dataclasses.fields(TextNormaliser)}
    identities = {n.identity()}
    for field, value in changes.items():
        changed = dataclasses.replace(n, **{field: value})
        assert changed.identity() != n.identity(), field
        identities.add(changed.identity())
    assert len(identities) == len(changes) + 1
    # the short_* settings only shape auto's shingles, and only auto's identity names them
    word = TextNormaliser(shingle="word")
    assert dataclasses.replace(word, short_below=7, short_chars=5).identity() == word.identity()
    assert "short" not in word.identity()


def test_normaliser_is_frozen_and_validates():
    n = TextNormaliser()
    with pytest.raises(dataclasses.FrozenInstanceError):
        n.ngram = 5  # type: ignore[misc]
    for bad in (
        {"unicode_form": "NFX"},
        {"digits": "drop"},
        {"shingle": "line"},
        {"ngram": 0},
        {"ngram": True},
        {"short_below": -1},
        {"short_chars": -1},
        {"short_words": 1.5},
        {"short_words": 0, "short_chars": 0},
    ):
        with pytest.raises(ValueError):
            TextNormaliser(**bad)
    assert hash(n) == hash(TextNormaliser())


@pytest.mark.parametrize("normaliser", [TextNormaliser(), TEXT_1, TextNormaliser(shingle="char", ngram=5)])
@pytest.mark.parametrize("text", ["", "   ", "\t\n", "!!! ... ---", "—", "_"])
def test_empty_documents_have_no_shingles(normaliser, text):
    assert normaliser.shingles(text) == []
    assert normaliser.shingle_bytes(text) == []


def test_short_documents_yield_their_whole_text_once():
    words = TextNormaliser(shingle="word", ngram=3)
    assert words.shingles("Hello") == ["hello"]
    assert words.shingles("Hello, World") == ["hello world"]
    assert words.shingles("a b c") == ["a b c"]
    chars = TextNormaliser(shingle="char", ngram=5)
    assert chars.shingles("Hi!") == ["hi"]
    assert chars.shingle_bytes("Hé") == ["hé".encode()]
    # Different short documents do not share their shingle.
    assert set(words.shingles("yes")).isdisjoint(words.shingles("no"))


NORMALISERS = [
    TextNormaliser(shingle=kind, ngram=n, strip_punctuation=strip, digits=digits, unicode_form=form, short_below=below)
    for kind in ("word", "char", "auto")
    for n in (1, 3)
    for strip in (True, False)
    for digits in ("keep", "mask")
    for form in ("NFKC", "none")
    for below in ((3, 50) if kind == "auto" else (50,))
]


@settings(max_examples=400, deadline=None)
@given(st.text(), st.sampled_from(NORMALISERS))
def test_shingle_bytes_equal_encoded_shingles(text, normaliser):
    assert normaliser.shingle_bytes(text) == [s.encode("utf-8") for s in normaliser.shingles(text)]


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.characters(max_codepoint=127)))
def test_ascii_fast_path_matches_the_regex_rule(text):
    # ASCII text takes a translate table; the same text with one non-ASCII
    # letter appended takes the regex. Both must agree on the ASCII part.
    n = TextNormaliser(unicode_form="none", casefold=False)
    assert n.normalise(text + " é") == " ".join((n.normalise(text) + " é").split())


def test_shingles_keep_document_order_and_duplicates():
    assert TextNormaliser(shingle="word", ngram=1).shingles("b a b") == ["b", "a", "b"]
    assert TextNormaliser(short_chars=0).shingles("b a b") == ["b", "a", "b"]


#: Rule 4 alone (and rule 5, always on), so that it is exactly the regex below.
RULE_4 = TextNormaliser(unicode_form="none", casefold=False)
RULE_4_MARKS_STRIPPED = TextNormaliser(unicode_form="none", casefold=False, marks="strip")

#: Every combining mark (categories Mn, Mc, Me) as ranges of a regex character class.
_GENERIC = ((0x0300, 0x036F), (0x1AB0, 0x1AFF), (0x1DC0, 0x1DFF), (0x20D0, 0x20FF), (0xFE20, 0xFE2F))
_MARKS = [
    c
    for c in range(0x110000)
    if unicodedata.category(chr(c)) in ("Mn", "Mc", "Me") and not any(lo <= c <= hi for lo, hi in _GENERIC)
]
_MARK_CLASS = "".join(
    f"\\U{group[0]:08x}-\\U{group[-1]:08x}"
    for group in (
        [c for _, c in run] for _, run in itertools.groupby(enumerate(_MARKS), lambda pair: pair[1] - pair[0])
    )
)
#: Rule 4 as a regex: under text/3 every run of characters neither word characters (re's \w, which is
#: str.isalnum's plus "_") nor combining marks, or of "_"; under text/2 (marks stripped) marks are not spared.
_NOT_WORD = {True: re.compile(rf"(?:[^\w{_MARK_CLASS}]|_)+"), False: re.compile(r"[\W_]+")}


def regex_rule_4(text: str, marks: bool = True) -> str:
    return " ".join(_NOT_WORD[marks].sub(" ", text).split())


def assert_rule_4_is_the_regex(texts: list[str]) -> None:
    for normaliser, marks in ((RULE_4, True), (RULE_4_MARKS_STRIPPED, False)):
        want = [regex_rule_4(text, marks) for text in texts]
        assert [normaliser.normalise(text) for text in texts] == want  # one text at a time
        # A text holding the separator sends the chunk to the per-text rules 1-3 and rule 4 over the rest at once
        # (_non_ascii_bytes); the text holding it takes rule 4 alone.
        chunk = [*texts, "\x1f é"]
        assert normaliser._joined_rules_1_to_4(chunk) is None
        buffer, _ = normaliser.normalised_buffer(chunk)
        assert buffer == " ".join([*want, "é"]).encode()


# Whole blocks beyond the BMP where some characters are letters or digits and others not (Deseret, mathematical
# alphanumerics, emoji and their skin tones, CJK extension B, tags and variation selectors), and a sample of the rest.
BEYOND_BMP = sorted(
    {*range(0x10400, 0x10500), *range(0x1D400, 0x1D800), *range(0x1F300, 0x1F700), *range(0x20000, 0x20100)}
    | {*range(0xE0000, 0xE0200), *range(0x10000, 0x110000, 97), 0x10FFFF}
)


def test_rule_4_of_every_bmp_character_and_of_characters_beyond_it_is_the_regex():
    # Blocks of 256 consecutive code points: lone surrogates, the separator, combining marks, digits and "_" are among
    # them. A character kept where the regex makes it a space (or the other way) changes where the words split.
    bmp = ["".join(map(chr, range(start, start + 256))) for start in range(0, 0x10000, 256)]
    beyond = ["".join(map(chr, BEYOND_BMP[i : i + 256])) for i in range(0, len(BEYOND_BMP), 256)]
    assert_rule_4_is_the_regex(bmp + beyond)
    # Each character between two letters, so that a wrong one is named.
    for code in BEYOND_BMP:
        assert RULE_4.normalise(f"a{chr(code)}b") == regex_rule_4(f"a{chr(code)}b"), hex(code)


# ASCII, characters every rule has work on (ß, ΐ, combining marks, CJK, digits of other scripts, the separator, lone
# surrogates), characters beyond the BMP, and any code point at all.
MIXED = st.text(
    st.one_of(
        st.characters(max_codepoint=127),
        st.sampled_from(list("ab Z9_.,\t\n\x1c\x1f\x0b") + list("éÿ\u0301ﬁ漢字ßΐŉȺ\u212aſ’—…Жё٣߁\u00a0\u2003\u200fש")),
        st.sampled_from(
            [
                "\ud800",
                "\udfff",
                "🙂",
                "👍",
                "\U0001f3fd",
                "𐐀",
                "𐐨",
                "𝐀",
                "𝟗",
                "𠀀",
                "\U000e0041",
                "\U000fe000",
                "\U0010ffff",
            ]
        ),
        st.characters(exclude_categories=()),
    ),
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(st.lists(MIXED, max_size=8))
def test_rule_4_of_mixed_texts_is_the_regex(texts):
    assert_rule_4_is_the_regex(texts)
    # Under the default rules, rule 4 acts on what rules 1-3 made of the text.
    normaliser = TextNormaliser()
    assert [normaliser.normalise(text) for text in texts] == [
        regex_rule_4(unicodedata.normalize("NFKC", text).casefold()) for text in texts
    ]
