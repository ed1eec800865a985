"""Erasure on SQLite and the real PostgreSQL: every copy goes, tombstones stop every way back in."""

from __future__ import annotations

import os
import secrets
import stat
import uuid
from datetime import timedelta

import pytest
from sqlalchemy import func, select

from dedup_pipeline.core.erasure import Subject
from dedup_pipeline.crawler import UrlSeenSet
from dedup_pipeline.core.hashing import content_hash
from dedup_pipeline.core.near import NearDupParams
from dedup_pipeline.ladder.canonical import canonicalise_batch
from dedup_pipeline.ladder.erasure import erase_subject
from dedup_pipeline.ladder.exact import deduplicate_batch
from dedup_pipeline.ladder.near import cluster_batch
from dedup_pipeline.ladder.raw import ingest_raw_batch
from dedup_pipeline.ladder.retention import RetentionSettings, prune_retention
from dedup_pipeline.ladder.settings import LadderSettings
from dedup_pipeline.landing import find_batch
from dedup_pipeline.store.erasure import TOMBSTONE_KEY_ENV, TombstoneKeyError, key_file_path
from dedup_pipeline.store.schema import (
    canonical_records, dedup_decisions, erasure_requests, erasure_tombstones, metadata, near_duplicate_clusters,
    quarantine, record_hashes, record_history, records,
)
from dedup_pipeline.store.seen_set import RedisSeenSet
from dedup_pipeline.store.warehouse import utcnow
from dedup_pipeline_tests.helpers import listing, snapshot, write_batch
from dedup_pipeline_tests.helpers import new_run_id

DAY = 86400.0
T0 = 1_700_000_000
SETTINGS = LadderSettings(chunk_size=7)
P4 = "https://shop.example.com/p/4"
REDIS_URL = "redis://127.0.0.1:6379/0"


@pytest.fixture(autouse=True)
def tombstone_key(monkeypatch):
    key = secrets.token_hex(32)
    monkeypatch.setenv(TOMBSTONE_KEY_ENV, key)
    return key


def run_ladder(warehouse, folder, key, seen_set=None):
    ingest_raw_batch(warehouse, find_batch(folder, key))
    canonicalise_batch(warehouse, key, SETTINGS)
    exact = deduplicate_batch(warehouse, key, new_run_id(key), SETTINGS, seen_set)
    cluster_batch(warehouse, key, NearDupParams(threshold=0.5))
    return exact


def count(warehouse, table, *where):
    with warehouse.engine.connect() as conn:
        return conn.execute(select(func.count()).select_from(table).where(*where)).scalar_one()


def mirror(n: int, suffix: str, url: str) -> dict:
    """A syndicated copy of listing n: same title, description plus a few words, another URL."""
    base = listing(n)
    return listing(n + 100, url=url, title=base["title"], description=f"{base['description']} {suffix}")


@pytest.fixture
def crawled(warehouse, tmp_path):
    """Two days of crawl: p/4 changes price on day 2 and has two syndicated copies; bad lines in quarantine."""
    folder = tmp_path / "landing"
    day1 = [listing(n) for n in range(12)]
    day1 += [mirror(4, "shipped today", "https://mirror.example.net/k4"),
             mirror(4, "fast delivery", "https://copy.example.org/kettle")]
    day1 += ['{"url": "https://Shop.Example.com/p/4?utm_source=a", "title": "broken',  # holds the subject
             '{"url": "https://shop.example.com/p/40", "title": "broken']              # does not
    write_batch(folder, "day1", day1, landed=T0)
    write_batch(folder, "day2", [listing(4, price="99.00", crawl_id="c2"), listing(5, crawl_id="c2")], landed=T0 + DAY)
    for key in ("day1", "day2"):
        run_ladder(warehouse, folder, key)
    return folder


def record_id(warehouse, natural_key):
    with warehouse.engine.connect() as conn:
        return conn.execute(select(records.c.record_id).where(records.c.natural_key == natural_key)).scalar_one_or_none()


