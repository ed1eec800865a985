"""The seeds' hash properties, the two rules' details, and golden digests that pin them across releases."""

import json
from decimal import Decimal

import pytest

from benchmarks.bench_exact import seed_canonicalise, seed_content_hash  # the seeds' code, as the seeds write it
from dedup_pipeline import content_hash
from dedup_pipeline.core.errors import RecordError
from dedup_pipeline.core.fields import canonical_fields
from dedup_pipeline.core.hashing import HASH_RULES, compute_hashes, content_v1_bytes, hash_rule
from dedup_pipeline.core.records import parse_line

SEED_A = {"sku": "A1", "title": "Widget ", "price": 9.9, "scraped_at": "2026-07-05T10:00:00Z", "proxy_ip": "10.0.0.1"}
SEED_B = {"price": 9.90, "sku": "A1", "title": "Widget", "scraped_at": "2026-07-05T11:30:00Z", "proxy_ip": "10.0.0.9"}

LISTING = {
    "url": "https://shop.example.com/p/1?utm_source=x",
    "title": "Café  crème\tgrinder",
    "description": "Burr grinder, 40 mm",
    "price": Decimal("9.90"),
    "currency": "eur",
    "seller_id": "s-1",
    "sku": "G-1",
    "scraped_at": "2026-11-01T10:00:00Z",
    "crawl_id": "c1",
}


def test_seed_example_same_content_other_volatile_fields_and_key_order():
    assert content_hash(SEED_A, "content/1") == content_hash(SEED_B, "content/1")


def test_seed_example_real_change_hashes_differently():
    assert content_hash(SEED_A, "content/1") != content_hash({**SEED_A, "price": 10.0}, "content/1")


def test_content1_price_text_and_number_forms_agree():
    # The seeds: " 9.90 " and "9.9" hash the same when they mean the same price.
    forms = [" 9.90 ", "9.9", Decimal("9.900"), 9.9]
    digests = {content_hash({**SEED_A, "price": form}, "content/1")[0] for form in forms}
    assert len(digests) == 1


def test_content1_matches_the_seed_rule_byte_for_byte():
    record = {
        "sku": "A1",
        "title": "Cafe\u0301  au lait",
        "price": 12.5,
        "stock": 3,
        "url": "https://a.example/x",
        "etag": "e",
    }
    assert content_v1_bytes(canonical_fields(record)) == seed_canonicalise(record)
    assert content_hash(record, "content/1")[0] == seed_content_hash(record)


def ours_and_the_seeds(line: str) -> tuple[str, str]:
    """The `content/1` digest of a line as the ladder reads it (`parse_line`), and the seeds' (they `json.loads` it)."""
    return content_hash(parse_line(line.encode()), "content/1")[0], seed_content_hash(json.loads(line))


BASE = '"url":"https://shop.example.com/p/1","title":"Kettle","currency":"EUR","seller_id":"s1"'


@pytest.mark.parametrize(
    "line",
    [
        '{%s,"price":9.9,"sku":"K-1","stock":3,"on_sale":true,"colour":null}' % BASE,
        '{%s,"price":10,"price_minor":990}' % BASE,  # integers as they are, on both sides
        '{%s,"price":99999999999.9999}' % BASE,  # four decimals, below 10**11: the float's .4f is the number's
        '{%s,"price":-12.5,"rating":4.1234}' % BASE,  # a decimal whose exact text has four decimals
        '{%s,"price":"call for price"}' % BASE,  # price text that is no number: normalised text on both sides
        '{"url":"https://shop.example.com/p/1","title":"  Cafe\\u0301 \\t au lait ","price":9.9,'
        '"scraped_at":"x","etag":"e"}',
        '{%s,"price":1,"tags":["a","b"],"specs":{"w":3,"sizes":[1,2],"ok":false}}' % BASE,  # nested: nothing to change
        '{"title":"no url","price":9.9}',
    ],
)
def test_content1_is_the_seeds_digest_for_records_without_the_documented_differences(line):
    ours, seeds = ours_and_the_seeds(line)
    assert ours == seeds


