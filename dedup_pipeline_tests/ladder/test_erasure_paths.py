"""After an erasure, no way of running the ladder again brings the subject back (real PostgreSQL).

Re-materialising an old partition, replaying a staged batch, a backfill of
every partition, a rehash migration to a new hash version, and an erasure
racing a concurrent ingestion.
"""

from __future__ import annotations

import json
import secrets
import threading
import time

import pytest
from sqlalchemy import func, select

from dedup_pipeline.core.erasure import Subject
from dedup_pipeline.core.near import NearDupParams
from dedup_pipeline.environment import TOMBSTONE_KEY_ENV
from dedup_pipeline.ladder.canonical import canonicalise_batch
from dedup_pipeline.ladder.erasure import erase_subject
from dedup_pipeline.ladder.exact import deduplicate_batch
from dedup_pipeline.ladder.near import cluster_batch
from dedup_pipeline.ladder.raw import ingest_raw_batch
from dedup_pipeline.ladder.rehash import backfill, compare_versions, switch_hash_version
from dedup_pipeline.ladder.settings import LadderSettings, NearSettings
from dedup_pipeline.landing import find_batch
from dedup_pipeline.store.schema import (
    canonical_records,
    dedup_decisions,
    near_index,
    record_history,
    records,
    rehash_comparisons,
)
from dedup_pipeline_tests.helpers import listing, new_run_id, snapshot, write_batch

#: The paths are tested on the real PostgreSQL; the race runs on SQLite too.
on_postgresql = pytest.mark.parametrize("warehouse_url", ["postgresql"], indirect=True)

DAY = 86400.0
T0 = 1_700_000_000
SETTINGS = LadderSettings(chunk_size=5)
SUBJECT = Subject.parse("field", "s-X", field="seller_id")


@pytest.fixture(autouse=True)
def tombstone_key(monkeypatch):
    monkeypatch.setenv(TOMBSTONE_KEY_ENV, secrets.token_hex(32))


def run_ladder(warehouse, folder, key, settings=SETTINGS, rungs=("raw", "canonical", "exact", "near")):
    exact = None
    if "raw" in rungs:
        ingest_raw_batch(warehouse, find_batch(folder, key))
    if "canonical" in rungs:
        canonicalise_batch(warehouse, key, settings)
    if "exact" in rungs:
        exact = deduplicate_batch(warehouse, key, new_run_id(key), settings)
    if "near" in rungs:
        cluster_batch(warehouse, key, NearSettings(params=NearDupParams(threshold=0.5)))
    return exact


def subject_rows(warehouse) -> dict:
    """Every place the subject's seller id could be, counted."""
    with warehouse.engine.connect() as conn:
        seller = lambda table: table.c.payload["seller_id"].as_string() == "s-X"  # noqa: E731
        return {
            "records": conn.execute(select(func.count()).select_from(records).where(seller(records))).scalar_one(),
            "history": conn.execute(
                select(func.count()).select_from(record_history).where(seller(record_history))
            ).scalar_one(),
            "staged": conn.execute(
                select(func.count()).select_from(canonical_records).where(seller(canonical_records))
            ).scalar_one(),
            "sketches": conn.execute(
                select(func.count()).select_from(near_index.join(records)).where(seller(records))
            ).scalar_one(),
        }


NOTHING = {"records": 0, "history": 0, "staged": 0, "sketches": 0}


@pytest.fixture
def three_days(tmp_path):
    folder = tmp_path / "landing"
    write_batch(
        folder,
        "day1",
        [listing(n) for n in range(10)] + [listing(20, seller_id="s-X"), listing(21, seller_id="s-X")],
        landed=T0,
    )
    write_batch(folder, "day2", [listing(20, seller_id="s-X", price="5.00"), listing(3, crawl_id="b")], landed=T0 + DAY)
    write_batch(
        folder,
        "day3",
        [
            listing(
                21,
                seller_id="s-X",
                url="https://SHOP.example.com/p/21?utm_source=feed",
                crawl_id="c",
                proxy_ip="10.9.9.9",
            ),
            listing(30),
        ],
        landed=T0 + 2 * DAY,
    )
    return folder