def test_erasure_removes_every_copy_and_recomputes_clusters(warehouse, crawled):
    copies = ["https://mirror.example.net/k4", "https://copy.example.org/kettle"]
    p4 = record_id(warehouse, P4)
    with warehouse.engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(near_duplicate_clusters)
                            .where(near_duplicate_clusters.c.cluster_id == p4)).scalar_one() == 3
    before = snapshot(warehouse.engine)

    report = erase_subject(warehouse, Subject.parse("canonical_url", "HTTP://SHOP.example.com:80/p/4?gclid=9#top"), "T-1")

    assert report.removed["records"] == 1
    assert report.removed["record_hashes"] == 2           # content/1 and content/2
    assert report.removed["record_history"] == 1          # the day-1 price
    assert report.removed["canonical_records"] == 2       # staged day-1 and day-2 lines
    assert report.removed["dedup_decisions"] == 2
    assert report.removed["quarantine"] == 1              # the broken line with the URL variant, not /p/40
    assert report.removed["near_duplicate_links"] == 2
    assert report.removed["near_duplicate_clusters"] == 1
    assert report.removed["minhash_signatures"] == 1 and report.removed["lsh_buckets"] > 0
    assert report.clusters_recomputed == 1
    # Tombstones: the URL and the key under both schemes (the request named http, the crawl had https), with
    # and without a trailing slash; both versions' digests of both contents (day 1 and day 2); and, for the
    # quarantine only, the erased row's URL (four variants) and key.
    assert report.tombstones_added == 4 + 4 + 4 + 5
    assert count(warehouse, quarantine) == 1

    after = snapshot(warehouse.engine)
    assert [r for r in before["records"] if r[0] != P4] == after["records"]
    assert after["history"] == []
    # The two copies stay linked to each other; the cluster id is now the smaller of theirs.
    first_copy = min(record_id(warehouse, url) for url in copies)
    with warehouse.engine.connect() as conn:
        rows = conn.execute(select(near_duplicate_clusters)).all()
    assert {(r.record_id, r.cluster_id) for r in rows} == {(record_id(warehouse, u), first_copy) for u in copies}
    assert sum(r.is_representative for r in rows) == 1
    with warehouse.engine.connect() as conn:
        audit = conn.execute(select(erasure_requests)).one()
    assert audit.request_id == "T-1" and audit.removed["records"] == 1 and audit.subject_kind == "canonical_url"
    assert P4 not in str(audit.removed)


def test_no_recrawl_gets_past_the_tombstones(warehouse, crawled):
    original = listing(4)
    erase_subject(warehouse, Subject.parse("natural_key", P4), "T-2")
    day3 = [
        listing(4, url="https://SHOP.example.com/p/4?utm_medium=x", crawl_id="c3",
                scraped_at="2026-12-01T00:00:00Z", proxy_ip="10.1.1.1", price="1.00"),   # URL variant, new content
        {**original, "url": "https://reseller.example.com/item/77", "crawl_id": "c3"},    # same content, other URL
        listing(6, crawl_id="c3"),                                                         # someone else
        listing(200),                                                                      # new
    ]
    write_batch(crawled, "day3", day3, landed=T0 + 2 * DAY)
    report = run_ladder(warehouse, crawled, "day3")
    assert report.decisions["erased"] == 2
    assert report.decisions["exact_duplicate"] == 1 and report.decisions["new"] == 1
    assert record_id(warehouse, P4) is None and record_id(warehouse, "https://reseller.example.com/item/77") is None
    # The suppressed lines left no staged copy behind.
    assert count(warehouse, canonical_records, canonical_records.c.batch_id == "day3") == 2
    # The decision log records the suppression without the erased key or digest, so retention has nothing to redact.
    erased = dedup_decisions.c.decision == "erased"
    assert count(warehouse, dedup_decisions, erased) == 2
    assert count(warehouse, dedup_decisions, erased, dedup_decisions.c.natural_key.is_not(None)) == 0
    assert count(warehouse, dedup_decisions, erased, dedup_decisions.c.content_hash.is_not(None)) == 0
    pruned = prune_retention(warehouse, RetentionSettings())
    assert pruned.redacted_erased_decisions == 0


def test_erasure_by_field_reaches_history_but_spares_the_listing_now_held_by_someone_else(warehouse, tmp_path):
    folder = tmp_path / "landing"
    write_batch(folder, "a", [listing(1, seller_id="s-X"), listing(2, seller_id="s-X"), listing(3, seller_id="s-Y")], landed=T0)
    write_batch(folder, "b", [listing(2, seller_id="s-Y")], landed=T0 + DAY)  # p/2 changes hands
    run_ladder(warehouse, folder, "a")
    run_ladder(warehouse, folder, "b")
    report = erase_subject(warehouse, Subject.parse("field", "s-X", field="seller_id"), "T-3")
    assert report.removed["records"] == 1 and report.removed["record_history"] == 1
    assert record_id(warehouse, "https://shop.example.com/p/1") is None
    assert record_id(warehouse, "https://shop.example.com/p/2") is not None  # now s-Y's: kept
    with warehouse.engine.connect() as conn:
        sellers = [p["seller_id"] for p in conn.execute(select(records.c.payload)).scalars()]
    assert sorted(sellers) == ["s-Y", "s-Y"]
    # A later crawl of s-X's old p/2 listing (volatile fields only differ) is suppressed by its digest.
    write_batch(folder, "c", [listing(2, seller_id="s-X", crawl_id="z"), listing(9, seller_id="s-X")], landed=T0 + 2 * DAY)
    assert run_ladder(warehouse, folder, "c").decisions["erased"] == 2


