"""Erasure on SQLite and the real PostgreSQL: every copy goes, with everything derived from it."""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import func, select

from dedup_pipeline.core.erasure import Subject
from dedup_pipeline.core.hashing import content_hash
from dedup_pipeline.core.near import NearDupParams
from dedup_pipeline.crawler import UrlSeenSet
from dedup_pipeline.ladder.canonical import canonicalise_batch
from dedup_pipeline.ladder.erasure import erase_subject
from dedup_pipeline.ladder.exact import deduplicate_batch
from dedup_pipeline.ladder.near import cluster_batch
from dedup_pipeline.ladder.raw import ingest_raw_batch
from dedup_pipeline.ladder.settings import NearSettings
from dedup_pipeline.landing import find_batch
from dedup_pipeline.store.erasure import ERASED_LINE
from dedup_pipeline.store.schema import (
    canonical_records,
    dedup_decisions,
    erasure_requests,
    erasure_tombstones,
    near_duplicate_clusters,
    near_duplicate_links,
    quarantine,
    record_hashes,
    record_history,
    records,
)
from dedup_pipeline.store.seen_set import RedisSeenSet
from dedup_pipeline_tests.erasure_helpers import (
    DAY,
    P4,
    SETTINGS,
    T0,
    count,
    crawl_two_days,
    mirror,
    record_id,
    run_ladder,
)
from dedup_pipeline_tests.helpers import listing, new_run_id, snapshot, write_batch

REDIS_URL = "redis://127.0.0.1:6379/0"
pytestmark = pytest.mark.usefixtures("tombstone_key")


@pytest.fixture
def crawled(warehouse, tmp_path):
    return crawl_two_days(warehouse, tmp_path)


def test_erasure_removes_every_copy_and_recomputes_clusters(warehouse, crawled):
    copies = ["https://mirror.example.net/k4", "https://copy.example.org/kettle"]
    p4 = record_id(warehouse, P4)
    with warehouse.engine.connect() as conn:
        assert (
            conn.execute(
                select(func.count())
                .select_from(near_duplicate_clusters)
                .where(near_duplicate_clusters.c.cluster_id == p4)
            ).scalar_one()
            == 3
        )
    before = snapshot(warehouse.engine)

    report = erase_subject(
        warehouse, Subject.parse("canonical_url", "HTTP://SHOP.example.com:80/p/4?gclid=9#top"), "T-1"
    )

    assert report.removed["records"] == 1
    assert report.removed["record_hashes"] == 2  # content/1 and content/2
    assert report.removed["record_history"] == 1  # the day-1 price
    assert report.removed["canonical_records"] == 2  # staged day-1 and day-2 lines
    assert report.removed["dedup_decisions (redacted)"] == 2
    assert report.removed["quarantine (redacted)"] == 1  # the broken line with the URL variant, not /p/40
    assert report.removed["near_duplicate_links"] == 2
    assert report.removed["near_duplicate_clusters"] == 1
    assert report.removed["near_index"] == 1
    assert report.clusters_recomputed == 1
    # Tombstones: the URL and the key under both schemes (the request named http, the crawl had https), with
    # and without a trailing slash; both versions' digests of both contents (day 1 and day 2); and, for the
    # quarantine only, the erased row's URL (four variants) and key.
    assert report.tombstones_added == 4 + 4 + 4 + 5
    # Breaks: the decision rows and the quarantined line were deleted, so the batches' decisions no longer added up
    # to their lines, and a replay's decisions became the batch's first. Must hold: each line is still accounted
    # for, with its decision or reason, and nothing of the subject is left in it.
    with warehouse.engine.connect() as conn:
        lines = conn.execute(select(quarantine.c.raw_line, quarantine.c.reason)).all()
        redacted = conn.execute(
            select(dedup_decisions.c.decision, dedup_decisions.c.batch_id).where(
                dedup_decisions.c.natural_key.is_(None), dedup_decisions.c.content_hash.is_(None)
            )
        ).all()
    assert len(lines) == 2 and [raw for raw, reason in lines if reason.endswith(ERASED_LINE)] == [b""]
    assert not any(b"/p/4?" in raw or b'/p/4"' in raw for raw, _ in lines)
    assert len(redacted) == 2 and {decision for decision, _ in redacted} <= {"new", "changed", "exact_duplicate"}

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