@on_postgresql
def test_rematerialising_an_old_partition_after_erasure(warehouse, three_days):
    for key in ("day1", "day2"):
        run_ladder(warehouse, three_days, key)
    assert subject_rows(warehouse)["records"] == 2 and subject_rows(warehouse)["history"] == 1
    report = erase_subject(warehouse, SUBJECT, "T-1")
    assert report.removed["records"] == 2 and subject_rows(warehouse) == NOTHING
    after_erasure = snapshot(warehouse.engine)

    exact = run_ladder(warehouse, three_days, "day1")  # the whole partition again, from the landing file
    assert exact.decisions["erased"] == 2 and exact.decisions["exact_duplicate"] == 10
    assert subject_rows(warehouse) == NOTHING  # not even a staged copy
    assert snapshot(warehouse.engine) == after_erasure


@pytest.mark.parametrize(
    "subject",
    [
        Subject.parse("canonical_url", "https://shop.example.com/p/7"),
        Subject.parse("field", "jane.doe@example.com", field="seller_id"),
    ],
    ids=["url", "field"],
)
def test_broken_lines_naming_an_erased_subject_never_bring_its_bytes_back_to_quarantine(warehouse, tmp_path, subject):
    """Breaks: a subject's broken (quarantined) line is erased, then its batch is materialised again from the landing
    file, and a later crawl brings another broken line naming it (a URL with tracking parameters, an escaped slash).

    Must hold: the erasure empties every broken line naming the subject or an erased row's URL (JSON-escaped
    slashes too), keeping its number and reason (which says so); afterwards such lines are still counted in
    quarantine, but their bytes are not stored again (the reason says so), whatever named the subject; a
    broken line naming nobody erased keeps its bytes.
    """
    from dedup_pipeline.ladder.raw import WITHHELD
    from dedup_pipeline.store.erasure import ERASED_LINE
    from dedup_pipeline.store.schema import quarantine

    folder = tmp_path / "landing"
    broken = '{"url": "https://shop.example.com/p/7", "seller_id": "jane.doe@example.com", "title": "Kett'
    other = '{"url": "https://shop.example.com/p/8", "seller_id": "s-1", "title": "Spo'
    url_only = '{"url": "https://shop.example.com/p/7?utm_source=mail", "title": "Kett'  # no seller in it
    escaped = '{"url": "https:\\/\\/shop.example.com\\/p\\/7", "title": "Ke'
    write_batch(
        folder,
        "p1",
        [listing(7, seller_id="jane.doe@example.com"), broken, listing(8), other, url_only, escaped],
        landed=T0,
    )
    run_ladder(warehouse, folder, "p1")
    erase_subject(warehouse, subject, "DSR-1")

    def quarantined():
        with warehouse.engine.connect() as conn:
            return {
                (batch, line): (reason, bytes(raw))
                for batch, line, reason, raw in conn.execute(
                    select(quarantine.c.batch_id, quarantine.c.line_no, quarantine.c.reason, quarantine.c.raw_line)
                )
            }

    rows = quarantined()
    assert set(rows) == {("p1", 2), ("p1", 4), ("p1", 5), ("p1", 6)}
    assert all(
        rows[line][1] == b"" and rows[line][0].endswith(ERASED_LINE) for line in [("p1", 2), ("p1", 5), ("p1", 6)]
    )
    run_ladder(warehouse, folder, "p1")
    again = '{"url": "https:\\/\\/SHOP.example.com\\/p\\/7?utm_source=x", "seller_id": "jane.doe@example.com", "ti'
    write_batch(folder, "p2", [again], landed=T0 + DAY)
    run_ladder(warehouse, folder, "p2")
    rows = quarantined()
    assert set(rows) == {("p1", 2), ("p1", 4), ("p1", 5), ("p1", 6), ("p2", 1)}
    for line in (("p1", 2), ("p1", 5), ("p1", 6), ("p2", 1)):
        reason, raw = rows[line]
        assert reason.startswith("malformed JSON: ") and reason.endswith(WITHHELD) and raw == b""
    assert rows[("p1", 4)][1] == other.encode()


