"""The column-wise batch path gives exactly what the per-record functions give: payloads, digests, errors."""

from __future__ import annotations

import json
import random
import sys
from decimal import Decimal

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import select

from benchmarks.bench_exact import seed_content_hash  # the seeds' code, as the seeds write it
from dedup_pipeline.core import canonical
from dedup_pipeline.core.canonical import content_hashes, hash_records
from dedup_pipeline.core.errors import RecordError
from dedup_pipeline.core.fields import canonical_fields, normalise_text
from dedup_pipeline.core.hashing import HASH_RULES, compute_hashes, content_hash
from dedup_pipeline.core.records import canonicalise_record, canonicalise_records, parse_line
from dedup_pipeline.ladder.canonical import canonicalise_batch
from dedup_pipeline.ladder.raw import ingest_raw_batch
from dedup_pipeline.ladder.settings import LadderSettings
from dedup_pipeline.landing import find_batch
from dedup_pipeline.store.schema import canonical_records, quarantine
from dedup_pipeline_tests.helpers import listing, write_batch

VERSIONS = tuple(HASH_RULES)
WHITESPACE = [c for c in map(chr, range(0x3001)) if c.isspace()]
# Text that exercises every branch: whitespace of all kinds, NFC compositions (also with
# "<", "=", ">" and Hangul jamo), case mappings that change length, JSON escapes, control
# characters, the separator NUL, DEL, and a lone surrogate.
ALPHABET = st.sampled_from(
    list("aZ09 |-.")
    + WHITESPACE[:12]
    + [
        "\u3000",
        "\u0301",
        "\u0327",
        "\u0338",
        "e",
        "<",
        "=",
        "\u1100",
        "\u1161",
        "\u00df",
        "\u01f0",
        "\ufb00",
        "\u03a3",
        '"',
        "\\",
        "\x01",
        "\x1b",
        "\x00",
        "\x7f",
        "\ud800",
        "\U0001f600",
        "\u200d",
        "\u2019",
        "%",
    ]
)
TEXT = st.text(ALPHABET, max_size=12)
URLS = st.sampled_from(
    [
        "https://shop.example.com/p/1",
        " HTTPS://Shop.Example.com:443/p/1?b=2&utm_source=x&a=1#top ",
        "http://a.example/x/../y?q=%7e&gclid=1",
        "https://caf\u00e9.example/d\u00e9j\u00e0 vu",
        "javascript:alert(1)",
        "ftp://files.example/",
        "",
        "   ",
        "https://a.example/\x00",
        'https://a.example/"q"',
        "not a url",
    ]
)
NUMBER_TEXT = st.sampled_from(
    [
        " 9.90 ",
        "9.9",
        "call for price",
        "1E+3",
        "-0",
        "0.000",
        "12.345",
        "NaN",
        "-Infinity",
        "1e999",
        " -0.50",
        "12345678901234567890123.5",
        "7",
        "990",
    ]
)
SCALARS = {
    "text": TEXT,
    "number_text": NUMBER_TEXT,
    "float": st.floats(allow_nan=True, allow_infinity=True),
    "int": st.integers(-(2**70), 2**70) | st.integers(-5, 5),
    "bool": st.booleans(),
    "none": st.none(),
    "decimal": st.decimals(allow_nan=True, allow_infinity=True, places=None) | st.decimals(-1000, 1000, places=2),
    "url": URLS,
}
NESTED = st.recursive(
    st.one_of(TEXT, st.integers(-9, 9), st.booleans(), st.none(), st.decimals(-10, 10, places=1)),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(["w", "h", "b ", "price"]), inner, max_size=3)
    ),
    max_leaves=6,
)
KINDS = [*SCALARS, "nested"]
FIELDS = [
    "url",
    "title",
    "description",
    "price",
    "price_minor",
    "currency",
    "seller_id",
    "sku",
    "specs",
    "scraped_at",
    "etag",
    "n",
]


def value_of(kind):
    return NESTED if kind == "nested" else SCALARS[kind]


@st.composite
def chunks(draw, max_records=12):
    """Records sharing a few field layouts, most columns of one type (the column paths), some mixed."""
    shapes = draw(st.lists(st.lists(st.sampled_from(FIELDS), unique=True, max_size=9), min_size=1, max_size=3))
    kinds = {(s, k): draw(st.sampled_from(KINDS)) for s, shape in enumerate(shapes) for k in shape}
    records = []
    for _ in range(draw(st.integers(1, max_records))):
        s = draw(st.integers(0, len(shapes) - 1))
        record = {}
        for key in shapes[s]:
            kind = kinds[(s, key)] if draw(st.integers(0, 7)) else draw(st.sampled_from(KINDS))
            record[key] = draw(value_of(kind))
        records.append(record)
    return records


