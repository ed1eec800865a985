"""URL credentials never stored, and the move of an existing warehouse from `url/1` to `url/2` (SQLite and PostgreSQL).

A new warehouse keys on `url/2` (no userinfo, RFC 5952 IPv6 hosts). One made
by older code stays on `url/1`, keeps its keys, and still stores no userinfo;
`migrate_url_version` moves it, rewriting the rows of older code that hold
credentials, and a re-crawl afterwards is all exact duplicates.
"""

from __future__ import annotations

import json

import pytest
from sqlalchemy import delete, func, insert, select, text, update

from dedup_pipeline.core.fields import canonical_fields
from dedup_pipeline.core.hashing import HASH_RULES, compute_hashes
from dedup_pipeline.core.url import canonical_url
from dedup_pipeline.ladder.url_migration import migrate_url_version
from dedup_pipeline.store.schema import (
    canonical_records,
    dedup_decisions,
    metadata,
    quarantine,
    record_hashes,
    record_history,
    records,
    settings,
)
from dedup_pipeline.store.warehouse import ACTIVE_URL_VERSION, Warehouse, active_url_version, utcnow
from dedup_pipeline_tests.erasure_helpers import DAY, T0, run_ladder
from dedup_pipeline_tests.helpers import listing, write_batch

SECRET = "hunter2"
CREDENTIALED = f"https://admin:{SECRET}@shop.example.com/p/9"
IPV6 = "http://[2001:0DB8:0:0:0:0:0:1]/p/2"


def crawl() -> list:
    return [
        listing(1),
        listing(2, url=IPV6),
        listing(9, url=CREDENTIALED),
        f'{{"url": "{CREDENTIALED}", "title": broken'.encode(),  # quarantined by the raw rung
        listing(10, url=f"https://admin:{SECRET}@shop.example.com/p/10", seller_id=None),  # no content/2: kept
    ]


def everything(warehouse) -> str:
    """Every row of every table, as text: what an operator, an analyst or a backup could read."""
    with warehouse.engine.connect() as conn:
        return "\n".join(str(conn.execute(select(table)).all()) for table in metadata.sorted_tables)


def make_legacy(warehouse) -> None:
    """Make the warehouse one of code older than url/2: it has a hash version and no URL version."""
    with warehouse.engine.begin() as conn:
        conn.execute(delete(settings).where(settings.c.name == ACTIVE_URL_VERSION))
    warehouse.create_schema()


def keys(warehouse) -> dict[str, str]:
    with warehouse.engine.connect() as conn:
        return dict(conn.execute(select(records.c.natural_key, records.c.url_version)).all())


def assert_digests_follow_payloads(warehouse) -> None:
    """Every stored digest is the digest of its row's stored payload (what the rehash backfill relies on)."""
    with warehouse.engine.connect() as conn:
        r = records.c
        for rid, payload, version, digest in conn.execute(
            select(r.record_id, r.payload, r.hash_version, r.content_hash)
        ):
            assert compute_hashes(payload, [version])[0][version] == digest.hex(), rid
        for rid, version, digest in conn.execute(
            select(record_hashes.c.record_id, record_hashes.c.hash_version, record_hashes.c.content_hash).where(
                record_hashes.c.content_hash.is_not(None)
            )
        ):
            payload = conn.execute(select(records.c.payload).where(records.c.record_id == rid)).scalar_one()
            assert compute_hashes(payload, [version])[0][version] == digest.hex(), (rid, version)


def test_a_new_warehouse_keys_on_url2_and_stores_no_credentials(warehouse, tmp_path):
    folder = tmp_path / "landing"
    write_batch(folder, "a", crawl(), landed=T0)
    report = run_ladder(warehouse, folder, "a")
    assert report.decisions["new"] == 4
    with warehouse.engine.connect() as conn:
        assert active_url_version(conn) == "url/2"
        assert conn.execute(select(func.count()).select_from(quarantine)).scalar_one() == 1
    assert keys(warehouse) == {
        "https://shop.example.com/p/1": "url/2",
        "http://[2001:db8::1]/p/2": "url/2",
        "https://shop.example.com/p/9": "url/2",
        "https://shop.example.com/p/10": "url/2",
    }
    assert SECRET not in everything(warehouse)  # records, history, decisions, staged rows, quarantine bytes
    assert_digests_follow_payloads(warehouse)
    # The same page with and without credentials is one record.
    write_batch(folder, "b", [listing(9, url="https://shop.example.com/p/9", crawl_id="b")], landed=T0 + DAY)
    assert run_ladder(warehouse, folder, "b").decisions["exact_duplicate"] == 1