def test_a_field_subjects_staged_listing_takes_its_broken_lines_out_of_quarantine_too(warehouse, tmp_path):
    """Breaks: a field subject's listing is only staged (raw and canonical rungs ran, the exact rung not yet) when
    the erasure runs; a broken line of the batch names the listing by its URL alone; a later crawl brings
    another broken line for it (tracking parameters added).

    Must hold: as for a stored listing, the erasure empties the broken line, and the later one is counted
    in quarantine without its bytes.
    """
    from dedup_pipeline.ladder.raw import WITHHELD
    from dedup_pipeline.store.erasure import ERASED_LINE
    from dedup_pipeline.store.schema import quarantine

    folder = tmp_path / "landing"
    broken = '{"url": "https://shop.example.com/u/jane-doe", "title": "Jane Doe profile, cut off'
    write_batch(
        folder,
        "p1",
        [listing(1), listing(7, seller_id="s-X", url="https://shop.example.com/u/jane-doe"), broken],
        landed=T0,
    )
    run_ladder(warehouse, folder, "p1", rungs=("raw", "canonical"))
    report = erase_subject(warehouse, SUBJECT, "DSR-staged")
    assert report.removed["canonical_records"] == 1 and report.removed["quarantine (redacted)"] == 1
    write_batch(
        folder,
        "p2",
        [listing(2), '{"url": "https://shop.example.com/u/jane-doe?utm_source=x", "title": "Ja'],
        landed=T0 + DAY,
    )
    run_ladder(warehouse, folder, "p2")
    with warehouse.engine.connect() as conn:
        rows = conn.execute(select(quarantine.c.batch_id, quarantine.c.reason, quarantine.c.raw_line)).all()
    assert sorted((batch, bytes(raw)) for batch, _, raw in rows) == [("p1", b""), ("p2", b"")]
    reasons = {batch: reason for batch, reason, _ in rows}
    assert reasons["p1"].endswith(ERASED_LINE) and reasons["p2"].endswith(WITHHELD)


def test_a_subject_named_by_a_number_never_brings_its_bytes_back_to_quarantine(warehouse, tmp_path):
    """Breaks: a seller id is a JSON number, in a line with no URL (quarantined by the canonical rung) and in a
    truncated one (by the raw rung); the seller is erased by field, and the batch is materialised again.

    Must hold: the erasure empties both lines (once, it found neither), and the re-run keeps their numbers
    and reasons but not their bytes (once, the URL-less line came back whole); a line giving the number to
    another field keeps its bytes.
    """
    from dedup_pipeline.ladder.raw import WITHHELD
    from dedup_pipeline.store.schema import quarantine

    folder = tmp_path / "landing"
    no_url = '{"title": "no url", "seller_id": 4711001, "price": "1", "currency": "EUR"}'
    truncated = '{"url": "https://shop.example.com/p/9", "seller_id": 4711001, "title": '
    priced = '{"title": "no url either", "seller_id": "s-2", "price": 4711001}'
    write_batch(folder, "p1", [listing(1, seller_id=4711001), listing(2), no_url, truncated, priced], landed=T0)
    run_ladder(warehouse, folder, "p1")

    def quarantined():
        with warehouse.engine.connect() as conn:
            return {
                line: (reason, bytes(raw))
                for line, reason, raw in conn.execute(
                    select(quarantine.c.line_no, quarantine.c.reason, quarantine.c.raw_line)
                )
            }

    assert set(quarantined()) == {3, 4, 5}
    erase_subject(warehouse, Subject.parse("field", "4711001", field="seller_id"), "DSR-N")
    emptied = quarantined()
    assert set(emptied) == {3, 4, 5} and emptied[3][1] == emptied[4][1] == b"" and emptied[5][1] == priced.encode()
    exact = run_ladder(warehouse, folder, "p1")
    assert exact.decisions["erased"] == 1
    rows = quarantined()
    assert set(rows) == {3, 4, 5} and rows[3][1] == rows[4][1] == b"" and rows[5][1] == priced.encode()
    assert rows[3][0].endswith(WITHHELD) and rows[4][0].endswith(WITHHELD)


