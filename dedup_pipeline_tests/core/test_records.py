"""Parsing landing lines and canonicalising records: exact numbers, precise quarantine reasons."""

from decimal import Decimal

import pytest

from dedup_pipeline.core.errors import RecordError
from dedup_pipeline.core.records import canonicalise_record, parse_line, parse_timestamp

VERSIONS = ("content/1", "content/2")


def canon(record, **kwargs):
    return canonicalise_record(record, 1, VERSIONS, "content/1", **kwargs)


def test_json_numbers_are_read_exactly_never_as_floats():
    record = parse_line(b'{"url": "https://a.example/", "price": 0.1, "qty": 3}')
    assert record["price"] == Decimal("0.1") and isinstance(record["price"], Decimal)
    assert record["qty"] == 3 and isinstance(record["qty"], int)


@pytest.mark.parametrize(
    "raw, reason",
    [
        (b'{"url": "https://a.example/", "title": "cut', "malformed JSON"),
        (b"[1, 2, 3]", "must be a JSON object, got list"),
        (b'"just a string"', "must be a JSON object, got str"),
        (b'{"price": NaN}', "JSON constant NaN is not allowed"),
        (b'{"title": "caf\xe9"}', "invalid UTF-8 at byte"),
        (b'{"title": "a\\u0000b"}', "NUL character"),
        (b'{"title": "\\ud800 lone"}', "lone surrogate"),
    ],
)
def test_unusable_lines_raise_a_precise_reason(raw, reason):
    with pytest.raises(RecordError, match=reason):
        parse_line(raw)


@pytest.mark.parametrize(
    "raw",
    [
        b'{"url": "https://a.example/", "price": "1.00", "price": "9.00"}',
        b'{"url":"https://a.example/","price":"1.00","price":"9.00"}',
        b'{"url" : "https://a.example/", "price"\t:\t"1.00", "price" :"9.00"}',
        b'{"url": "https://a.example/", "offer": {"price": 1, "price": 2}}',
        b'{"url": "https://a.example/", "offers": [{"a": 1}, {"price": 1, "price": 2}], "note": "{"}',
    ],
    ids=["spaced", "compact", "space-before-colon", "nested", "in-a-list"],
)
def test_an_object_that_repeats_a_key_is_refused(raw):
    """Breaks: a line whose object names a key twice (json keeps the last value silently).

    Must hold: it is refused with a reason naming the key, however the line is spaced and however deep the object.
    """
    with pytest.raises(RecordError, match='duplicate key "price" in a JSON object'):
        parse_line(raw)


@pytest.mark.parametrize(
    "raw",
    [
        b'{"url": "https://a.example/", "title": "the \\"best\\" kettle", "t2": "a \\": b"}',
        b'{"url": "https://a.example/", "a": {"price": 1}, "b": {"price": 2}}',
        b'{"url" : "https://a.example/" , "title" : "x" }',
    ],
    ids=["quotes-in-text", "same-key-in-two-objects", "spaced-everywhere"],
)
def test_lines_that_only_look_like_they_repeat_a_key_are_read(raw):
    assert parse_line(raw)["url"] == "https://a.example/"


def test_surrogate_pairs_are_fine():
    assert parse_line(b'{"title": "\\ud83d\\ude00"}')["title"] == "\U0001f600"


def test_reasons_never_contain_the_values():
    with pytest.raises(RecordError) as info:
        parse_line(b'{"email": "secret-marker@example.com\\u0000"}')
    assert "secret-marker" not in str(info.value)


def test_canonical_record_fields():
    record = {
        "url": "HTTPS://Shop.Example.com:443/p/1?b=2&utm_source=x&a=1#frag",
        "title": "  Cafe\u0301   crème ",
        "price": " 9.90 ",
        "currency": "eur",
        "seller_id": "s1",
        "scraped_at": "2026-11-01T10:00:00Z",
        "crawl_id": "c",
        "proxy_ip": "10.0.0.1",
        "colour": "red",
    }
    result = canon(record)
    assert result.canonical_url == "https://shop.example.com/p/1?a=1&b=2"
    assert result.natural_key == result.canonical_url
    assert result.payload["title"] == "Café crème"
    assert result.payload["price"] == "9.9"
    assert result.payload["currency"] == "EUR"
    assert result.payload["colour"] == "red"  # unknown extra fields are kept
    assert not {"scraped_at", "crawl_id", "proxy_ip"} & result.payload.keys()
    assert set(result.hashes) == set(VERSIONS)
    assert result.crawled_at.isoformat() == "2026-11-01T10:00:00+00:00"


def test_volatile_fields_do_not_change_identity():
    a = canon({"url": "https://a.example/x", "title": "T", "scraped_at": "2026-01-01T00:00:00Z", "etag": "1"})
    b = canon({"url": "https://a.example/x", "title": "T", "scraped_at": "2026-02-01T00:00:00Z", "etag": "2"})
    assert a.hashes == b.hashes


@pytest.mark.parametrize(
    "record, reason",
    [
        ({"title": "no url"}, "missing url"),
        ({"url": "   "}, "missing url"),
        ({"url": 42}, "url must be text, got int"),
        ({"url": "javascript:alert(1)"}, "invalid url"),
        ({"url": "http://a.example:99999/"}, "invalid url"),
    ],
)
def test_records_without_a_usable_url_are_refused(record, reason):
    with pytest.raises(RecordError, match=reason):
        canon(record)


def test_configurable_natural_key():
    record = {"url": "https://a.example/x", "seller_id": "s1", "sku": "K"}
    assert canon(record, key_fields=("seller_id", "sku")).natural_key == '["s1", "K"]'
    with pytest.raises(RecordError, match="missing natural-key field 'sku'"):
        canon({"url": "https://a.example/x", "seller_id": "s1"}, key_fields=("seller_id", "sku"))


def test_a_failing_inactive_version_is_kept_as_an_error_not_a_guess():
    result = canon({"url": "https://a.example/x", "price": "9.90"})  # no title/currency/seller: content/2 cannot hash
    assert "content/2" not in result.hashes
    assert "missing identity field" in result.hash_errors["content/2"]


def test_timestamps():
    assert parse_timestamp("2026-11-01T10:00:00+02:00").isoformat() == "2026-11-01T08:00:00+00:00"
    assert parse_timestamp("yesterday") is None and parse_timestamp(None) is None


def test_a_line_read_as_text_is_parsed_like_its_bytes():
    """Breaks: a user following the docs reads a file in text mode and passes a str (it raised AttributeError).

    Must hold: a str is the same record as its UTF-8 bytes; anything else is a TypeError naming what it got.
    """
    line = '{"url": "https://a.example/", "title": "Café", "price": 0.1}'
    assert parse_line(line) == parse_line(line.encode("utf-8"))
    with pytest.raises(RecordError, match="malformed JSON"):
        parse_line('{"url": ')
    with pytest.raises(TypeError, match="parse_line takes bytes or a str, got NoneType"):
        parse_line(None)