def test_an_older_warehouse_keeps_url1_keys_and_still_stores_no_credentials(warehouse, tmp_path):
    make_legacy(warehouse)
    folder = tmp_path / "landing"
    write_batch(folder, "a", crawl(), landed=T0)
    run_ladder(warehouse, folder, "a")
    with warehouse.engine.connect() as conn:
        assert active_url_version(conn) == "url/1"
    assert keys(warehouse)["http://[2001:0db8:0:0:0:0:0:1]/p/2"] == "url/1"  # url/1 keys as before
    assert keys(warehouse)["https://shop.example.com/p/1"] == "url/1"
    assert SECRET not in everything(warehouse)


def store_as_older_code(warehouse, raw: dict, batch_id: str, line_no: int) -> None:
    """A row, its decision and a quarantined line as code older than url/2 wrote them: userinfo kept."""
    payload = {**canonical_fields(raw), "url": canonical_url(raw["url"], version="url/1")}
    digests, _ = compute_hashes(payload, sorted(HASH_RULES))
    now = utcnow()
    with warehouse.engine.begin() as conn:
        rid = conn.execute(
            insert(records)
            .values(
                natural_key=payload["url"],
                canonical_url=payload["url"],
                url_version="url/1",
                hash_version="content/1",
                content_hash=bytes.fromhex(digests["content/1"]),
                payload=payload,
                first_seen_at=now,
                last_crawled_at=now,
                first_batch_id=batch_id,
                last_batch_id=batch_id,
                last_landed_at=now.replace(year=2020),
                last_line_no=line_no,
            )
            .returning(records.c.record_id)
        ).scalar_one()
        conn.execute(
            insert(record_hashes),
            [{"record_id": rid, "hash_version": v, "content_hash": bytes.fromhex(d)} for v, d in digests.items()],
        )
        conn.execute(
            insert(dedup_decisions).values(
                batch_id=batch_id,
                line_no=line_no,
                run_id="old",
                natural_key=payload["url"],
                decision="new",
                decided_at=now,
            )
        )
        conn.execute(
            insert(quarantine).values(
                batch_id=batch_id,
                line_no=line_no + 1000,
                rung="raw",
                reason="not JSON",
                raw_line=json.dumps({"url": raw["url"]}).encode()[:-3],
                quarantined_at=now,
            )
        )


def stage_as_older_code(warehouse, raw: dict) -> None:
    """A staged line as code older than url/2 wrote it: userinfo kept, content/2 unhashable."""
    payload = {**canonical_fields(raw), "url": canonical_url(raw["url"], version="url/1")}
    digests, errors = compute_hashes(payload, sorted(HASH_RULES))
    with warehouse.engine.begin() as conn:
        conn.execute(
            insert(canonical_records).values(
                batch_id="old-staged",
                line_no=1,
                natural_key=payload["url"],
                canonical_url=payload["url"],
                url_version="url/1",
                hashes=digests,
                hash_errors=errors,
                payload=payload,
            )
        )