def per_record(records, versions=VERSIONS):
    """What the per-record functions give for each record."""
    out = []
    for record in records:
        try:
            payload = canonical_fields(record)
        except RecordError as exc:
            out.append(("canonical_fields raised", str(exc)))
            continue
        digests, errors = compute_hashes(payload, versions)
        out.append((list(payload.items()), digests, errors))
    return out


def batched(records, versions=VERSIONS):
    """The same view of `hash_records`."""
    hashed = hash_records(records, versions)
    out = []
    for i in range(len(records)):
        if hashed.failures[i] is not None:
            out.append(("canonical_fields raised", str(hashed.failures[i])))
            continue
        digests = {v: hashed.digests[v][i] for v in versions if hashed.digests[v][i] is not None}
        errors = {v: hashed.errors[v][i] for v in versions if hashed.errors[v][i] is not None}
        out.append((list(hashed.payloads[i].items()), digests, errors))
    return out


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(chunks())
def test_hash_records_equals_the_per_record_functions(records):
    assert batched(records) == per_record(records)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(chunks(), st.sampled_from([("content/1",), ("content/2",), ("content/2", "content/1")]))
def test_each_version_alone_and_without_payloads(records, versions):
    hashed = hash_records(records, versions, payloads=False)
    expected = per_record(records, versions)
    for i, want in enumerate(expected):
        assert hashed.payloads[i] is None
        if want[0] == "canonical_fields raised":
            assert str(hashed.failures[i]) == want[1]
            continue
        assert {v: d for v in versions if (d := hashed.digests[v][i]) is not None} == want[1]
        assert {v: e for v in versions if (e := hashed.errors[v][i]) is not None} == want[2]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(chunks(), st.sampled_from([("canonical_url",), ("sku",), ("seller_id", "sku")]))
def test_canonicalise_records_equals_canonicalise_record(records, key_fields):
    for record in records:
        record.setdefault("url", "https://shop.example.com/p/1?utm_source=x")
    line_nos = [10 + 3 * i for i in range(len(records))]
    expected = []
    for record, line_no in zip(records, line_nos):
        try:
            expected.append(canonicalise_record(record, line_no, VERSIONS, "content/1", key_fields))
        except RecordError as exc:
            expected.append(("error", str(exc)))
    got = canonicalise_records(records, line_nos, VERSIONS, "content/1", key_fields)
    assert [("error", str(r)) if isinstance(r, RecordError) else r for r in got] == expected
    for result in got:
        if not isinstance(result, RecordError):
            assert list(result.payload) == list(canonical_fields({**records[line_nos.index(result.line_no)]}))


