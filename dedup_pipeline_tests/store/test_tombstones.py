"""The tombstone gate (dedup_pipeline.store.tombstones): no re-crawl gets past it, and no wrong key opens it."""

from __future__ import annotations

import os
import secrets
import stat

import pytest
from sqlalchemy import select

from dedup_pipeline.core.erasure import Subject, key_id
from dedup_pipeline.environment import TOMBSTONE_KEY_ENV
from dedup_pipeline.ladder.erasure import erase_subject
from dedup_pipeline.ladder.retention import RetentionSettings, prune_retention
from dedup_pipeline.store.schema import (
    canonical_records,
    dedup_decisions,
    erasure_tombstones,
    metadata,
)
from dedup_pipeline.store.tombstones import TombstoneKeyError, key_file_path
from dedup_pipeline.store.warehouse import Warehouse
from dedup_pipeline_tests.erasure_helpers import DAY, P4, T0, count, crawl_two_days, record_id, run_ladder
from dedup_pipeline_tests.helpers import listing, write_batch

pytestmark = pytest.mark.usefixtures("tombstone_key")


@pytest.fixture
def crawled(warehouse, tmp_path):
    return crawl_two_days(warehouse, tmp_path)


def test_no_recrawl_gets_past_the_tombstones(warehouse, crawled):
    original = listing(4)
    erase_subject(warehouse, Subject.parse("natural_key", P4), "T-2")
    day3 = [
        listing(
            4,
            url="https://SHOP.example.com/p/4?utm_medium=x",
            crawl_id="c3",
            scraped_at="2026-12-01T00:00:00Z",
            proxy_ip="10.1.1.1",
            price="1.00",
        ),  # URL variant, new content
        {**original, "url": "https://reseller.example.com/item/77", "crawl_id": "c3"},  # same content, other URL
        listing(6, crawl_id="c3"),  # someone else
        listing(200),  # new
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


def test_a_key_given_to_the_warehouse_is_the_one_its_tombstones_use(warehouse, tmp_path):
    """The Dagster resource gives the warehouse its key (`Warehouse(tombstone_key=)`); the variable, set here to
    another key, is only the command line's. A warehouse of the variable's key then refuses to ingest."""
    given = secrets.token_hex(32)
    keyed = Warehouse(warehouse.url, tombstone_key=given)
    erase_subject(keyed, Subject.parse("natural_key", "https://shop.example.com/p/1"), "T-13")
    with keyed.engine.connect() as conn:
        kept = set(conn.execute(select(erasure_tombstones.c.key_id)).scalars())
    assert kept == {key_id(given.encode())}
    folder = tmp_path / "landing"
    write_batch(folder, "a", [listing(1), listing(2)], landed=T0)
    assert run_ladder(keyed, folder, "a").decisions["erased"] == 1
    with pytest.raises(TombstoneKeyError, match="another key"):
        run_ladder(warehouse, folder, "a")
    keyed.dispose()


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


@pytest.mark.parametrize("weak", ["change-me-to-a-long-random-secret", "a" * 64])
def test_a_placeholder_or_low_entropy_key_is_refused_with_how_to_make_one(warehouse, monkeypatch, weak):
    monkeypatch.setenv(TOMBSTONE_KEY_ENV, weak)
    with pytest.raises(TombstoneKeyError) as refused:
        erase_subject(warehouse, Subject.parse("natural_key", "https://shop.example.com/p/1"), "T-10")
    assert "secrets.token_urlsafe(32)" in str(refused.value) and weak not in str(refused.value)