# Each documented difference (docs/canonical.md): our digest of the line is the seeds' digest of what we make of it.
DIFFERENCES = {
    "numeric price text": ('{%s,"price":" 9.90 "}' % BASE, {"price": 9.9}),
    "numeric price_minor text": ('{%s,"price_minor":"990"}' % BASE, {"price_minor": 990.0}),
    "price past the float's precision": ('{%s,"price":0.00005}' % BASE, {"price": 0.0}),  # the seeds: "0.0001"
    "negative zero price": ('{%s,"price":-0.0}' % BASE, {"price": 0.0}),
    "decimal in another field": ('{%s,"price":1,"weight":1.25,"n":1e2}' % BASE, {"weight": "1.25", "n": "100"}),
    "nested values": (
        '{%s,"price":1,"specs":{"w":1.50,"h":null,"unit":" c  m ","currency":"eur"},"sizes":[1.5,2.0]}' % BASE,
        {"specs": {"w": "1.5", "unit": "c m", "currency": "EUR"}, "sizes": ["1.5", "2"]},
    ),
    "currency case": ('{%s,"price":1}' % BASE.replace('"currency":"EUR"', '"currency":"eur"'), {"currency": "EUR"}),
    "more volatile fields": (
        '{%s,"price":1,"fetched_at":"t","request_id":"r","user_agent":"u"}' % BASE,
        {"fetched_at": None, "request_id": None, "user_agent": None},
    ),
    "url/1": (
        '{%s,"price":1}'
        % BASE.replace("https://shop.example.com/p/1", "https://Shop.example.com/p/1?utm_source=x#top"),
        {"url": "https://shop.example.com/p/1"},
    ),
}


@pytest.mark.parametrize("line, as_we_read_it", DIFFERENCES.values(), ids=DIFFERENCES.keys())
def test_content1_differs_from_the_seeds_as_documented(line, as_we_read_it):
    ours, seeds = ours_and_the_seeds(line)
    assert ours != seeds
    assert ours == seed_content_hash({**json.loads(line), **as_we_read_it})


def test_content1_canonicalises_the_url():
    a = {**SEED_A, "url": "https://Shop.example.com/p/1?utm_source=mail#top"}
    b = {**SEED_A, "url": "https://shop.example.com/p/1"}
    assert content_hash(a, "content/1") == content_hash(b, "content/1")


@pytest.mark.parametrize("version", sorted(HASH_RULES))
def test_unicode_forms_and_whitespace_runs_hash_the_same(version):
    composed = {**LISTING, "title": "Caf\u00e9 grinder"}
    decomposed = {**LISTING, "title": "  Cafe\u0301\n grinder "}
    assert content_hash(composed, version) == content_hash(decomposed, version)


def test_content2_ignores_fields_outside_the_identity_tuple():
    base = content_hash(LISTING)
    assert content_hash({**LISTING, "sku": "other", "url": "https://elsewhere.example/", "colour": "red"}) == base
    assert content_hash({**LISTING, "seller_id": "s-2"}) != base


def test_content2_price_is_exact_minor_units():
    assert content_hash({**LISTING, "price": "9.9"}) == content_hash({**LISTING, "price": Decimal("9.90")})
    assert content_hash({**LISTING, "price": "9.9"}) == content_hash(
        {k: v for k, v in {**LISTING, "price_minor": 990}.items() if k != "price"}
    )
    assert content_hash({**LISTING, "price": "9.91"}) != content_hash(LISTING)
    jpy = {**LISTING, "currency": "JPY", "price": "990"}
    assert content_hash(jpy) == content_hash({**jpy, "price": None, "price_minor": 990})


@pytest.mark.parametrize("field", ["price_minor", "price"])
def test_content2_minor_units_are_exact_beyond_28_digits(field):
    """The decimal context rounds to 28 digits; two prices that differ in their 29th digit are two contents."""
    base = {k: v for k, v in LISTING.items() if k != "price"}
    one, other = 12345678901234567890123456789, 12345678901234567890123456788
    assert content_hash({**base, field: one}) != content_hash({**base, field: other})
    assert content_hash({**base, field: Decimal(one)}) == content_hash({**base, field: str(one)})


def test_content2_refuses_a_price_whose_minor_units_exceed_the_digit_limit():
    """A price of 4,300 digits fits; in cents it has 4,302, which no exact text may hold: an error, not a crash."""
    with pytest.raises(RecordError, match="out of range in minor units"):
        content_hash({**LISTING, "price": int("9" * 4300)})
    with pytest.raises(RecordError, match="out of range in minor units"):
        content_hash({**LISTING, "price": Decimal("1e4298"), "currency": "KWD"})
    at_the_limit = content_hash(
        {**LISTING, "price": Decimal("1e4296"), "currency": "KWD"}
    )  # 10**4299 fils: 4,300 digits
    assert at_the_limit != content_hash({**LISTING, "price": Decimal("1e4295"), "currency": "KWD"})


def test_content2_refuses_floats_and_missing_identity_fields():
    with pytest.raises(RecordError, match="float"):
        content_hash({**LISTING, "price": 9.9})
    with pytest.raises(RecordError, match="missing identity field 'title'"):
        content_hash({k: v for k, v in LISTING.items() if k != "title"})
    with pytest.raises(RecordError, match="missing identity field 'price'"):
        content_hash({k: v for k, v in LISTING.items() if k != "price"})


