"""Properties of the canonicalisers and of the ladder, with Hypothesis (few examples: the file runs in seconds).

The canonicalisers are checked through both paths the pipeline uses: the
per-record `canonicalise_record` (library callers, the rehash job) and the
chunk-wise `canonicalise_records` the canonical rung runs.
"""

from __future__ import annotations

import json
import string
import tempfile
import unicodedata
from decimal import Decimal, localcontext
from pathlib import Path

from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st
from sqlalchemy import select

from dedup_pipeline import canonical_url
from dedup_pipeline.core.errors import RecordError
from dedup_pipeline.core.fields import VOLATILE_FIELDS, canonical_fields
from dedup_pipeline.core.hashing import compute_hashes
from dedup_pipeline.core.records import canonicalise_record, canonicalise_records, parse_line
from dedup_pipeline.ladder.canonical import canonicalise_batch
from dedup_pipeline.ladder.exact import deduplicate_batch
from dedup_pipeline.ladder.raw import ingest_raw_batch
from dedup_pipeline.ladder.settings import LadderSettings
from dedup_pipeline.landing import BOM, find_batch
from dedup_pipeline.store.schema import record_hashes, record_history
from dedup_pipeline.store.warehouse import Warehouse
from dedup_pipeline_tests.helpers import new_run_id
from dedup_pipeline_tests.reliability.ladder_run import canonical_lines, decisions_by_line, quarantined_lines

VERSIONS = ("content/1", "content/2")
FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
LADDER = settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)

# Text with every kind of character but lone surrogates (the raw rung refuses those before any canonicaliser runs).
TEXT = st.text(st.characters(exclude_categories=("Cs",)), max_size=20)
WHITESPACE = st.text(
    st.sampled_from([" ", "\t", "\n", "\r", "\u00a0", "\u2003", "\u3000", "\x0b", "\x0c"]), min_size=1, max_size=4
)
WORD = st.text(st.characters(exclude_categories=("Cs", "Zs", "Zl", "Zp", "Cc")), min_size=1, max_size=8).filter(
    lambda w: not any(c.isspace() for c in w)
)
NUMBER = st.one_of(
    st.integers(-(10**30), 10**30),
    st.decimals(allow_nan=False, allow_infinity=False, places=None).filter(lambda d: abs(d.adjusted()) < 60),
)
PRICE = st.one_of(NUMBER, NUMBER.map(str), st.sampled_from([" 9.90 ", "call for price", "1e3", "-0.00", "", "12,50"]))
SCALAR = st.one_of(TEXT, NUMBER, st.booleans(), st.none())
VALUE = st.recursive(
    SCALAR,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(st.text(string.ascii_lowercase, min_size=1, max_size=5), inner, max_size=3),
    ),
    max_leaves=6,
)
PATH = st.lists(
    st.text(string.ascii_letters + string.digits + "-_~é", min_size=1, max_size=6), min_size=1, max_size=3
).map(lambda parts: "/" + "/".join(parts))


@st.composite
def records(draw) -> dict:
    """A scraped record: identity fields of any type, extra fields, volatile fields, an http(s) URL."""
    record = {"url": "https://Shop.Example.com" + draw(PATH) + draw(st.sampled_from(["", "?b=2&a=1", "?utm_source=x"]))}
    for name, strategy in (
        ("title", TEXT),
        ("description", TEXT),
        ("price", PRICE),
        ("currency", st.sampled_from(["eur", "EUR", " usd ", "JPY", "kwd"])),
        ("seller_id", TEXT),
    ):
        if draw(st.booleans()) or name == "title":
            record[name] = draw(strategy)
    record.update(
        draw(
            st.dictionaries(
                st.text(string.ascii_lowercase, min_size=1, max_size=6).filter(
                    lambda k: k not in VOLATILE_FIELDS and k not in record
                ),
                VALUE,
                max_size=3,
            )
        )
    )
    for name in draw(st.lists(st.sampled_from(sorted(VOLATILE_FIELDS)), unique=True, max_size=4)):
        record[name] = draw(SCALAR)
    return record


def outcome(record: dict, path: str = "record") -> tuple:
    """(canonical URL, payload, digests, errors) of a record, or the reason it is refused, through the chosen path."""
    try:
        if path == "record":
            result = canonicalise_record(record, 1, VERSIONS, "content/1")
        else:
            (result,) = canonicalise_records([record], [1], VERSIONS, "content/1")
            if isinstance(result, RecordError):
                raise result
    except RecordError as exc:
        return ("refused", str(exc))
    return (
        result.canonical_url,
        json.dumps(result.payload, sort_keys=True, default=str),
        result.hashes,
        result.hash_errors,
    )


