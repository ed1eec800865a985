"""Erasure subjects, keyed fingerprints and quarantine matching (pure, no database)."""

from __future__ import annotations

import json
import secrets

import pytest

from dedup_pipeline.core.erasure import (
    Catalogue,
    RawLineMatcher,
    Subject,
    SubjectError,
    SubjectKind,
    digest_fingerprint,
    field_texts,
    field_value,
    fingerprint,
    key_id,
    natural_key_fingerprint,
    payload_digests,
    record_fingerprints,
    subject_fingerprint,
    url_fingerprint,
)
from dedup_pipeline.core.fields import canonical_fields
from dedup_pipeline.core.hashing import content_hash
from dedup_pipeline.core.records import canonicalise_record
from dedup_pipeline_tests.helpers import listing

KEY = secrets.token_hex(32).encode()


def test_every_url_variant_is_one_subject():
    variants = [
        "https://shop.example.com/p/7",
        "HTTPS://Shop.Example.com:443/p/7?utm_source=mail&gclid=x#reviews",
        "  https://shop.example.com/p/7?fbclid=1 ",
    ]
    subjects = {Subject.parse("canonical_url", v) for v in variants}
    assert len(subjects) == 1
    [subject] = subjects
    assert subject.value == "https://shop.example.com/p/7" and subject.scope == "url/2"
    assert subject_fingerprint(KEY, subject) == url_fingerprint(KEY, "https://shop.example.com/p/7")
    # A URL natural key is normalised the same way, so it names the same listing.
    assert Subject.parse("natural_key", variants[1]).value == subject.value


def test_fingerprints_depend_on_the_key_and_are_domain_separated():
    other_key = secrets.token_hex(32).encode()
    assert natural_key_fingerprint(KEY, "abc") != natural_key_fingerprint(other_key, "abc")
    # The same text as a natural key, a field value or under another field never collides.
    prints = {
        natural_key_fingerprint(KEY, "abc"),
        fingerprint(KEY, "field", "seller_id", "abc"),
        fingerprint(KEY, "field", "email", "abc"),
        url_fingerprint(KEY, "abc"),
    }
    assert len(prints) == 4
    assert len(natural_key_fingerprint(KEY, "abc")) == 32
    assert key_id(KEY) != key_id(other_key) and len(key_id(KEY)) == 16


def test_field_values_are_normalised_like_stored_payloads():
    a = Subject.parse("field", "  Jane   Doe ", field="seller_name")
    b = Subject.parse("field", "Jane Doe", field="seller_name")
    assert a == b
    payload = canonical_fields({"seller_name": "Jane\u00a0 Doe", "n": 12, "author": {"email": "x@y.org"}})
    assert field_value(payload, ("author", "email")) == "x@y.org"
    assert Subject.parse("field", "12", field="n").value == "12"


@pytest.mark.parametrize(
    "kind, value, extra, message",
    [
        ("person", "x", {}, "kind must be one of"),
        ("canonical_url", "mailto:someone@example.org", {}, "not a usable http"),
        ("field", "x", {}, "needs a field path"),
        ("field", "x", {"field": "a..b"}, "needs a field path"),
        ("content_digest", "abc", {"version": "content/1"}, "64 hex digits"),
        ("content_digest", "a" * 64, {"version": "content/9"}, "needs a hash version"),
        ("natural_key", "   ", {}, "empty"),
        # A mistyped kind with the other kind's option: erasing it as given would erase another subject.
        ("natural_key", "jane@example.org", {"field": "seller_email"}, "field path goes with kind 'field'"),
        ("canonical_url", "https://shop.example.com/p/1", {"field": "url"}, "field path goes with kind 'field'"),
        ("field", "s-1", {"field": "seller_id", "version": "content/2"}, "version goes with kind 'content_digest'"),
    ],
)
def test_unusable_subjects_are_refused_without_echoing_the_value(kind, value, extra, message):
    with pytest.raises(SubjectError, match=message) as error:
        Subject.parse(kind, value, **extra)
    if len(value.strip()) > 3:
        assert value not in str(error.value)


def test_record_fingerprints_cover_key_url_fields_and_every_tombstoned_version():
    record = canonicalise_record(listing(5, seller_id="s-9"), 1, ["content/1"], "content/1")
    assert "content/2" not in record.hashes  # the ladder was told not to compute it
    kid = key_id(KEY)
    catalogue = Catalogue.from_rows(
        [
            ("field", "seller_id", kid),
            ("field", "author.email", kid),
            ("natural_key", "", kid),
            ("canonical_url", "url/1", kid),
            ("content_digest", "content/1", kid),
            ("content_digest", "content/2", kid),
        ]
    )
    prints = set(
        record_fingerprints(KEY, catalogue, record.natural_key, record.canonical_url, record.payload, record.hashes)
    )
    v2 = content_hash(listing(5, seller_id="s-9"), "content/2")[0]
    assert digest_fingerprint(KEY, "content/2", v2) in prints  # computed from the payload
    assert digest_fingerprint(KEY, "content/1", record.hashes["content/1"]) in prints
    assert fingerprint(KEY, "field", "seller_id", "s-9") in prints
    assert url_fingerprint(KEY, "https://shop.example.com/p/5", "url/1") in prints  # tombstones of before url/2
    assert len(prints) == 5  # author.email is absent from this record
    # Only kinds that have tombstones are computed: with field tombstones alone, one fingerprint.
    only_fields = Catalogue.from_rows([("field", "seller_id", kid)])
    assert record_fingerprints(
        KEY, only_fields, record.natural_key, record.canonical_url, record.payload, record.hashes
    ) == [fingerprint(KEY, "field", "seller_id", "s-9")]
    assert payload_digests(record.payload) == {"content/1": record.hashes["content/1"], "content/2": v2}