@pytest.mark.parametrize("blank", ["", "   ", "\u3000\t\n"], ids=["empty", "spaces", "unicode-whitespace"])
@pytest.mark.parametrize("field", ["title", "price", "currency", "seller_id"])
def test_content2_a_blank_required_field_is_missing(field, blank):
    """An extraction that failed ("" or whitespace only) is a missing field, as if absent, not an empty value."""
    with pytest.raises(RecordError, match=f"^content/2: missing identity field '{field}'$"):
        content_hash({**LISTING, field: blank})
    with pytest.raises(RecordError, match=f"^content/2: missing identity field '{field}'$"):
        content_hash({k: v for k, v in LISTING.items() if k != field})


def test_content2_two_sites_whose_extraction_failed_are_not_one_content():
    # Same price, currency and description, empty title and seller: two listings, never one digest.
    a = {
        "url": "https://a.example/p/1",
        "title": "",
        "price": "10",
        "currency": "EUR",
        "seller_id": " ",
        "description": "Red shoes",
    }
    b = {
        "url": "https://b.example/x/9",
        "title": " ",
        "price": "10",
        "currency": "EUR",
        "seller_id": "",
        "description": "Red shoes",
    }
    digests, errors = compute_hashes(canonical_fields(a), ["content/1", "content/2"])
    assert errors == {"content/2": "content/2: missing identity field 'title'"} and set(digests) == {"content/1"}
    assert content_hash(a, "content/1") != content_hash(b, "content/1")  # content/1 hashes the URL


def test_content2_a_blank_optional_field_keeps_its_digest():
    # Only required fields changed meaning: a blank description hashes as "" (not as absent), as it always has.
    blank = content_hash({**LISTING, "description": "  "})
    assert blank == content_hash({**LISTING, "description": ""})
    assert blank != content_hash({k: v for k, v in LISTING.items() if k != "description"})


def test_content2_currency_case_does_not_matter():
    assert content_hash({**LISTING, "currency": "EUR"}) == content_hash({**LISTING, "currency": " eur "})


def test_version_is_returned_and_unknown_versions_are_refused():
    assert content_hash(LISTING, "content/1")[1] == "content/1"
    assert content_hash(LISTING)[1] == "content/2"
    with pytest.raises(ValueError, match="unknown hash version"):
        hash_rule("content/9")


def test_compute_hashes_reports_failing_versions_instead_of_guessing():
    digests, errors = compute_hashes(canonical_fields({**LISTING, "price": 9.9}), ["content/1", "content/2"])
    assert set(digests) == {"content/1"} and set(errors) == {"content/2"}


# Golden digests: a content/N digest must never change between releases. If one of
# these fails, the rule changed: make it a new version and migrate, do not update the pin.
PINNED = {
    "content/1": "fe3897e9e5bfb28f2a6b60253d86852090dc3e9278b7d6469897bda2b3c804b3",
    "content/2": "e7299785c2939f397f2c69fbdac4f121d63d4615625ebb7a4a0c1ef675bc50ef",
    "content/2 minimal": "571ec65b8396dc235d7ee4a24c77cb0fc16ac7d76ed4f78f78a7c061c478a134",
}


def test_golden_digests_are_stable():
    pins = {
        "content/1": content_hash(SEED_A, "content/1")[0],
        "content/2": content_hash(LISTING, "content/2")[0],
        "content/2 minimal": content_hash({"title": "T", "price": "1", "currency": "USD", "seller_id": 7})[0],
    }
    assert pins == PINNED


def test_content2_canonical_bytes_are_the_documented_json():
    import hashlib

    expected = (
        '{"currency":"EUR","description":"Burr grinder, 40 mm","price_minor":990,'
        '"seller_id":"s-1","title":"Café crème grinder"}'
    ).encode()
    assert HASH_RULES["content/2"].canonical_bytes(canonical_fields(LISTING)) == expected
    assert hashlib.sha256(expected).hexdigest() == PINNED["content/2"]


@pytest.mark.parametrize("version", sorted(HASH_RULES))
def test_a_stored_payload_hashes_like_its_raw_record(version):
    # The rehash job hashes stored payloads; new batches hash raw records. They must agree.
    raw = {**LISTING, "rating": Decimal("4.50"), "stock": 3, "tags": [" a ", "b"], "specs": {"w": Decimal("1.0")}}
    payload = canonical_fields(raw)
    assert content_hash(payload, version) == content_hash(raw, version)
    assert canonical_fields(payload) == payload