def test_an_erased_page_does_not_come_back_under_its_trailing_slash_twin(warehouse, tmp_path):
    """`url/1` keeps /a and /a/ apart (a server may serve two pages); for erasure they are one page."""
    folder = tmp_path / "landing"
    write_batch(folder, "p1", [listing(7), listing(8)], landed=T0)
    run_ladder(warehouse, folder, "p1")
    erase_subject(warehouse, Subject.parse("canonical_url", "https://shop.example.com/p/7"), "DSR-2")
    write_batch(
        folder, "p2", [listing(7, url="https://shop.example.com/p/7/", price="3.00"), listing(9)], landed=T0 + DAY
    )
    exact = run_ladder(warehouse, folder, "p2")
    assert (exact.decisions["erased"], exact.decisions["new"]) == (1, 1)


@on_postgresql
def test_replaying_a_batch_staged_before_the_erasure(warehouse, three_days):
    run_ladder(warehouse, three_days, "day1")
    run_ladder(warehouse, three_days, "day2", rungs=("raw", "canonical"))  # staged, not yet deduplicated
    erase_subject(warehouse, SUBJECT, "T-2")
    assert subject_rows(warehouse) == NOTHING  # the staged line went too
    exact = run_ladder(warehouse, three_days, "day2", rungs=("exact", "near"))  # the replay
    assert exact.decisions["erased"] == 0 and exact.records_in == 1  # nothing of the subject left to replay
    exact = run_ladder(warehouse, three_days, "day2")  # and staged again from the file
    assert exact.decisions["erased"] == 1 and subject_rows(warehouse) == NOTHING


@on_postgresql
def test_a_backfill_of_every_partition_after_erasure(warehouse, three_days):
    for key in ("day1", "day2", "day3"):
        run_ladder(warehouse, three_days, key)
    erase_subject(warehouse, SUBJECT, "T-3")
    after_erasure = snapshot(warehouse.engine)
    erased = 0
    for key in ("day1", "day2", "day3"):  # as `dagster job backfill` would, in order
        erased += run_ladder(warehouse, three_days, key).decisions["erased"]
    assert erased == 4 and subject_rows(warehouse) == NOTHING
    assert snapshot(warehouse.engine) == after_erasure


@on_postgresql
def test_tombstones_hold_through_a_rehash_migration(warehouse, three_days, tmp_path):
    v1_only = LadderSettings(chunk_size=5, hash_versions=("content/1",))
    run_ladder(warehouse, three_days, "day1", v1_only)  # content/2 is not even computed yet
    erase_subject(warehouse, Subject.parse("canonical_url", "https://shop.example.com/p/20"), "T-4")
    # The real migration: backfill content/2 beside content/1, compare, switch.
    backfill(warehouse, "content/2")
    assert compare_versions(warehouse, "content/1", "content/2", low=-1.0, high=1.0).passed
    switch_hash_version(warehouse, "content/2")
    v2_only = LadderSettings(chunk_size=5, hash_versions=("content/2",))
    folder = tmp_path / "later"
    write_batch(
        folder,
        "day4",
        [
            listing(20, seller_id="s-X", url="https://shop.example.com/p/20?gclid=1", crawl_id="d"),  # by URL variant
            listing(20, seller_id="s-X", url="https://elsewhere.example.com/listing/20"),  # by its content/2 digest
            listing(21, seller_id="s-X", crawl_id="d"),  # not erased: stays
        ],
        landed=T0 + 3 * DAY,
    )
    exact = run_ladder(warehouse, folder, "day4", v2_only)
    assert exact.hash_version == "content/2"
    assert exact.decisions["erased"] == 2 and exact.decisions["exact_duplicate"] == 1
    with warehouse.engine.connect() as conn:
        keys = set(conn.execute(select(records.c.natural_key)).scalars())
    assert "https://shop.example.com/p/20" not in keys and "https://elsewhere.example.com/listing/20" not in keys
    assert "https://shop.example.com/p/21" in keys