def test_migration_to_url2_rewrites_keys_drops_credentials_and_a_recrawl_is_all_duplicates(warehouse, tmp_path):
    make_legacy(warehouse)
    folder = tmp_path / "landing"
    first = [listing(1), listing(2, url=IPV6), listing(4)]
    write_batch(folder, "a", first, landed=T0)
    run_ladder(warehouse, folder, "a")
    # Older code stored these with their credentials: a page of its own, one also stored without them (newer),
    # and the same content as listing 4 under a credentialed URL of another page.
    store_as_older_code(warehouse, listing(7, url=f"https://bob:{SECRET}@shop.example.com/p/7"), "old", 1)
    store_as_older_code(warehouse, listing(1, url=f"https://bob:{SECRET}@shop.example.com/p/1", price="1.00"), "old", 2)
    store_as_older_code(warehouse, listing(4, url=f"https://bob:{SECRET}@shop.example.com/p/4"), "old", 3)
    stage_as_older_code(warehouse, listing(8, url=f"https://bob:{SECRET}@shop.example.com/p/8", seller_id=None))
    assert SECRET in everything(warehouse)

    report = migrate_url_version(warehouse, "url/2")
    assert (report.from_version, report.to_version) == ("url/1", "url/2")
    assert report.rows_rewritten == 2 and report.rows_filed == 2  # p/7 and the IPv6 row; old p/1 and old p/4
    assert report.decisions_rewritten == 4  # the three credentialed keys and the IPv6 one
    assert report.quarantine_redacted == 3 and report.history_rewritten == 2
    assert SECRET not in everything(warehouse)
    with warehouse.engine.connect() as conn:
        assert active_url_version(conn) == "url/2"
        filed = conn.execute(
            select(record_history.c.natural_key, record_history.c.payload["price"].as_string()).where(
                record_history.c.superseded_by_batch_id == "migrate:url/2"
            )
        ).all()
        event = conn.execute(text("SELECT action, from_version, to_version FROM hash_version_events")).one()
    assert sorted(k for k, _ in filed) == ["https://shop.example.com/p/1", "https://shop.example.com/p/4"]
    assert tuple(event) == ("url-switch", "url/1", "url/2")
    assert keys(warehouse) == {
        "https://shop.example.com/p/1": "url/2",  # the newer version of the page stayed
        "http://[2001:db8::1]/p/2": "url/2",
        "https://shop.example.com/p/4": "url/2",
        "https://shop.example.com/p/7": "url/2",
    }
    assert_digests_follow_payloads(warehouse)
    with warehouse.engine.connect() as conn:
        staged = conn.execute(select(canonical_records).where(canonical_records.c.url_version != "url/2")).all()
        old = conn.execute(select(canonical_records).where(canonical_records.c.batch_id == "old-staged")).one()
    assert staged == [] and report.staged_rewritten == 2  # the IPv6 line of batch a, and the old line
    assert (old.natural_key, old.canonical_url) == ("https://shop.example.com/p/8",) * 2
    assert old.hashes == compute_hashes(old.payload, ["content/1"])[0]
    assert "missing identity field 'seller_id'" in old.hash_errors["content/2"]  # its reason stays

    # Nothing left to do, and a re-crawl of every page (with or without credentials) stores nothing new.
    again = migrate_url_version(warehouse, "url/2")
    assert (again.rows_rewritten, again.rows_filed, again.decisions_rewritten, again.quarantine_redacted) == (0,) * 4
    recrawl = [*first, listing(7, url="https://eve:x@shop.example.com/p/7")]
    write_batch(folder, "b", [{**r, "crawl_id": "b"} for r in recrawl], landed=T0 + DAY)
    assert dict(run_ladder(warehouse, folder, "b").decisions) == {"exact_duplicate": 4}


def test_a_warehouse_never_moves_back(warehouse):
    with warehouse.engine.begin() as conn:
        conn.execute(update(settings).where(settings.c.name == ACTIVE_URL_VERSION).values(value="url/2"))
    with pytest.raises(ValueError, match="never moved back"):
        migrate_url_version(warehouse, "url/1")
    with pytest.raises(ValueError, match="unknown URL version"):
        migrate_url_version(warehouse, "url/7")


def test_an_existing_warehouse_of_older_code_is_url1_and_a_new_one_url2(warehouse_url):
    fresh = Warehouse(warehouse_url).create_schema()
    try:
        with fresh.engine.connect() as conn:
            assert active_url_version(conn) == "url/2"
        make_legacy(fresh)
        with fresh.engine.connect() as conn:
            assert active_url_version(conn) == "url/1"
    finally:
        fresh.dispose()