def test_a_field_value_held_in_a_list_is_erased_everywhere_and_never_comes_back(warehouse, tmp_path):
    """Breaks: the subject is one element of a list field (Scrapy's `getall()`: `"author": ["Jane Doe", "Bob Roe"]`),
    in a stored record, in history, in a batch staged but not yet deduplicated; then a re-crawl in that shape.

    Must hold: the erasure removes every row whose field is the value or a list holding it (a list without
    it, and a nested list, are kept); a re-crawl with the value in a list is decided `erased`, never staged.
    """
    folder = tmp_path / "landing"
    write_batch(folder, "a", [listing(1, author="Jane Doe"), listing(2, author=["Bob Roe", "Jane  Doe"]),
                              listing(3, author=["Bob Roe"]), listing(4, author=[["Jane Doe"]])], landed=T0)
    write_batch(folder, "b", [listing(2, author=["Jane Doe"], price="1.00")], landed=T0 + DAY)  # p/2 changes
    write_batch(folder, "c", [listing(5, author=["Ann Poe", "Jane Doe"])], landed=T0 + 2 * DAY)
    run_ladder(warehouse, folder, "a")
    run_ladder(warehouse, folder, "b")
    ingest_raw_batch(warehouse, find_batch(folder, "c"))
    canonicalise_batch(warehouse, "c", SETTINGS)  # staged only
    report = erase_subject(warehouse, Subject.parse("field", "Jane Doe", field="author"), "T-list")
    assert report.removed["records"] == 2 and report.removed["record_history"] == 1
    assert report.removed["canonical_records"] == 4  # a/1, a/2, b/1 and the staged c/1
    assert record_id(warehouse, P4) is not None and record_id(warehouse, "https://shop.example.com/p/3") is not None
    write_batch(folder, "d", [listing(6, author=["Jane Doe"]), listing(7, author=["Bob Roe", "jane doe"])],
                landed=T0 + 3 * DAY)
    decisions = run_ladder(warehouse, folder, "d").decisions
    assert decisions["erased"] == 1 and decisions["new"] == 1
    with warehouse.engine.connect() as conn:
        named = {key for table in (records, canonical_records, record_history)
                 for key, payload in conn.execute(select(table.c.natural_key, table.c.payload)) if "Jane Doe" in str(payload)}
    assert named == {P4}  # only the nested list


def test_a_content_digest_reaches_every_copy_under_every_version(warehouse, tmp_path):
    folder = tmp_path / "landing"
    same = listing(5)
    write_batch(folder, "a", [same, {**same, "url": "https://mirror.example.net/5"}, listing(6)], landed=T0)
    run_ladder(warehouse, folder, "a")
    assert count(warehouse, records) == 3  # content/1 includes the URL: two rows
    digest = content_hash(same, "content/1")[0]
    report = erase_subject(warehouse, Subject.parse("content_digest", digest, version="content/1"), "T-4")
    # Its content/2 digest (no URL in it) led to the copy under the other URL.
    assert report.removed["records"] == 2 and count(warehouse, records) == 1


def test_erasure_before_any_crawl_and_twice_is_idempotent(warehouse, tmp_path):
    first = erase_subject(warehouse, Subject.parse("field", "jane@example.org", field="author.email"), "T-5")
    assert first.tombstones_added == 1 and sum(first.removed.values()) == 0
    folder = tmp_path / "landing"
    write_batch(folder, "a", [listing(1, author={"name": "Jane", "email": " jane@example.org"}), listing(2)], landed=T0)
    assert run_ladder(warehouse, folder, "a").decisions["erased"] == 1
    again = erase_subject(warehouse, Subject.parse("field", "jane@example.org", field="author.email"), "T-5")
    assert again.tombstones_added == 0 and again.removed["records"] == 0
    assert count(warehouse, erasure_tombstones) == 1 and count(warehouse, erasure_requests) == 2