def test_erasure_by_field_reaches_history_but_spares_the_listing_now_held_by_someone_else(warehouse, tmp_path):
    folder = tmp_path / "landing"
    write_batch(
        folder, "a", [listing(1, seller_id="s-X"), listing(2, seller_id="s-X"), listing(3, seller_id="s-Y")], landed=T0
    )
    write_batch(folder, "b", [listing(2, seller_id="s-Y")], landed=T0 + DAY)  # p/2 changes hands
    run_ladder(warehouse, folder, "a")
    run_ladder(warehouse, folder, "b")
    report = erase_subject(warehouse, Subject.parse("field", "s-X", field="seller_id"), "T-3")
    assert report.removed["records"] == 1 and report.removed["record_history"] == 1
    assert record_id(warehouse, "https://shop.example.com/p/1") is None
    assert record_id(warehouse, "https://shop.example.com/p/2") is not None  # now s-Y's: kept
    # Breaks: the staged line of s-X's old p/2 put the listing's key among the erased ones, so the new owner's
    # decision went too, and quarantined lines naming the live listing would have been withheld. Only the
    # decisions naming s-X's contents go.
    with warehouse.engine.connect() as conn:
        kept = conn.execute(select(dedup_decisions.c.batch_id, dedup_decisions.c.natural_key)).all()
    assert ("b", "https://shop.example.com/p/2") in kept and ("a", "https://shop.example.com/p/2") not in kept
    assert report.removed["dedup_decisions (redacted)"] == 2  # s-X's p/1 and p/2 lines of batch a
    with warehouse.engine.connect() as conn:
        sellers = [p["seller_id"] for p in conn.execute(select(records.c.payload)).scalars()]
    assert sorted(sellers) == ["s-Y", "s-Y"]
    # A later crawl of s-X's old p/2 listing (volatile fields only differ) is suppressed by its digest.
    write_batch(
        folder, "c", [listing(2, seller_id="s-X", crawl_id="z"), listing(9, seller_id="s-X")], landed=T0 + 2 * DAY
    )
    assert run_ladder(warehouse, folder, "c").decisions["erased"] == 2


def test_a_field_value_held_in_a_list_is_erased_everywhere_and_never_comes_back(warehouse, tmp_path):
    """Breaks: the subject is one element of a list field (Scrapy's `getall()`: `"author": ["Jane Doe", "Bob Roe"]`),
    in a stored record, in history, in a batch staged but not yet deduplicated; then a re-crawl in that shape.

    Must hold: the erasure removes every row whose field is the value or a list holding it (a list without
    it, and a nested list, are kept); a re-crawl with the value in a list is decided `erased`, never staged.
    """
    folder = tmp_path / "landing"
    write_batch(
        folder,
        "a",
        [
            listing(1, author="Jane Doe"),
            listing(2, author=["Bob Roe", "Jane  Doe"]),
            listing(3, author=["Bob Roe"]),
            listing(4, author=[["Jane Doe"]]),
        ],
        landed=T0,
    )
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
    write_batch(
        folder, "d", [listing(6, author=["Jane Doe"]), listing(7, author=["Bob Roe", "jane doe"])], landed=T0 + 3 * DAY
    )
    decisions = run_ladder(warehouse, folder, "d").decisions
    assert decisions["erased"] == 1 and decisions["new"] == 1
    with warehouse.engine.connect() as conn:
        named = {
            key
            for table in (records, canonical_records, record_history)
            for key, payload in conn.execute(select(table.c.natural_key, table.c.payload))
            if "Jane Doe" in str(payload)
        }
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