@on_postgresql
def test_erasure_redacts_the_rehash_reports_that_name_the_subject(warehouse, tmp_path):
    folder = tmp_path / "landing"
    same = listing(7)  # one content under two URLs: two rows under content/1, one group under content/2
    write_batch(folder, "a", [same, {**same, "url": "https://mirror.example.net/7"}, listing(8)], landed=T0)
    run_ladder(warehouse, folder, "a")
    comparison = compare_versions(warehouse, "content/1", "content/2", low=-1.0, high=1.0)
    [merge] = comparison.figures["merge_examples"]
    assert set(merge["keys"]) == {"https://shop.example.com/p/7", "https://mirror.example.net/7"}
    report = erase_subject(warehouse, Subject.parse("canonical_url", "https://shop.example.com/p/7"), "T-6")
    assert report.removed["records"] == 2  # the mirror is the same content
    assert report.removed["rehash_comparisons (redacted)"] == 1
    with warehouse.engine.connect() as conn:
        figures = conn.execute(select(rehash_comparisons.c.figures)).scalar_one()
    [merge] = figures["merge_examples"]
    assert merge["keys"] == ["[erased]", "[erased]"] and merge["target_digest"] == "[erased]"
    assert figures["rows_compared"] == comparison.figures["rows_compared"]  # the figures themselves stay


def test_an_erasure_racing_a_concurrent_ingestion_leaves_nothing(warehouse, tmp_path):
    folder = tmp_path / "landing"
    lines = [listing(n, seller_id="s-X" if n % 10 == 0 else f"s-{n % 7}") for n in range(3000)]
    write_batch(folder, "big", lines, landed=T0)
    ingest_raw_batch(warehouse, find_batch(folder, "big"))
    canonicalise_batch(warehouse, "big", LadderSettings(chunk_size=50))
    failures = []

    def ingest():
        try:
            deduplicate_batch(warehouse, "big", "run-big", LadderSettings(chunk_size=50))
        except Exception as exc:  # noqa: BLE001 - reported below
            failures.append(exc)

    worker = threading.Thread(target=ingest)
    worker.start()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # erase while the worker is part-way through the batch
        with warehouse.engine.connect() as conn:
            if conn.execute(select(func.count()).select_from(records)).scalar_one() >= 200:
                break
        time.sleep(0.01)
    racing = worker.is_alive()
    report = erase_subject(warehouse, SUBJECT, "T-5")
    worker.join(120)
    assert racing and not worker.is_alive() and not failures
    assert report.removed["records"] > 0  # it erased what the worker had stored so far...
    with warehouse.engine.connect() as conn:
        suppressed = conn.execute(
            select(func.count()).select_from(dedup_decisions).where(dedup_decisions.c.decision == "erased")
        ).scalar_one()
        if warehouse.dialect == "postgresql":
            # ...and the worker's later chunks met the tombstone: a waiting erasure gets the lock between two
            # chunks. SQLite's busy wait is not fair: the erasure may only get in after the worker's last chunk.
            assert suppressed > 0
        assert conn.execute(select(func.count()).select_from(records)).scalar_one() == 2700
    assert subject_rows(warehouse)["records"] == 0


@pytest.mark.parametrize(
    "subject",
    [
        Subject.parse("canonical_url", "https://shop.example.com/p/21"),
        Subject.parse("field", "s-X", field="seller_id"),
    ],
    ids=["url", "field"],
)
def test_the_canonical_rung_never_stages_an_erased_subject_again(warehouse, three_days, subject):
    """Breaks: after an erasure, a partition is materialised again only as far as the canonical rung (a run that
    stops there: a blocking check, a crash, a canonical-only materialisation), its staged rows then kept for the
    staging retention.

    Must hold: the lines naming the subject are staged withheld, with none of their data (the line count stays
    whole and the canonical suite passes); the exact rung then decides them `erased` and drops them.
    """
    from dedup_pipeline.quality import expectations, frames
    from dedup_pipeline.store.warehouse import active_hash_version

    run_ladder(warehouse, three_days, "day1")
    erase_subject(warehouse, subject, "T-9")
    report = canonicalise_batch(warehouse, "day1", SETTINGS)
    # listings 20 and 21 carry s-X; only 21 is /p/21
    subject_lines, named = (2, "s-X") if subject.kind.value == "field" else (1, "/p/21")
    assert report.withheld == subject_lines and report.canonical == 12
    with warehouse.engine.connect() as conn:
        staged = conn.execute(select(canonical_records.c.natural_key, canonical_records.c.payload)).all()
        frame = frames.canonical_frame(conn, "day1", active_hash_version(conn))
        suite = expectations.canonical_suite(frames.expected_canonical_rows(conn, "day1"))
    text = str(staged)
    assert named not in text and sum(key.startswith("withheld:") for key, _ in staged) == subject_lines
    assert expectations.validate(frame, "canonical_records", suite).success
    exact = run_ladder(warehouse, three_days, "day1", rungs=("exact",))
    assert exact.decisions["erased"] == subject_lines and named not in str(snapshot(warehouse.engine))
    with warehouse.engine.connect() as conn:
        assert not conn.execute(
            select(canonical_records.c.line_no).where(canonical_records.c.natural_key.like("withheld:%"))
        ).all()