def crawl(n: int, seed: int = 7) -> list[dict]:
    """Listings as a crawler writes them, half of them re-crawls, with the variety of a real crawl."""
    rng = random.Random(seed)
    records = []
    for i in range(n // 2):
        overrides = rng.choice(
            [
                {},
                {"price": round(rng.uniform(1, 500), 2)},
                {"price": Decimal(f"{rng.randint(1, 9999)}.{rng.randint(0, 99)}")},
                {"title": f"  Caf\u00e9\u0301 \t kettle {i} "},
                {"description": None},
                {"currency": "jpy", "price": str(rng.randint(1, 9999))},
                {"price_minor": rng.randint(0, 10**6)},
                {"tags": ["a", " b "], "specs": {"w": Decimal("1.50")}},
                {"url": f"https://Shop.example.com/p/{i}?utm_source=feed&ref=home#frag"},
                {"seller_id": rng.randint(1, 99)},
                {"title": 'quoted "kettle" \\ back'},
                {"price": "call for price"},
                {"price": float("nan")},
            ]
        )
        records.append(listing(i, **overrides))
    records += [
        {**rng.choice(records), "scraped_at": "2026-12-01T00:00:00Z", "etag": "x"} for _ in range(n - len(records))
    ]
    rng.shuffle(records)
    return records


def test_a_crawl_larger_than_a_block_hashes_like_the_per_record_path():
    records = crawl(3 * canonical.BLOCK + 17)
    assert batched(records) == per_record(records)
    for version in VERSIONS:
        hashable = [r for r in records if not per_record([r], (version,))[0][2]]
        assert content_hashes(hashable, version) == [content_hash(r, version)[0] for r in hashable]


def test_parsed_lines_canonicalise_like_the_per_record_path():
    records = []
    for record in crawl(300, seed=11):
        try:
            records.append(parse_line(json.dumps(record, default=str).encode()))
        except RecordError:
            pass  # NaN: the raw rung's business
    got = canonicalise_records(records, list(range(1, len(records) + 1)), VERSIONS, "content/2")
    for line_no, (record, result) in enumerate(zip(records, got), start=1):
        try:
            assert result == canonicalise_record(record, line_no, VERSIONS, "content/2")
        except RecordError as exc:
            assert isinstance(result, RecordError) and str(result) == str(exc)


@pytest.mark.parametrize("field", ["title", "currency", "seller_id", "price"])
def test_a_blank_required_field_is_missing_in_the_columns_too(field):
    """The column path leaves a blank required field to the rule: its error, never a digest of "" ."""
    records = [listing(i) for i in range(20)]
    for i, blank in ((3, ""), (7, "   "), (12, "\u3000\t")):
        records[i] = listing(i, **{field: blank})
    last = listing(20)
    del last[field]
    records.append({**last, field: ""})  # the field last: a layout of its own, blank in its only row
    got = batched(records)
    assert got == per_record(records)
    missing = [
        i
        for i, (_, _, errors) in enumerate(got)
        if errors.get("content/2") == f"content/2: missing identity field '{field}'"
    ]
    assert missing == [3, 7, 12, 20]
    assert all("content/1" in digests for _, digests, _ in got)


@pytest.mark.parametrize(
    "prices",
    [
        [
            Decimal("-0"),
            Decimal("-0.00"),
            Decimal("0E-7"),
            Decimal("-12.5"),
            Decimal("1.000000000000000000000000000049999"),
            Decimal("1E+3"),
            Decimal("0.00005"),
            Decimal("-0.00004"),
            Decimal("12345678901234567890.123"),
            Decimal("1E+5000"),
            Decimal("-1E-5000"),
            Decimal("NaN"),
            Decimal("-Infinity"),
            Decimal("sNaN"),
        ],
        ["-12.5", " -0.50 ", "-0", "1E+3", "12.345", "-7", "0.001", "123456789012345678901", "-99.99", "1E+5000"],
        [-5, 0, 7, 10**17, -(10**18), 2**64, 10**30 + 1],
    ],
    ids=["decimals", "numeric-text", "ints"],
)
@pytest.mark.parametrize("currency", ["EUR", "jpy", "KWD"])
def test_price_columns_with_signs_zeros_and_long_digits(prices, currency):
    records = [listing(i, price=p, currency=currency) for i, p in enumerate(prices)]
    records += [listing(100 + i, price_minor=p, price=None, currency=currency) for i, p in enumerate(prices)]
    records += [listing(200 + i, rating=p) for i, p in enumerate(prices)]  # a field that is not a price
    assert batched(records) == per_record(records)


def test_content1_batch_digests_are_the_seeds_digests():
    rng = random.Random(5)
    records = [listing(i, price=round(rng.uniform(1, 400), 2), title=f"Caf\u00e9  kettle {i} ") for i in range(600)]
    assert content_hashes(records, "content/1") == [seed_content_hash(r) for r in records]


def test_content_hashes_raises_what_content_hash_raises():
    records = [listing(1), listing(2, price=9.9), listing(3)]
    with pytest.raises(RecordError, match="float") as info:
        content_hashes(records, "content/2")
    with pytest.raises(RecordError) as single:
        content_hash(records[1], "content/2")
    assert str(info.value) == str(single.value) and "record 1 of the batch" in info.value.__notes__
    with pytest.raises(ValueError, match="unknown hash version"):
        content_hashes(records, "content/9")
    assert content_hashes([], "content/1") == []


def test_a_rule_without_a_column_version_is_applied_record_by_record(monkeypatch):
    from dedup_pipeline.core import hashing

    def keys_only(fields):
        if "title" not in fields:
            raise RecordError("test/9: no title")
        return json.dumps(sorted(fields)).encode()

    monkeypatch.setitem(hashing.HASH_RULES, "test/9", hashing.HashRule("test/9", "field names only", keys_only))
    records = crawl(300) + [{"url": "https://a.example/"}]
    versions = ("test/9", *VERSIONS)
    assert batched(records, versions) == per_record(records, versions)


def test_errors_other_than_record_errors_propagate_as_on_the_per_record_path():
    record = {"title": "t", 1: "one"}  # sort_keys cannot order int and str keys
    with pytest.raises(TypeError):
        content_hash(record, "content/1")
    with pytest.raises(TypeError):
        hash_records([listing(1), record], ("content/1",))


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.text(
            st.sampled_from(
                list("ab |") + WHITESPACE + ["\u0301", "\u1100", "\u1161", "\x00", "\x01", "\u00e9", "\u200d", "\u2019"]
            ),
            max_size=8,
        ),
        min_size=1,
        max_size=6,
    ),
    st.booleans(),
)
def test_a_joined_column_normalises_like_each_value(values, upper):
    done = canonical._normalised(values, upper)
    if any("\x00" in v for v in values):
        assert done is None  # the separator itself: left to the per-value path
    else:
        assert done[0] == [normalise_text(v).upper() if upper else normalise_text(v) for v in values]