def test_a_field_holding_a_list_names_each_of_its_elements():
    """Breaks: a field holds several values (Scrapy's `getall()`: `"author": ["Jane Doe", "Bob Roe"]`).

    Must hold: each string or number element is one of the field's values, normalised like a scalar, for the
    tombstone fingerprints and the quarantine matcher alike; nested lists and objects are not looked into.
    """
    payload = canonical_fields(
        {
            "author": ["Jane\u00a0 Doe", "Bob Roe", 4711001, None, True, ["Ann Poe"]],
            "seller": {"ids": ["s-1"]},
            "name": "Jane Doe",
        }
    )
    assert field_texts(payload, "author") == {"Jane Doe", "Bob Roe", "4711001"}
    assert field_texts(payload, "seller.ids") == {"s-1"} and field_texts(payload, "name") == {"Jane Doe"}
    assert field_texts(payload, "missing") == frozenset() and field_texts(payload, "name.first") == frozenset()
    catalogue = Catalogue.from_rows([("field", "author", key_id(KEY))])
    prints = record_fingerprints(KEY, catalogue, "k", "https://x.example/a", payload, {})
    assert fingerprint(KEY, "field", "author", "Jane Doe") in prints
    assert fingerprint(KEY, "field", "author", "Ann Poe") not in prints
    no_url = {"title": "no url", "author": ["Bob Roe", " Jane  Doe"]}  # parses, but is no record
    assert _matcher(fields={"author": {"Jane Doe"}}).matches(json.dumps(no_url).encode())
    assert not _matcher(fields={"author": {"Jane Doe"}}).matches(json.dumps({**no_url, "author": ["Bob Roe"]}).encode())


def _matcher(**kwargs):
    base = {"urls": set(), "natural_keys": set(), "fields": {}, "digests": {}}
    base.update(kwargs)
    return RawLineMatcher(**base)


def test_quarantine_matcher_reads_json_objects_exactly():
    matcher = _matcher(urls={"https://shop.example.com/p/1"})
    variant = json.dumps({"url": "HTTPS://SHOP.example.com/p/1?utm_campaign=z"}).encode()
    assert matcher.matches(variant)
    assert not matcher.matches(json.dumps({"url": "https://shop.example.com/p/10"}).encode())
    record = listing(3, seller_id="s-3")
    digest = content_hash(record, "content/2")[0]
    assert _matcher(digests={"content/2": {digest}}).matches(json.dumps(record).encode())
    assert _matcher(fields={"seller_id": {"s-3"}}).matches(
        json.dumps({"seller_id": " s-3 ", "url": "ftp://x"}).encode()
    )


def test_quarantine_matcher_searches_broken_lines_as_text():
    matcher = _matcher(urls={"https://shop.example.com/p/1"}, fields={"email": {"jane@example.org"}})
    assert matcher.matches(b'{"url": "https://Shop.Example.com/p/1?x=1", "title": "broken')
    assert not matcher.matches(b'{"url": "https://shop.example.com/p/10", "title": "broken')
    assert not matcher.matches(b'{"url": "https://shop.example.com/p/1/reviews", "title": "broken')
    assert matcher.matches(b'{"email": "jane@example.org", "price": \xff\xfe')  # invalid UTF-8 elsewhere
    assert not matcher.matches(b'{"email": "jane@example.org.evil", "x": ')  # a value is matched whole
    # What it cannot match, as documented: an identifier cut off by the truncation.
    assert not matcher.matches(b'{"email": "jane@exam')


def test_quarantine_matcher_finds_a_number_given_to_the_field():
    matcher = _matcher(fields={"seller.id": {"4711001"}})
    assert matcher.matches(b'{"seller": {"id": 4711001, "name": "Jan')
    assert matcher.matches(b'{"seller": {"id" : 4711001}, "x": ')
    assert not matcher.matches(b'{"seller": {"id": 47110012, "name": "Jan')  # a number is matched whole
    assert not matcher.matches(b'{"seller": {"id": 4711001.5, "name": "Jan')
    assert not matcher.matches(b'{"price": 4711001, "title": "Kett')  # another field's number


def test_subject_kinds_are_the_documented_four():
    assert [k.value for k in SubjectKind] == ["natural_key", "canonical_url", "field", "content_digest"]


def test_raw_lines_with_lone_surrogate_escapes_are_fingerprinted_without_failing():
    """A broken line may escape a lone surrogate anywhere (a URL, a field value, a plain string); once tombstones
    exist, the quarantine check fingerprints every such line, and once that failed the whole raw rung."""
    from dedup_pipeline.core.erasure import Catalogue, raw_line_fingerprints

    key = b"k" * 32
    catalogue = Catalogue(
        fields=frozenset({"seller_id"}),
        versions=frozenset({"content/1"}),
        key_ids=frozenset({"k"}),
        url_versions=frozenset({"url/1", "quarantine"}),
        natural_keys=True,
    )
    named = b'"url": "https://x.example/a", "seller_id": "s-1"'
    clean = set(raw_line_fingerprints(key, catalogue, b"{" + named + b', "ti'))
    beside = set(raw_line_fingerprints(key, catalogue, b'{"title": "\\udc00", ' + named + b', "ti'))
    assert clean and clean <= beside  # the subject is still found beside the bad escape
    raw_line_fingerprints(key, catalogue, b'{"url": "https://x.example/a\\ud800", "seller_id": "\\ud800", "ti')
    raw_line_fingerprints(key, catalogue, b"{" + named + b', "title": "\\ud800"}')