SQL_LIKE = {
    "title": "Robert'); DROP TABLE records;--",
    "description": "%s %(x)s :name $1 \\ \" ; SELECT * FROM dedup_decisions WHERE '1'='1'",
    "seller_id": "x' OR '1'='1",
    "note": "'; DELETE FROM record_hashes; --",
}


def test_fields_that_look_like_sql_are_stored_verbatim_and_erased_by_parameter(warehouse, tmp_path):
    folder = tmp_path / "landing"
    write_batch(folder, "a", [listing(1, **SQL_LIKE), listing(2), listing(3)], landed=T0)
    run_ladder(warehouse, folder, "a")
    with warehouse.engine.connect() as conn:
        payload = conn.execute(select(records.c.payload).where(records.c.natural_key == "https://shop.example.com/p/1")).scalar_one()
    assert {k: payload[k] for k in SQL_LIKE} == SQL_LIKE
    assert count(warehouse, records) == 3 and count(warehouse, record_hashes) == 6
    report = erase_subject(warehouse, Subject.parse("field", SQL_LIKE["seller_id"], field="seller_id"), "T-6")
    assert report.removed["records"] == 1
    assert count(warehouse, records) == 2 and count(warehouse, record_hashes) == 4 and count(warehouse, dedup_decisions) == 2


def test_a_changed_or_missing_key_refuses_to_ingest_rather_than_resurrect(warehouse, tmp_path, monkeypatch):
    folder = tmp_path / "landing"
    write_batch(folder, "a", [listing(1), listing(2)], landed=T0)
    run_ladder(warehouse, folder, "a")
    erase_subject(warehouse, Subject.parse("natural_key", "https://shop.example.com/p/1"), "T-7")
    monkeypatch.setenv(TOMBSTONE_KEY_ENV, secrets.token_hex(32))  # someone rotated the key
    write_batch(folder, "b", [listing(1, crawl_id="again")], landed=T0 + DAY)
    with pytest.raises(TombstoneKeyError, match="another key"):
        run_ladder(warehouse, folder, "b")
    assert record_id(warehouse, "https://shop.example.com/p/1") is None
    monkeypatch.setenv(TOMBSTONE_KEY_ENV, "too short")
    with pytest.raises(TombstoneKeyError, match="at least 32 bytes"):
        erase_subject(warehouse, Subject.parse("natural_key", "x"), "T-8")


def test_production_needs_the_key_from_the_environment(warehouse, tmp_path, monkeypatch):
    monkeypatch.delenv(TOMBSTONE_KEY_ENV)
    folder = tmp_path / "landing"
    write_batch(folder, "a", [listing(1)], landed=T0)
    run_ladder(warehouse, folder, "a")  # with no tombstones, ingestion needs no key
    if warehouse.dialect == "postgresql":
        with pytest.raises(TombstoneKeyError, match=TOMBSTONE_KEY_ENV):
            erase_subject(warehouse, Subject.parse("natural_key", "https://shop.example.com/p/1"), "T-9")
        assert record_id(warehouse, "https://shop.example.com/p/1") is not None  # nothing half-done
        return
    # The embedded default makes its own random key beside the SQLite file, readable by its owner only.
    erase_subject(warehouse, Subject.parse("natural_key", "https://shop.example.com/p/1"), "T-9")
    path = key_file_path(warehouse.url)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600 and len(path.read_bytes().strip()) == 64
    write_batch(folder, "b", [listing(1, crawl_id="again")], landed=T0 + DAY)
    assert run_ladder(warehouse, folder, "b").decisions["erased"] == 1


def test_retention_prunes_only_what_is_past_its_time(warehouse, crawled):
    decisions, history, staged, quarantined = (count(warehouse, t) for t in
                                               (dedup_decisions, record_history, canonical_records, quarantine))
    assert decisions and history and staged and quarantined
    kept = prune_retention(warehouse, RetentionSettings(staging_days=0), now=utcnow() + timedelta(days=29))
    assert kept.pruned == {"dedup_decisions": 0, "record_history": 0, "quarantine": 0}
    later = prune_retention(
        warehouse, RetentionSettings(batch_size=3, staging_days=10_000), now=utcnow() + timedelta(days=91)
    )
    # Decisions (90 days) and quarantine (30) are past their time; history (365) and staging (10,000 days) are not.
    assert later.pruned == {"dedup_decisions": decisions, "record_history": 0, "canonical_records": 0, "quarantine": quarantined}
    assert count(warehouse, record_history) == history and count(warehouse, canonical_records) == staged
    final = prune_retention(warehouse, RetentionSettings(), now=utcnow() + timedelta(days=400))
    assert final.pruned["record_history"] == history and final.pruned["canonical_records"] == staged  # batches of 2023
    assert count(warehouse, records) == 14  # the warehouse itself is never pruned