def _map_text(value, function):
    if isinstance(value, str):
        return function(value)
    if isinstance(value, list):
        return [_map_text(v, function) for v in value]
    if isinstance(value, dict):
        return {k: _map_text(v, function) for k, v in value.items()}
    return value


@FAST
@given(records(), st.sampled_from(["record", "chunk"]))
def test_canonicalising_twice_gives_the_same_as_once(record, path):
    """Idempotent: the stored payload canonicalises and hashes to itself (the rehash job relies on it)."""
    first = outcome(record, path)
    assume(first[0] != "refused")
    url, payload, hashes, errors = first
    again = outcome(json.loads(payload), path)
    assert again == first
    fields = canonical_fields(record)
    assert canonical_fields(fields) == fields
    assert compute_hashes(canonical_fields(fields), VERSIONS) == compute_hashes(fields, VERSIONS)


@FAST
@given(records(), st.randoms(use_true_random=False), st.sampled_from(["record", "chunk"]))
def test_key_order_does_not_matter(record, rnd, path):
    items = list(record.items())
    rnd.shuffle(items)
    assert outcome(dict(items), path) == outcome(record, path)


@FAST
@given(
    records(), st.dictionaries(st.sampled_from(sorted(VOLATILE_FIELDS)), SCALAR), st.sampled_from(["record", "chunk"])
)
def test_volatile_fields_do_not_matter(record, volatile, path):
    stripped = {k: v for k, v in record.items() if k not in VOLATILE_FIELDS}
    assert outcome({**record, **volatile}, path) == outcome(stripped, path)


@FAST
@given(
    records(),
    st.lists(WORD, min_size=1, max_size=5),
    st.lists(WHITESPACE, min_size=7, max_size=7),
    st.sampled_from(["title", "description", "seller_id", "colour"]),
    st.sampled_from(["record", "chunk"]),
)
def test_whitespace_runs_do_not_matter(record, words, gaps, field, path):
    spaced = gaps[0] + "".join(w + gaps[i + 1] for i, w in enumerate(words))
    assert outcome({**record, field: spaced}, path) == outcome({**record, field: " ".join(words)}, path)


@FAST
@given(records(), st.sampled_from(["NFD", "NFKD"]), st.sampled_from(["record", "chunk"]))
def test_unicode_normal_form_does_not_matter(record, form, path):
    """NFC and NFD spellings of the same text are one content. (NFKD also folds compatibility characters,
    which NFC keeps apart, so it is only compared against the NFC of itself.)"""
    url = record["url"]
    decomposed = _map_text({k: v for k, v in record.items() if k != "url"}, lambda t: unicodedata.normalize(form, t))
    composed = _map_text(decomposed, lambda t: unicodedata.normalize("NFC", t))
    assert outcome({**decomposed, "url": url}, path) == outcome({**composed, "url": url}, path)


@FAST
@given(
    st.decimals(allow_nan=False, allow_infinity=False, places=None).filter(lambda d: abs(d.adjusted()) < 2000),
    st.sampled_from(["price", "weight"]),
)
def test_numbers_are_stored_exactly(number, field):
    """Whatever its digits, a JSON number is stored as text that reads back as the same number (no float, no
    rounding to a context's precision); two different numbers never share a stored text."""
    line = json.dumps({"url": "https://shop.example.com/n", field: "NUMBER"}).replace('"NUMBER"', str(number))
    stored = canonicalise_record(parse_line(line.encode()), 1, VERSIONS, "content/1").payload[field]
    assert Decimal(stored) == number
    with localcontext() as exact:
        exact.prec, exact.Emax, exact.Emin = 10_000, 10_000, -10_000
        neighbour = number + Decimal((0, (1,), number.as_tuple().exponent - 1))  # differs in one more digit
    assert canonical_fields({field: neighbour})[field] != stored


HOSTS = st.sampled_from(
    ["shop.example.com", "B\u00fccher.example", "bu\u0308cher.example", "[2001:DB8::1]", "127.0.0.1"]
)


@FAST
@given(
    st.text(st.characters(exclude_categories=()), max_size=40)
    | st.builds(
        lambda scheme, host, port, path, rest: f"{scheme}://{host}{port}{path}{rest}",
        st.sampled_from(["http", "HTTPS", "javascript", "ftp", "", "h\u00f6ttp"]),
        HOSTS | TEXT,
        st.sampled_from(["", ":80", ":443", ":8080", ":99999", ":8o", ":"]),
        PATH | TEXT,
        TEXT,
    )
)
def test_canonical_url_never_raises_and_is_idempotent(text):
    """Any string at all (lone surrogates, controls, any script) gives a string, which canonicalising leaves as is."""
    once = canonical_url(text)
    assert isinstance(once, str)
    assert canonical_url(once) == once


