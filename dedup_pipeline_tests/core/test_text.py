"""Text normalisation and shingling: explicit rules, versioned identity."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dedup_pipeline.core.text import RULES_VERSION, TextNormaliser

SAMPLE = "Ｆｕｌｌ-width ﬁne Straße!  It's 3.14\u00a0€ — café\tnaïve_x 2024"


def test_golden_normalisation_pins_the_rule_version():
    # If this fails, a rule's output changed: bump RULES_VERSION (text/2...)
    # and update the expectations, never the other way round.
    assert RULES_VERSION == "text/1"
    n = TextNormaliser()
    assert n.normalise(SAMPLE) == "full width fine strasse it s 3 14 café naïve x 2024"
    assert TextNormaliser(digits="mask").normalise(SAMPLE) == "full width fine strasse it s 0 00 café naïve x 0000"
    assert TextNormaliser(strip_punctuation=False).normalise(SAMPLE) == (
        "full-width fine strasse! it's 3.14 € — café naïve_x 2024"
    )
    assert TextNormaliser(unicode_form="none", casefold=False).normalise(SAMPLE) == (
        "Ｆｕｌｌ width ﬁne Straße It s 3 14 café naïve x 2024"
    )
    assert n.shingles("One two, three. Four") == ["one two three", "two three four"]
    assert TextNormaliser(shingle="char", ngram=4).shingles("Ab, cd") == ["ab c", "b cd"]


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
    }
    identities = {n.identity()}
    for field, value in changes.items():
        changed = dataclasses.replace(n, **{field: value})
        assert changed.identity() != n.identity(), field
        identities.add(changed.identity())
    assert len(identities) == len(changes) + 1


def test_normaliser_is_frozen_and_validates():
    n = TextNormaliser()
    with pytest.raises(dataclasses.FrozenInstanceError):
        n.ngram = 5  # type: ignore[misc]
    for bad in ({"unicode_form": "NFX"}, {"digits": "drop"}, {"shingle": "line"}, {"ngram": 0}):
        with pytest.raises(ValueError):
            TextNormaliser(**bad)
    assert hash(n) == hash(TextNormaliser())


@pytest.mark.parametrize("normaliser", [TextNormaliser(), TextNormaliser(shingle="char", ngram=5)])
@pytest.mark.parametrize("text", ["", "   ", "\t\n", "!!! ... ---", "—", "_"])
def test_empty_documents_have_no_shingles(normaliser, text):
    assert normaliser.shingles(text) == []
    assert normaliser.shingle_bytes(text) == []


def test_short_documents_yield_their_whole_text_once():
    words = TextNormaliser(ngram=3)
    assert words.shingles("Hello") == ["hello"]
    assert words.shingles("Hello, World") == ["hello world"]
    assert words.shingles("a b c") == ["a b c"]
    chars = TextNormaliser(shingle="char", ngram=5)
    assert chars.shingles("Hi!") == ["hi"]
    assert chars.shingle_bytes("Hé") == ["hé".encode()]
    # Different short documents do not share their shingle.
    assert set(words.shingles("yes")).isdisjoint(words.shingles("no"))


NORMALISERS = [
    TextNormaliser(shingle=kind, ngram=n, strip_punctuation=strip, digits=digits, unicode_form=form)
    for kind in ("word", "char")
    for n in (1, 3)
    for strip in (True, False)
    for digits in ("keep", "mask")
    for form in ("NFKC", "none")
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
    assert TextNormaliser(ngram=1).shingles("b a b") == ["b", "a", "b"]