#: The encodings a crawler gets wrong: every line of theirs below is quarantined (not UTF-8 text).
_OTHER_ENCODINGS = ("latin-1", "cp1252", "utf-16-le", "utf-16-be")


def _lines_in_other_encodings(seller: str, n: int) -> list[bytes]:
    """Broken lines naming `seller` by field alone (the URL is no erased row's), in each of `_OTHER_ENCODINGS`:
    the seller before the first byte that is not UTF-8, and after it."""
    after = {"url": f"https://shop.example.com/p/{n}", "seller_id": seller, "title": "Café kettle"}
    before = {"url": f"https://shop.example.com/p/{n + 1}", "title": "Kettle £5 off", "seller_id": seller}
    lines = []
    for encoding in _OTHER_ENCODINGS:
        for record in (after, before):
            text = json.dumps(record, ensure_ascii=False)
            lines.append(text.encode(encoding))
    return lines


@on_postgresql
@pytest.mark.parametrize("seller", ["jane.doe@example.com", "José Müller"], ids=["ascii", "non-ascii"])
def test_an_erasure_leaves_no_quarantined_bytes_naming_the_subject_in_any_encoding(warehouse, tmp_path, seller):
    """Breaks: broken lines in Latin-1, cp1252 and UTF-16 name a seller (by field alone) who is then erased, and
    the batch is materialised again and a later crawl brings the same lines.

    Must hold: quarantine keeps only the start of such a line that is UTF-8 text (the reason says where it was
    cut), which the erasure searches like any line; after the erasure no quarantined bytes name the seller in
    UTF-8 or any of those encodings, before or after the re-runs, while every line stays counted. (Once, such
    lines kept their bytes until the quarantine retention.)
    """
    from dedup_pipeline.store.schema import quarantine

    folder = tmp_path / "landing"
    write_batch(folder, "p1", [listing(7, seller_id=seller), *_lines_in_other_encodings(seller, 20)], landed=T0)
    run_ladder(warehouse, folder, "p1")

    def quarantined() -> dict:
        with warehouse.engine.connect() as conn:
            rows = conn.execute(select(quarantine.c.batch_id, quarantine.c.line_no, quarantine.c.raw_line)).all()
        return {(batch, line): bytes(raw) for batch, line, raw in rows}

    def naming_the_seller(rows: dict) -> list:
        forms = {seller.encode("utf-8")}
        for encoding in _OTHER_ENCODINGS:
            forms |= {seller.encode(encoding, errors="ignore")} - {b""}
        return [line for line, raw in rows.items() if any(form in raw for form in forms)]

    rows = quarantined()
    assert sorted(rows) == [("p1", n) for n in range(2, 10)]
    erase_subject(warehouse, Subject.parse("field", seller, field="seller_id"), "DSR-enc")
    assert naming_the_seller(quarantined()) == []
    for raw in rows.values():  # what was kept is text the erasure could search
        assert b"\x00" not in raw and isinstance(raw.decode("utf-8"), str)
    run_ladder(warehouse, folder, "p1")
    write_batch(folder, "p2", _lines_in_other_encodings(seller, 40), landed=T0 + DAY)
    run_ladder(warehouse, folder, "p2")
    rows = quarantined()
    assert sorted(rows) == [("p1", n) for n in range(2, 10)] + [("p2", n) for n in range(1, 9)]
    assert naming_the_seller(rows) == []
