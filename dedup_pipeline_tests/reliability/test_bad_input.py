"""Bad input through the real ladder on SQLite and PostgreSQL: every line stored exactly or quarantined precisely.

The corpus (`corpus.py`) is generated, not copied: malformed JSON, invalid
UTF-8, NUL bytes, lone surrogates, Unicode forms, right-to-left text, emoji,
megabyte fields, wrong types, missing identity fields, URLs that do not parse,
text that looks like SQL or HTML. Files that are truncated, corrupt or empty
have their own tests.
"""

from __future__ import annotations

import gzip
import json
from decimal import Decimal

import pytest
from sqlalchemy import update

from dedup_pipeline import content_hash
from dedup_pipeline.core.errors import RecordError
from dedup_pipeline.core.records import canonicalise_record
from dedup_pipeline.ladder.exact import deduplicate_records
from dedup_pipeline.ladder.settings import LadderSettings
from dedup_pipeline.quality import expectations, frames
from dedup_pipeline.store.schema import crawl_batches
from dedup_pipeline.store.schema import settings as settings_table
from dedup_pipeline.store.warehouse import ACTIVE_HASH_VERSION, active_hash_version, utcnow
from dedup_pipeline_tests.helpers import listing, write_batch
from dedup_pipeline_tests.reliability import corpus
from dedup_pipeline_tests.reliability.ladder_run import (
    assert_one_row_per_key_and_content,
    canonical_lines,
    count,
    decisions_by_line,
    hash_errors,
    quarantined_lines,
    run_ladder,
    set_active_version,
    stored_payloads,
)


def _check_fates(engine, batch: str, cases: dict[int, corpus.Case]) -> None:
    quarantined = quarantined_lines(engine, batch)
    canonical = canonical_lines(engine, batch)
    decisions = decisions_by_line(engine, batch)
    stored = stored_payloads(engine)
    errors = hash_errors(engine)
    assert set(quarantined) | set(canonical) == set(cases), "a line was neither stored nor quarantined"
    assert not set(quarantined) & set(canonical), "a line was both stored and quarantined"
    for line, case in cases.items():
        fate = case.fate
        if isinstance(fate, corpus.Quarantined):
            kept = case.line.rstrip(b"\r") if fate.kept is None else fate.kept
            assert quarantined.get(line) == (fate.rung, fate.reason, kept), case.name
            assert line not in decisions, case.name
            continue
        assert line in canonical, f"{case.name}: quarantined as {quarantined.get(line)}"
        assert decisions[line] == [fate.decision], case.name
        if fate.payload is not None:
            key = fate.payload["url"]
            assert canonical[line] == key, case.name
            assert stored[key] == fate.payload, case.name
            assert {v: e for (k, v), e in errors.items() if k == key} == fate.hash_errors, case.name


@pytest.mark.parametrize("gz", [False, True], ids=["jsonl", "jsonl.gz"])
def test_nasty_corpus_every_line_stored_exactly_or_quarantined_precisely(warehouse, tmp_path, gz):
    """Breaks: a batch where each bad line (every kind in `corpus.bad_cases`) sits between good ones.

    Must hold: the whole ladder (raw, canonical, exact, near) runs without an
    error; each good line is stored with exactly the payload written in the
    corpus (and the hash errors of versions that cannot hash it); each bad line
    is in quarantine with its rung, exact reason, batch, line number and raw
    bytes; no line is both or neither; re-running changes nothing.
    """
    cases = corpus.nasty_cases()
    folder = tmp_path / "landing"
    folder.mkdir()
    data = corpus.batch_bytes(cases)
    (folder / ("nasty.jsonl.gz" if gz else "nasty.jsonl")).write_bytes(gzip.compress(data) if gz else data)
    by_line = corpus.line_numbers(cases)

    reports = run_ladder(warehouse, folder, "nasty")

    good = [c for c in cases if isinstance(c.fate, corpus.Stored)]
    bad = [c for c in cases if isinstance(c.fate, corpus.Quarantined)]
    raw_bad = [c for c in bad if c.fate.rung == "raw"]
    assert (reports.raw.lines, reports.raw.quarantined) == (len(cases), len(raw_bad))
    assert (reports.canonical.canonical, reports.canonical.quarantined) == (len(good), len(bad) - len(raw_bad))
    assert sum(reports.exact.decisions.values()) == len(good)
    _check_fates(warehouse.engine, "nasty", by_line)
    assert_one_row_per_key_and_content(warehouse.engine)
    with warehouse.engine.connect() as conn:  # what the canonical rung kept passes its blocking suite
        frame = frames.canonical_frame(conn, "nasty", active_hash_version(conn))
        suite = expectations.canonical_suite(frames.expected_canonical_rows(conn, "nasty"))
    report = expectations.validate(frame, "canonical_records", suite)
    assert report.success, report.markdown()
    assert reports.near.sketched == len([c for c in good if c.fate.decision == "new"])

    before = (stored_payloads(warehouse.engine), quarantined_lines(warehouse.engine, "nasty"))
    again = run_ladder(warehouse, folder, "nasty", run_id="again")
    assert again.exact.survivors == 0 and again.near.sketched == 0
    assert (stored_payloads(warehouse.engine), quarantined_lines(warehouse.engine, "nasty")) == before