def test_the_links_its_neighbours_make_again_are_counted_so_the_report_adds_up_to_the_table(warehouse, tmp_path):
    """Breaks: an erasure printed the links it removed, not the ones the records that had linked to the erased one
    stored when they linked again, so the table shrank by less than the report said. With one link a record, both
    copies link to the original; erased, the later copy links to the earlier one instead."""
    folder = tmp_path / "landing"
    copies = [
        mirror(4, "shipped today", "https://mirror.example.net/k4"),
        mirror(4, "fast delivery", "https://c.org/k"),
    ]
    write_batch(folder, "a", [listing(4), *copies], landed=T0)
    ingest_raw_batch(warehouse, find_batch(folder, "a"))
    canonicalise_batch(warehouse, "a", SETTINGS)
    deduplicate_batch(warehouse, "a", new_run_id("a"), SETTINGS)
    cluster_batch(warehouse, "a", NearSettings(params=NearDupParams(threshold=0.5), max_links=1))
    p4 = record_id(warehouse, P4)
    assert {r.record_a for r in snapshot_links(warehouse)} == {p4}
    before = count(warehouse, near_duplicate_links)

    report = erase_subject(warehouse, Subject.parse("natural_key", P4), "T-links")

    assert (report.removed["near_duplicate_links"], report.links_added) == (2, 1)
    assert count(warehouse, near_duplicate_links) == before - 2 + 1
    (link,) = snapshot_links(warehouse)
    assert {link.record_a, link.record_b} == {record_id(warehouse, c["url"]) for c in copies}
    with warehouse.engine.connect() as conn:
        assert conn.execute(select(erasure_requests.c.removed)).scalar_one()["links_added"] == 1


def snapshot_links(warehouse):
    with warehouse.engine.connect() as conn:
        return conn.execute(select(near_duplicate_links)).all()


def test_erasure_before_any_crawl_and_twice_is_idempotent(warehouse, tmp_path):
    first = erase_subject(warehouse, Subject.parse("field", "jane@example.org", field="author.email"), "T-5")
    assert first.tombstones_added == 1 and sum(first.removed.values()) == 0
    folder = tmp_path / "landing"
    write_batch(folder, "a", [listing(1, author={"name": "Jane", "email": " jane@example.org"}), listing(2)], landed=T0)
    assert run_ladder(warehouse, folder, "a").decisions["erased"] == 1
    again = erase_subject(warehouse, Subject.parse("field", "jane@example.org", field="author.email"), "T-5")
    assert again.tombstones_added == 0 and again.removed["records"] == 0
    assert count(warehouse, erasure_tombstones) == 1 and count(warehouse, erasure_requests) == 2
    # a report keeps its shape whatever was found: the first found nothing, the second a record
    assert set(first.removed) == set(again.removed) and "rehash_merged_records" in first.removed


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
        payload = conn.execute(
            select(records.c.payload).where(records.c.natural_key == "https://shop.example.com/p/1")
        ).scalar_one()
    assert {k: payload[k] for k in SQL_LIKE} == SQL_LIKE
    assert count(warehouse, records) == 3 and count(warehouse, record_hashes) == 6
    report = erase_subject(warehouse, Subject.parse("field", SQL_LIKE["seller_id"], field="seller_id"), "T-6")
    assert report.removed["records"] == 1
    assert (
        count(warehouse, records) == 2
        and count(warehouse, record_hashes) == 4
        and count(warehouse, dedup_decisions) == 3
    )
    with warehouse.engine.connect() as conn:  # its decision stays, without its key and digest
        keys = conn.execute(select(dedup_decisions.c.natural_key, dedup_decisions.c.content_hash)).all()
    assert sorted(k for k, _ in keys if k) == ["https://shop.example.com/p/2", "https://shop.example.com/p/3"]
    assert [(k, d) for k, d in keys if not k] == [(None, None)]


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