@FAST
@given(PATH, st.data(), st.sampled_from(["record", "chunk"]))
def test_urls_whose_paths_differ_only_in_case_are_never_merged(path, data, which):
    """Two records whose URLs differ only in the case of the path are two keys and two contents, never one."""
    letters = [i for i, c in enumerate(path) if c.isascii() and c.isalpha()]
    assume(letters)
    flipped = set(data.draw(st.lists(st.sampled_from(letters), min_size=1, unique=True)))
    other = "".join(c.swapcase() if i in flipped else c for i, c in enumerate(path))
    base = {"title": "Same", "price": "1.00", "currency": "EUR", "seller_id": "s"}
    a = outcome({**base, "url": "https://shop.example.com" + path}, which)
    b = outcome({**base, "url": "HTTPS://SHOP.example.COM" + other}, which)
    assert a[0] != b[0] and a[2]["content/1"] != b[2]["content/1"]
    assert canonical_url("https://shop.example.com" + path) != canonical_url("https://shop.example.com" + other)


def _line(value) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, dict):
        return json.dumps(value, default=str, ensure_ascii=value.pop("_ascii", False)).encode("utf-8", "surrogatepass")
    return json.dumps(value).encode()


LINE = st.one_of(
    records(),
    records().map(lambda r: {**r, "url": r["url"].replace("https", "javascript", 1)}),
    records().map(lambda r: {k: v for k, v in r.items() if k != "url"}),
    records().map(lambda r: {**r, "title": "\ud800", "_ascii": True}),
    st.binary(max_size=30).map(lambda b: b.replace(b"\n", b"")),
    st.lists(st.integers(), max_size=3),
    TEXT.map(lambda t: t.replace("\n", " ").encode("utf-8")),
    st.just(b'{"url": "https://shop.example.com/p", "price": 1e999999999}'),
)


@LADDER
@given(st.lists(LINE, min_size=1, max_size=25))
@example(lines=[BOM])  # a file of one byte-order mark and a newline: one blank line, as the mark is read past
@example(lines=[BOM + b'{"url": "https://shop.example.com/p"}', BOM])  # a mark on line 2 is data: quarantined
def test_every_line_is_stored_or_quarantined_never_both_never_neither(lines):
    """Any batch through the raw, canonical and exact rungs (SQLite): each non-blank line is either in quarantine
    or canonicalised with exactly one decision whose content is stored (current row or history)."""
    data = [_line(v) for v in lines]
    with tempfile.TemporaryDirectory() as folder:
        folder = Path(folder)
        (folder / "p.jsonl").write_bytes(b"".join(line + b"\n" for line in data))
        warehouse = Warehouse(f"sqlite:///{folder / 'w.sqlite'}").create_schema()
        try:
            settings_ = LadderSettings(chunk_size=4)
            ingest_raw_batch(warehouse, find_batch(folder, "p"))
            canonicalise_batch(warehouse, "p", settings_)
            deduplicate_batch(warehouse, "p", new_run_id("p"), settings_)
            engine = warehouse.engine
            quarantined, canonical = quarantined_lines(engine, "p"), canonical_lines(engine, "p")
            decisions = decisions_by_line(engine, "p")
            with engine.connect() as conn:
                stored = set(
                    conn.execute(
                        select(record_hashes.c.content_hash).where(record_hashes.c.hash_version == "content/1")
                    ).scalars()
                )
                stored |= set(conn.execute(select(record_history.c.content_hash)).scalars())
                digests = dict(conn.execute(select(*canonical_records_line_digest())).all())
        finally:
            warehouse.dispose()
    # A byte-order mark at the start of the file is read past (docs/canonical.md, Landing files), not a line's data.
    data[0] = data[0].removeprefix(BOM)
    expected = {n for n, line in enumerate(data, 1) if line.rstrip(b"\r").strip()}
    assert set(quarantined) | set(canonical) == expected
    assert not set(quarantined) & set(canonical)
    assert set(decisions) == set(canonical) and all(len(d) == 1 for d in decisions.values())
    assert all(bytes.fromhex(digests[n]) in stored for n in canonical)


def canonical_records_line_digest():
    from dedup_pipeline.store.schema import canonical_records

    return canonical_records.c.line_no, canonical_records.c.hashes["content/1"].as_string()