def test_staged_rows_are_kept_for_their_time_after_staging_whatever_the_file_time(warehouse, tmp_path):
    """Breaks: staged rows were pruned by their file's landing time, so a batch whose file kept an old time (`cp -p`)
    lost its staged rows minutes after it ran."""
    folder = tmp_path / "landing"
    write_batch(folder, "old-file", [listing(1), listing(2)], landed=T0)  # 2023, as an archived crawl's file
    run_ladder(warehouse, folder, "old-file")
    staged = count(warehouse, canonical_records)
    assert staged == 2
    assert prune_retention(warehouse, RetentionSettings()).pruned["canonical_records"] == 0
    month = prune_retention(warehouse, RetentionSettings(), now=utcnow() + timedelta(days=31))
    assert month.pruned["canonical_records"] == staged and count(warehouse, canonical_records) == 0


def test_retention_settings_come_from_the_environment(monkeypatch):
    monkeypatch.setenv("DEDUP_DECISION_RETENTION_DAYS", "7")
    monkeypatch.setenv("DEDUP_QUARANTINE_RETENTION_DAYS", "0")
    settings = RetentionSettings.from_env(history_days=30)
    assert (settings.decision_days, settings.quarantine_days, settings.history_days, settings.staging_days) == (7, 0, 30, 30)
    monkeypatch.setenv("DEDUP_HISTORY_RETENTION_DAYS", "a week")
    with pytest.raises(ValueError, match="DEDUP_HISTORY_RETENTION_DAYS"):
        RetentionSettings.from_env()


@pytest.mark.redis
def test_erasure_clears_the_subjects_redis_keys(warehouse, tmp_path):
    space = f"test:{uuid.uuid4().hex}"  # a private key space: other tests share this Redis
    seen = RedisSeenSet(REDIS_URL, ttl_seconds=300, prefix=f"{space}:seen")
    urls = UrlSeenSet(REDIS_URL, ttl_seconds=300, prefix=f"{space}:url")
    try:
        folder = tmp_path / "landing"
        write_batch(folder, "a", [listing(n) for n in range(6)], landed=T0)
        assert urls.first_time_seen_many([P4 + "?utm_source=x", "https://shop.example.com/p/5"]) == [True, True]
        run_ladder(warehouse, folder, "a", seen)
        digest = bytes.fromhex(content_hash(listing(4), "content/1")[0])
        other = bytes.fromhex(content_hash(listing(5), "content/1")[0])
        assert seen.maybe_seen("content/1", [digest, other]) == [True, True]
        report = erase_subject(warehouse, Subject.parse("canonical_url", P4), "T-10", seen_set=seen, url_seen_set=urls)
        assert report.seen_set == "redis" and report.removed["seen_set"] == 1 and report.removed["url_seen_set"] == 1
        assert seen.maybe_seen("content/1", [digest, other]) == [False, True]
        # The crawler would fetch the erased URL again (and the exact rung would suppress it), not p/5.
        assert urls.first_time_seen_many([P4, "https://shop.example.com/p/5"]) == [True, False]
        with warehouse.engine.connect() as conn:
            audit = conn.execute(select(erasure_requests.c.removed)).scalar_one()
        assert (audit["seen_set"], audit["url_seen_set"]) == (1, 1)
    finally:
        keys = list(seen.client.scan_iter(f"{space}:*"))
        if keys:
            seen.client.delete(*keys)


def test_the_in_memory_tombstone_screen_never_outlives_its_tombstones(warehouse, tmp_path):
    """A warehouse dropped and recreated (or restored) under the same engine: same erasure ids, other tombstones."""
    folder = tmp_path / "landing"
    write_batch(folder, "a", [listing(1), listing(2)], landed=T0)
    erase_subject(warehouse, Subject.parse("natural_key", "https://shop.example.com/p/1"), "T-11")
    assert run_ladder(warehouse, folder, "a").decisions["erased"] == 1  # the screen is built now
    metadata.drop_all(warehouse.engine)
    warehouse.create_schema()
    erase_subject(warehouse, Subject.parse("natural_key", "https://shop.example.com/p/2"), "T-12")  # erasure id 1 again
    report = run_ladder(warehouse, folder, "a")
    assert (report.decisions["erased"], report.decisions["new"]) == (1, 1)
    assert record_id(warehouse, "https://shop.example.com/p/1") is not None
    assert record_id(warehouse, "https://shop.example.com/p/2") is None