def test_a_truncated_gzip_keeps_every_line_before_the_damage(warehouse, tmp_path):
    """Breaks: a gzipped batch cut off in the middle of its stream (a crawler or a copy died).

    Must hold: every complete line before the cut is stored, the incomplete
    tail is one quarantine row (reason names the damaged stream, line number
    after the last good line, the partial bytes kept), and the run succeeds.
    """
    folder = tmp_path / "landing"
    lines = [json.dumps(listing(n)).encode() for n in range(400)]
    whole = gzip.compress(b"\n".join(lines) + b"\n")
    folder.mkdir()
    (folder / "cut.jsonl.gz").write_bytes(whole[: len(whole) // 2])
    reports = run_ladder(warehouse, folder, "cut")

    quarantined = quarantined_lines(warehouse.engine, "cut")
    assert len(quarantined) == 1
    ((line, (rung, reason, tail)),) = quarantined.items()
    assert rung == "raw"
    assert reason == (
        "batch file cut short or damaged at its end: compressed stream damaged: "
        "Compressed file ended before the end-of-stream marker was reached"
    )
    good = line - 1
    assert 0 < good < 400 and reports.raw.lines == good + 1 and reports.canonical.canonical == good
    assert lines[good].startswith(tail) and tail != lines[good]  # the partial line, as far as it got
    assert reports.exact.decisions["new"] == good
    keys = set(stored_payloads(warehouse.engine))
    assert keys == {f"https://shop.example.com/p/{n}" for n in range(good)}


@pytest.mark.parametrize("damage", ["header", "not-gzip"])
def test_a_gzip_batch_nobody_can_read_is_refused_whole(warehouse, tmp_path, damage):
    """Breaks: a `.jsonl.gz` batch with a damaged gzip header, or whose bytes are not gzip at all.

    Must hold: not one line can be read, so the raw rung refuses the file with the reason (as for a corrupt
    CRC), and registers, quarantines and stores nothing: never a green batch of "in 1, quarantined 1".
    """
    from dedup_pipeline.ladder.raw import ingest_raw_batch
    from dedup_pipeline.landing import BatchFileError, find_batch

    folder = tmp_path / "landing"
    folder.mkdir()
    lines = b"".join(json.dumps(listing(n)).encode() + b"\n" for n in range(150))
    data = bytearray(gzip.compress(lines, mtime=0)) if damage == "header" else bytearray(lines)
    if damage == "header":
        data[0:2] = b"\x00\x00"  # the gzip magic number
    (folder / "unreadable.jsonl.gz").write_bytes(bytes(data))
    with pytest.raises(BatchFileError, match=r"cannot be read \(Not a gzipped file.*not one line could be"):
        ingest_raw_batch(warehouse, find_batch(folder, "unreadable"))
    assert count(warehouse.engine, crawl_batches) == 0 and not quarantined_lines(warehouse.engine, "unreadable")


def test_an_empty_gzip_file_is_a_failed_upload_not_an_empty_batch(warehouse, tmp_path):
    """Breaks: a 0-byte `.jsonl.gz` (an upload that failed before its first byte) was a green batch of 0 lines.

    Must hold: gzip writes a header even for no lines, so the file is refused with what to do, and nothing is
    registered; a gzip of no lines is still an empty batch.
    """
    from dedup_pipeline.ladder.raw import ingest_raw_batch
    from dedup_pipeline.landing import BatchFileError, find_batch

    folder = tmp_path / "landing"
    folder.mkdir()
    (folder / "nothing.jsonl.gz").write_bytes(b"")
    with pytest.raises(BatchFileError, match=r"is empty \(0 bytes\).*the upload failed; fetch it again"):
        ingest_raw_batch(warehouse, find_batch(folder, "nothing"))
    assert count(warehouse.engine, crawl_batches) == 0
    (folder / "nothing.jsonl.gz").write_bytes(gzip.compress(b""))
    assert ingest_raw_batch(warehouse, find_batch(folder, "nothing")).lines == 0


@pytest.mark.parametrize("encoding, suffix", [("utf-16", ".jsonl"), ("utf-16-be", ".jsonl.gz")])
def test_a_utf16_batch_is_refused_whole_with_what_to_do(warehouse, tmp_path, encoding, suffix):
    """Breaks: a batch saved as UTF-16 (a Windows export) quarantined every line as "invalid UTF-8" or malformed
    JSON, reasons that never named the encoding, and a mostly quarantined batch then blocked its run."""
    from dedup_pipeline.ladder.raw import ingest_raw_batch
    from dedup_pipeline.landing import BatchFileError, find_batch

    folder = tmp_path / "landing"
    folder.mkdir()
    text = "".join(json.dumps(listing(n)) + "\n" for n in range(5))
    data = ("\ufeff" + text).encode(encoding) if encoding == "utf-16-be" else text.encode(encoding)  # BOM first
    (folder / f"wide{suffix}").write_bytes(gzip.compress(data) if suffix.endswith(".gz") else data)
    with pytest.raises(BatchFileError, match=r"is UTF-16 \(or UTF-32\) text.*re-encode it"):
        ingest_raw_batch(warehouse, find_batch(folder, "wide"))
    assert count(warehouse.engine, crawl_batches) == 0 and not quarantined_lines(warehouse.engine, "wide")


@pytest.mark.parametrize("level", [0, 6], ids=["stored", "deflated"])
def test_a_corrupt_gzip_is_refused_whole(warehouse, tmp_path, level):
    """Breaks: one bit flipped inside a gzipped batch's compressed data (bad disk, bad copy).

    Must hold: the damage is only detected at the CRC check after the lines
    were decompressed, and any of them may carry the flipped bit, so the raw
    rung refuses the whole file with a clear error and registers nothing,
    quarantines nothing, stores nothing (whereas a merely truncated file keeps
    its exact prefix, see above).
    """
    from dedup_pipeline.ladder.raw import ingest_raw_batch
    from dedup_pipeline.landing import BatchFileError, find_batch

    folder = tmp_path / "landing"
    folder.mkdir()
    data = bytearray(
        gzip.compress(b"".join(json.dumps(listing(n)).encode() + b"\n" for n in range(300)), compresslevel=level)
    )
    data[len(data) // 2] ^= 0x10
    (folder / "flipped.jsonl.gz").write_bytes(bytes(data))
    with pytest.raises(
        BatchFileError, match=r"is corrupt \((CRC check failed|Error -3).*none of its lines can be trusted"
    ):
        ingest_raw_batch(warehouse, find_batch(folder, "flipped"))
    assert count(warehouse.engine, crawl_batches) == 0 and not quarantined_lines(warehouse.engine, "flipped")


@pytest.mark.parametrize(
    "name, data",
    [
        ("empty.jsonl", b""),
        ("blank.jsonl", b"\n  \n\r\n\t\n"),
        ("empty.jsonl.gz", gzip.compress(b"", mtime=0)),
    ],
    ids=["empty", "blank-lines", "empty-gzip-stream"],  # a 0-byte .gz is no gzip: a failed upload, refused
)
def test_empty_files_are_empty_batches(warehouse, tmp_path, name, data):
    """Breaks: a batch file with no bytes, only blank lines, or an empty gzip stream.

    Must hold: every rung succeeds with zero records; the batch is registered
    (so the sensor does not ask for it again) and nothing is quarantined or stored.
    """
    folder = tmp_path / "landing"
    folder.mkdir()
    (folder / name).write_bytes(data)
    key = name.split(".")[0]
    reports = run_ladder(warehouse, folder, key)
    assert (reports.raw.lines, reports.raw.quarantined, reports.canonical.records_in) == (0, 0, 0)
    assert sum(reports.exact.decisions.values()) == 0 and reports.near.sketched == 0
    assert count(warehouse.engine, crawl_batches) == 1
    assert not quarantined_lines(warehouse.engine, key) and not stored_payloads(warehouse.engine)


def test_content2_active_quarantines_what_it_cannot_hash(warehouse, tmp_path):
    """Breaks: lines `content/2` cannot hash (missing or mistyped identity fields) while it is the active version.

    Must hold: those lines are quarantined at the canonical rung with the
    rule's exact reason; their good neighbours (a JSON number price included:
    it is read as a Decimal, never a float) are stored exactly.
    """
    with warehouse.engine.begin() as conn:
        conn.execute(
            update(settings_table)
            .where(settings_table.c.name == ACTIVE_HASH_VERSION)
            .values(value="content/2", updated_at=utcnow())
        )
    folder = tmp_path / "landing"
    number_price = (
        b'{"url": "https://shop.example.com/v2/1", "title": "T", "price": 9.90, "currency": "eur", "seller_id": "s"}'
    )
    write_batch(
        folder,
        "v2",
        [
            number_price,
            listing(2, title=None),
            listing(3, price=True),
            listing(4, title=["a", "b"]),
            listing(5, price="call for price"),
            listing(6, currency=None),
            listing(7),
        ],
    )
    reports = run_ladder(warehouse, folder, "v2")
    assert quarantined_lines(warehouse.engine, "v2") == {
        2: ("canonical", "content/2: missing identity field 'title'", json.dumps(listing(2, title=None)).encode()),
        3: ("canonical", "price: boolean is not a number", json.dumps(listing(3, price=True)).encode()),
        4: (
            "canonical",
            "content/2: field 'title' must be text, got list",
            json.dumps(listing(4, title=["a", "b"])).encode(),
        ),
        5: ("canonical", "price: not a decimal number", json.dumps(listing(5, price="call for price")).encode()),
        6: (
            "canonical",
            "content/2: missing identity field 'currency'",
            json.dumps(listing(6, currency=None)).encode(),
        ),
    }
    assert reports.exact.hash_version == "content/2" and reports.exact.decisions["new"] == 2
    stored = stored_payloads(warehouse.engine)
    assert stored["https://shop.example.com/v2/1"] == {
        "url": "https://shop.example.com/v2/1",
        "title": "T",
        "price": "9.9",
        "currency": "EUR",
        "seller_id": "s",
    }
    assert stored["https://shop.example.com/p/7"]["price"] == "17.9"


def test_floats_from_library_callers(warehouse):
    """Breaks: a library caller hands Python floats (never produced from JSON) to the hash rules and the exact rung.

    Must hold: `content_hash(..., "content/2")` and canonicalising under an
    active `content/2` refuse a float price with a precise reason, whereas
    the same price as a Decimal or decimal string hashes; under an active
    `content/1` the float is hashed in the seeds' fixed `.4f` form, its
    `content/2` failure is kept as an error on the stored row (never a
    made-up digest), and the in-memory exact rung stores it.
    """
    record = {
        "url": "https://shop.example.com/f/1",
        "title": "Kettle",
        "price": 9.9,
        "currency": "EUR",
        "seller_id": "s1",
    }
    with pytest.raises(ValueError, match=r"^price: float is not hashable reproducibly"):
        content_hash(record, "content/2")
    assert content_hash({**record, "price": Decimal("9.90")}, "content/2") == content_hash(
        {**record, "price": "9.9"}, "content/2"
    )
    with pytest.raises(RecordError, match=r"^price: float is not hashable reproducibly"):
        canonicalise_record(record, 1, ("content/1", "content/2"), "content/2")
    assert content_hash(record, "content/1") == content_hash({**record, "price": 9.90000}, "content/1")

    canonical = canonicalise_record(record, 1, ("content/1", "content/2"), "content/1")
    assert canonical.hash_errors == {
        "content/2": "price: float is not hashable reproducibly; use a decimal string or minor units"
    }
    report = deduplicate_records(
        warehouse, "library", "run", [[canonical]], LadderSettings(), None, utcnow(), "content/1"
    )
    assert report.decisions == {"new": 1}
    assert stored_payloads(warehouse.engine)["https://shop.example.com/f/1"]["price"] == 9.9
    assert hash_errors(warehouse.engine) == {
        ("https://shop.example.com/f/1", "content/2"): canonical.hash_errors["content/2"]
    }


@pytest.mark.parametrize("active", ["content/1", "content/2"])
def test_two_sites_whose_extraction_failed_are_two_listings(warehouse, tmp_path, active):
    """Breaks: two sites' listings whose extraction failed (empty title and seller), price and description alike.

    Must hold: a blank required field is missing for `content/2`, so the two
    never share its digest (which collapsed the second into an exact
    duplicate of the first). While `content/2` is active, both lines are
    quarantined with its reason; under `content/1`, both are stored (their
    URLs differ) and keep that reason as their `content/2` error.
    """
    set_active_version(warehouse, active)
    folder = tmp_path / "landing"
    lines = [
        {
            "url": "https://a.example/p/1",
            "title": "",
            "price": "10",
            "currency": "EUR",
            "seller_id": " ",
            "description": "Red shoes",
        },
        {
            "url": "https://b.example/x/9",
            "title": " ",
            "price": "10",
            "currency": "EUR",
            "seller_id": "",
            "description": "Red shoes",
        },
    ]
    write_batch(folder, "blank", lines)
    reports = run_ladder(warehouse, folder, "blank")
    reason = "content/2: missing identity field 'title'"
    if active == "content/2":
        assert quarantined_lines(warehouse.engine, "blank") == {
            n: ("canonical", reason, json.dumps(line).encode()) for n, line in enumerate(lines, start=1)
        }
        assert reports.exact.decisions == {} and not stored_payloads(warehouse.engine)
    else:
        assert reports.exact.decisions == {"new": 2}
        assert hash_errors(warehouse.engine) == {
            ("https://a.example/p/1", "content/2"): reason,
            ("https://b.example/x/9", "content/2"): reason,
        }