def test_no_whitespace_character_but_the_space_is_printable():
    # The column code leaves printable NFC text without space runs as it is: that is only right while this holds.
    everything = map(chr, range(sys.maxunicode + 1))
    assert [c for c in everything if c.isspace() and c.isprintable()] == [" "]


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.text(st.sampled_from(list('a "\\') + ["\x01", "\x1f", "\x7f", "\u00e9", "\u200d", "\ud800"])), max_size=6
    )
)
def test_json_strings_of_a_column_are_what_json_writes(values):
    done = canonical._json_strings(values, None)
    if any("\ud800" in v for v in values):
        assert done is None  # not UTF-8: the rule reports it
    else:
        quoted, texts = done
        assert [f'"{t}"' if quoted else t for t in texts] == [json.dumps(v, ensure_ascii=False) for v in values]


def test_every_whitespace_character_collapses_as_str_split_does():
    values = [f"a{c}{c}b{c}" for c in WHITESPACE] + [f"{c}x" for c in WHITESPACE]
    assert canonical._normalised(values)[0] == [normalise_text(v) for v in values]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.floats(allow_nan=False, allow_infinity=False), min_size=1, max_size=20))
def test_floats_format_column_wise_as_format_does(values):
    assert canonical._formatted("%.4f", values) == [format(v, ".4f") for v in values]


@pytest.mark.parametrize("chunk_size", [1, 3, 2000])
def test_the_canonical_rung_stores_what_the_per_record_path_gives(warehouse, tmp_path, chunk_size):
    records = crawl(40, seed=3)
    lines: list = [json.dumps(r, default=str) for r in records]
    lines[4] = json.dumps({"title": "no url"})
    lines[9] = json.dumps({"url": "javascript:alert(1)", "title": "x"})
    lines[13] = json.dumps({"url": "https://a.example/", "price": "9.9", "title": "t"})  # content/2 ok, no seller
    lines[17] = '{"url": "https://a.example/cut'  # the raw rung quarantines it
    write_batch(tmp_path / "landing", "b1", lines, landed=1e9)
    ingest_raw_batch(warehouse, find_batch(tmp_path / "landing", "b1"))
    settings_ = LadderSettings(chunk_size=chunk_size)
    report = canonicalise_batch(warehouse, "b1", settings_)

    expected_rows, expected_bad, parsed = [], [], 0
    for line_no, line in enumerate(lines, start=1):
        try:
            record = parse_line(line.encode())
        except RecordError:
            continue
        parsed += 1
        try:
            c = canonicalise_record(record, line_no, settings_.hash_versions, "content/1", settings_.natural_key)
        except RecordError as exc:
            expected_bad.append((line_no, str(exc)))
            continue
        expected_rows.append((c.line_no, c.natural_key, c.canonical_url, c.hashes, c.hash_errors, c.payload))
    with warehouse.engine.connect() as conn:
        rows = [
            tuple(r)
            for r in conn.execute(
                select(
                    canonical_records.c.line_no,
                    canonical_records.c.natural_key,
                    canonical_records.c.canonical_url,
                    canonical_records.c.hashes,
                    canonical_records.c.hash_errors,
                    canonical_records.c.payload,
                )
                .where(canonical_records.c.batch_id == "b1")
                .order_by(canonical_records.c.line_no)
            )
        ]
        bad = [
            tuple(r)
            for r in conn.execute(
                select(quarantine.c.line_no, quarantine.c.reason)
                .where(quarantine.c.batch_id == "b1", quarantine.c.rung == "canonical")
                .order_by(quarantine.c.line_no)
            )
        ]
    assert rows == expected_rows and bad == expected_bad
    assert (report.records_in, report.canonical, report.quarantined) == (parsed, len(expected_rows), len(expected_bad))
    assert len(expected_rows) > 25 and len(expected_bad) >= 2
