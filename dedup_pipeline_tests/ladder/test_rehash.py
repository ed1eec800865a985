"""The rehash migration's logic on SQLite and on the real PostgreSQL: backfill, resume, compare, switch, retire."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import pytest
from sqlalchemy import delete, func, insert, select

from dedup_pipeline.core.near import NearDupParams
from dedup_pipeline.ladder.rehash import (
    MigrationRefused,
    backfill,
    backfill_shard,
    compare_versions,
    retire_hash_version,
    switch_hash_version,
)
from dedup_pipeline.store import rehash as store
from dedup_pipeline.store.schema import (
    hash_version_events,
    near_duplicate_clusters,
    near_duplicate_links,
    near_index,
    record_hashes,
    record_history,
    records,
    rehash_merged_records,
)
from dedup_pipeline.store.tombstones import lock_for_ingestion
from dedup_pipeline.store.warehouse import utcnow
from dedup_pipeline_tests.helpers import write_batch
from dedup_pipeline_tests.rehash_helpers import (
    assert_unique_per_version,
    load_legacy_rows,
    migration_listing,
    run_ladder,
)

DAY = 86400.0
BASE = time.time() - 10 * DAY  # after the legacy rows (2026-01-01), before now
SOURCE, TARGET = "content/1", "content/2"


def hashes_of(warehouse, version):
    with warehouse.engine.connect() as conn:
        return sorted(
            (rid, digest.hex() if digest else None, error)
            for rid, digest, error in conn.execute(
                select(record_hashes.c.record_id, record_hashes.c.content_hash, record_hashes.c.error).where(
                    record_hashes.c.hash_version == version
                )
            )
        )


def index_every_record_in_pairs(warehouse) -> list[tuple[int, int]]:
    """Every record in the LSH index, and records linked and clustered two by two (ids 1+2, 3+4...)."""
    with warehouse.engine.begin() as conn:
        ids = sorted(conn.execute(select(records.c.record_id)).scalars())
        pairs = list(zip(ids[0::2], ids[1::2]))
        # The two of a pair share every band key and their signature: near duplicates of each other alone. What the
        # near rung stored of these records goes first.
        for table in (near_duplicate_links, near_duplicate_clusters, near_index):
            conn.execute(delete(table))
        partner = {x: a for a, b in pairs for x in (a, b)}  # an odd one out keys on itself
        conn.execute(
            insert(near_index),
            [
                {
                    "record_id": x,
                    "content_hash": bytes(32),
                    "first_landed_us": x,
                    "first_seen_us": x,
                    "key_order": x,
                    "signature": bytes([partner.get(x, x) % 251]) * 128,
                    **{f"b{band}": partner.get(x, x) for band in range(NearDupParams().bands)},
                }
                for x in ids
            ],
        )
        conn.execute(
            insert(near_duplicate_links),
            [{"record_a": a, "record_b": b, "similarity": 0.9, "method": "minhash", "batch_id": "t"} for a, b in pairs],
        )
        conn.execute(
            insert(near_duplicate_clusters),
            [{"record_id": x, "cluster_id": a, "is_representative": x == a} for a, b in pairs for x in (a, b)],
        )
    return pairs


def stored_versions(warehouse):
    with warehouse.engine.connect() as conn:
        return dict(conn.execute(select(records.c.hash_version, func.count()).group_by(records.c.hash_version)).all())


def test_a_shard_stopped_halfway_resumes_and_hashes_every_row_once(warehouse):
    raws = [migration_listing(n) for n in range(600)]
    load_legacy_rows(warehouse, raws)
    with warehouse.engine.connect() as conn:
        shard_rows = store.progress(conn, TARGET, "7").rows
    assert shard_rows > 45

    first = backfill_shard(warehouse, TARGET, "7", chunk_size=20, max_chunks=2)
    assert (first.chunks, first.hashed + first.unhashable, first.complete) == (2, 40, False)
    assert first.shard_progress.left == shard_rows - 40

    rest = backfill_shard(warehouse, TARGET, "7", chunk_size=20)
    assert rest.complete and rest.already_hashed == 0
    assert first.hashed + first.unhashable + rest.hashed + rest.unhashable == shard_rows
    assert len(hashes_of(warehouse, TARGET)) == shard_rows  # one row per record (the primary key), none missing

    again = backfill_shard(warehouse, TARGET, "7", chunk_size=20)
    assert (again.hashed, again.unhashable, again.chunks) == (0, 0, 0)


def test_shards_partition_the_digest_space():
    bounds = [store.shard_range(s) for s in store.SHARDS]
    assert bounds[0][0] == b"\x00" and bounds[-1][1] is None
    assert all(high == bounds[i + 1][0] for i, (_, high) in enumerate(bounds[:-1]))
    with pytest.raises(ValueError):
        store.shard_range("g")


def test_the_whole_migration(warehouse, tmp_path):
    raws = [migration_listing(n) for n in range(1500)]
    want = load_legacy_rows(warehouse, raws)
    assert want["merge_groups"] > 10 and want["unhashable"] > 10

    with pytest.raises(MigrationRefused, match=f"1500 of 1500 rows have no {TARGET} digest"):
        switch_hash_version(warehouse, TARGET)

    # Backfill every shard, then again: the second run changes nothing.
    reports = backfill(warehouse, TARGET, chunk_size=97)
    assert all(r.complete for r in reports)
    assert sum(r.hashed for r in reports) == want["hashable"]
    assert sum(r.unhashable for r in reports) == want["unhashable"]
    assert reports[-1].warehouse_progress.left == 0
    before = hashes_of(warehouse, TARGET)
    assert {error for _, _, error in before if error} == {
        "price: not a decimal number",
        "content/2: missing identity field 'seller_id'",
    }
    assert sum(r.hashed + r.unhashable for r in backfill(warehouse, TARGET)) == 0
    assert hashes_of(warehouse, TARGET) == before

    # A batch lands mid-migration: it computes both versions; one URL is listed twice with prices that
    # content/1 (4 decimals) cannot tell apart and content/2 (exact minor units) can: a split.
    twice = {**migration_listing(5000), "url": "https://shop.example.com/p/split"}
    write_batch(
        tmp_path,
        "mid",
        [
            {**twice, "price": "9.99999"},
            {**twice, "price": "10.00001"},
            migration_listing(2),
            migration_listing(6000),
        ],
        landed=BASE,
    )
    mid = run_ladder(warehouse, tmp_path, "mid")
    assert (mid.decisions["exact_duplicate"], mid.decisions["new"]) == (2, 2)

    # Compare: a band that does not allow the merges fails, and the switch refuses it.
    strict = compare_versions(warehouse, SOURCE, TARGET, -0.01, 0.0)
    assert not strict.passed
    with pytest.raises(MigrationRefused, match="latest comparison .* failed"):
        switch_hash_version(warehouse, TARGET)
    result = compare_versions(warehouse, SOURCE, TARGET, -0.01, 0.05)
    f = result.figures
    assert result.passed and f["rows_left"] == 0 and f["rows_unhashable"] == want["unhashable"]
    assert f["rows_compared"] == want["hashable"] + 2  # the batch's two new rows
    assert f["distinct_source"] == f["rows_compared"]
    assert f["distinct_target"] == want["distinct_target"] + 2
    assert (f["merge_groups"], f["rows_merged_away"]) == (want["merge_groups"], want["rows_merged_away"])
    assert f["collapse_rate_change"] == pytest.approx(want["rows_merged_away"] / f["rows_compared"])
    example = f["merge_examples"][0]
    assert example["rows"] == 2 and any(key.startswith("https://mirror.example.net/") for key in example["keys"])
    assert f["split_groups"] == 1 and f["split_examples"][0]["keys"] == ["https://shop.example.com/p/split"]
    assert "9.99999" not in str(f) and "kettle" not in str(f)  # keys and digests, never field values

    # Switch: the first row of each content/2 group moves to content/2; merged and unhashable rows keep content/1.
    now = utcnow()
    switched = switch_hash_version(warehouse, TARGET, overlap_hours=24, now=now)
    assert (switched.kept_merged, switched.kept_unhashable) == (want["rows_merged_away"], want["unhashable"])
    assert warehouse.active_hash_version() == TARGET
    assert stored_versions(warehouse) == {
        TARGET: want["distinct_target"] + 2,
        SOURCE: want["rows_merged_away"] + want["unhashable"],
    }
    assert_unique_per_version(warehouse)
    with pytest.raises(MigrationRefused, match="already the active version"):
        switch_hash_version(warehouse, TARGET)
    # Going back has no comparison job: the refusal says that it takes a forced switch, not a comparison to run.
    with pytest.raises(MigrationRefused, match=f"no comparison job compares {TARGET} with the earlier {SOURCE}"):
        switch_hash_version(warehouse, SOURCE)

    # Dedup after the switch decides on content/2.
    unhashable_key = next(n for n in range(1500) if n % 97 == 3 and n % 40 != 1)
    write_batch(
        tmp_path,
        "after",
        [
            {**migration_listing(0), "url": "https://third.example.org/kettle-0"},  # same listing, new host
            migration_listing(1),  # a merged row, unchanged
            {**migration_listing(4), "price": "99.50"},  # changed price
            {**migration_listing(unhashable_key), "price": "12.00"},  # now hashable: changed
            migration_listing(7000),  # new
        ],
        landed=BASE + DAY,
    )
    after = run_ladder(warehouse, tmp_path, "after")
    assert (after.decisions["exact_duplicate"], after.decisions["changed"], after.decisions["new"]) == (2, 2, 1)
    assert after.hash_version == TARGET
    assert_unique_per_version(warehouse)

    # Retire: refused inside the overlap window, then the merged rows go to history.
    with pytest.raises(MigrationRefused, match="overlap window"):
        retire_hash_version(warehouse, SOURCE, now=now + timedelta(hours=1))
    with pytest.raises(MigrationRefused, match="active version") as refused:
        retire_hash_version(warehouse, TARGET, force=True, reason="no")
    assert "force" not in str(refused.value)  # forcing cannot retire the active version: not offered
    pairs = index_every_record_in_pairs(warehouse)
    retired = retire_hash_version(warehouse, SOURCE, now=now + timedelta(hours=25))
    assert retired.merged_moved == want["rows_merged_away"]
    with warehouse.engine.connect() as conn:  # the merged rows left the index; the clusters they broke are gone
        kept = set(conn.execute(select(records.c.record_id)).scalars())
        assert set(conn.execute(select(near_index.c.record_id)).scalars()) == kept
        clusters = sorted(
            conn.execute(
                select(
                    near_duplicate_clusters.c.cluster_id,
                    near_duplicate_clusters.c.record_id,
                    near_duplicate_clusters.c.is_representative,
                )
            ).all()
        )
    intact = [(a, b) for a, b in pairs if a in kept and b in kept]
    assert any((a in kept) != (b in kept) for a, b in pairs)  # some clusters lost one of their two members
    assert clusters == sorted(row for a, b in intact for row in ((a, a, True), (a, b, False)))
    assert hashes_of(warehouse, SOURCE) == []
    assert stored_versions(warehouse)[SOURCE] == want["unhashable"] - 1  # one became hashable in "after"
    with warehouse.engine.connect() as conn:
        moved = conn.execute(select(rehash_merged_records)).all()
        assert len(moved) == want["rows_merged_away"]
        assert all(
            row.reason.startswith(f"same {TARGET} content as record {row.merged_into_record_id}") for row in moved
        )
        history = conn.execute(
            select(func.count())
            .select_from(record_history)
            .where(record_history.c.superseded_by_batch_id == f"retire:{SOURCE}")
        ).scalar_one()
        assert history == want["rows_merged_away"]
        actions = conn.execute(
            select(hash_version_events.c.action, hash_version_events.c.forced).order_by(hash_version_events.c.event_id)
        ).all()
        assert [tuple(a) for a in actions] == [("switch", False), ("retire", False)]
    assert_unique_per_version(warehouse)

    # Dedup still works after the retire: a re-crawl of a merged-away mirror is an exact duplicate. The retired
    # version is computed no more (the ladder's default hash_versions names it): no new row gets its digest.
    write_batch(tmp_path, "later", [migration_listing(41), migration_listing(8000)], landed=BASE + 2 * DAY)
    later = run_ladder(warehouse, tmp_path, "later")
    assert (later.decisions["exact_duplicate"], later.decisions["new"]) == (1, 1)
    assert hashes_of(warehouse, SOURCE) == []


def test_a_switch_refuses_a_comparison_that_has_not_seen_the_rows_stored_since(warehouse, tmp_path):
    """Breaks: the switch read only the latest comparison's verdict, so rows stored after it went over to the new
    version unjudged (a batch landing between the comparison and the switch). Re-crawls store nothing: they do not
    make a comparison stale."""
    load_legacy_rows(warehouse, [migration_listing(n) for n in range(40)])
    backfill(warehouse, TARGET)
    first = compare_versions(warehouse, SOURCE, TARGET, -0.01, 0.1)
    assert first.passed
    late = [migration_listing(7000), migration_listing(7001)]
    write_batch(tmp_path, "late", late, landed=BASE)
    assert run_ladder(warehouse, tmp_path, "late").decisions["new"] == 2
    with pytest.raises(MigrationRefused, match="2 rows were stored or changed after the latest comparison"):
        switch_hash_version(warehouse, TARGET)
    second = compare_versions(warehouse, SOURCE, TARGET, -0.01, 0.1)
    assert second.figures["rows_compared"] == first.figures["rows_compared"] + 2
    write_batch(tmp_path, "again", late, landed=BASE + DAY)
    assert run_ladder(warehouse, tmp_path, "again").decisions["exact_duplicate"] == 2
    switch_hash_version(warehouse, TARGET)
    assert warehouse.active_hash_version() == TARGET


def test_rows_with_a_blank_required_field_stay_apart_through_the_migration(warehouse):
    """Two sites' listings whose extraction failed (empty title and seller) are unhashable, never merged and retired."""
    blank = [
        {**migration_listing(30), "url": "https://a.example/p/1", "title": "", "seller_id": " "},
        {**migration_listing(30), "url": "https://b.example/x/9", "title": " ", "seller_id": ""},
    ]
    want = load_legacy_rows(
        warehouse, [migration_listing(n) for n in range(6, 26)] + blank
    )  # no special case among them
    assert want["unhashable"] == 2 and want["merge_groups"] == 0

    reports = backfill(warehouse, TARGET)
    assert sum(r.unhashable for r in reports) == 2
    assert (
        sorted(e for _, _, e in hashes_of(warehouse, TARGET) if e) == ["content/2: missing identity field 'title'"] * 2
    )
    assert compare_versions(warehouse, SOURCE, TARGET, -0.01, 0.05).figures["merge_groups"] == 0
    now = utcnow()
    assert switch_hash_version(warehouse, TARGET, overlap_hours=0, now=now).kept_unhashable == 2
    assert retire_hash_version(warehouse, SOURCE, now=now + timedelta(hours=1)).merged_moved == 0
    with warehouse.engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(record_history)).scalar_one() == 0
        assert conn.execute(select(func.count()).select_from(records)).scalar_one() == 22


def test_a_forced_switch_needs_a_reason_and_is_audited(warehouse):
    load_legacy_rows(warehouse, [migration_listing(n) for n in range(50)])
    with pytest.raises(ValueError, match="needs a reason"):
        switch_hash_version(warehouse, TARGET, force=True)
    report = switch_hash_version(warehouse, TARGET, force=True, reason="rule fix needed today", overlap_hours=0)
    assert report.forced and report.promoted == 0 and "no comparison" in "; ".join(report.problems)
    with warehouse.engine.connect() as conn:
        event = conn.execute(select(hash_version_events)).one()
    assert (event.action, event.forced, event.reason) == ("switch", True, "rule fix needed today")
    assert event.details["problems"] == report.problems


def while_a_near_rung_writes(warehouse, step, *args, **kwargs):
    """Run `step` while another connection holds the near index's lock, as a near rung's write section does.

    Asserts that the step is still waiting when the lock is released; returns its result.
    """
    with ThreadPoolExecutor(1) as pool, warehouse.engine.connect() as rung:
        with rung.begin():
            lock_for_ingestion(rung)  # what a near-rung chunk holds while it writes
            running = pool.submit(step, warehouse, *args, **kwargs)
            time.sleep(1.5)
            assert not running.done()
        return running.result(timeout=60)


@pytest.mark.parametrize("warehouse_url", ["postgresql"], indirect=True)
def test_switch_and_retire_wait_for_the_near_rungs_write_section(warehouse):
    """Both rewrite rows of the near index: like erasure, they wait for the rungs' chunks (the erasure lock) first."""
    raws = [migration_listing(n) for n in range(200)]
    want = load_legacy_rows(warehouse, raws)
    assert want["rows_merged_away"] > 0
    backfill(warehouse, TARGET)
    now = utcnow()
    switched = while_a_near_rung_writes(
        warehouse,
        switch_hash_version,
        TARGET,
        force=True,
        reason="test",
        overlap_hours=0,
        now=now,
    )
    assert warehouse.active_hash_version() == TARGET and switched.kept_merged == want["rows_merged_away"]
    retired = while_a_near_rung_writes(warehouse, retire_hash_version, SOURCE, now=now + timedelta(seconds=1))
    assert retired.merged_moved == want["rows_merged_away"]


# ---------------------------------------------------------------- batches during the overlap window

KETTLE = {"title": "Kettle", "description": "steel", "price": "9.90", "currency": "EUR", "seller_id": "s1", "sku": "1"}


def _switched_with_a_merged_row(warehouse, folder):
    """Two URLs of one content/2 content stored under content/1, then the switch: a.example leads, b.example is the
    merged row kept under content/1 through the overlap window; both hold the content/2 digest."""
    write_batch(
        folder, "p1", [{**KETTLE, "url": "https://a.example/x"}, {**KETTLE, "url": "https://b.example/y"}], landed=BASE
    )
    run_ladder(warehouse, folder, "p1", near=False)
    backfill(warehouse, TARGET)
    compare_versions(warehouse, SOURCE, TARGET, low=-1, high=1)
    switch_hash_version(warehouse, TARGET, overlap_hours=24)
    assert stored_versions(warehouse) == {SOURCE: 1, TARGET: 1}


def test_in_the_overlap_a_merged_row_that_changes_leaves_the_content_stored_by_its_leader(warehouse, tmp_path):
    """Breaks: in the overlap window the merged row (b.example) gets new content, and a third URL then carries
    the shared content (the leader still holds it). Once, the rung dropped the digest with b.example's old
    version, planned c.example as new, lost to the UNIQUE index and replayed the same plan until it failed.

    Must hold: changed, then exact duplicate; one row per content/2 digest among the active-version rows.
    """
    folder = tmp_path / "landing"
    _switched_with_a_merged_row(warehouse, folder)
    write_batch(
        folder,
        "p2",
        [{**KETTLE, "url": "https://b.example/y", "price": "12.00"}, {**KETTLE, "url": "https://c.example/z"}],
        landed=BASE + DAY,
    )
    report = run_ladder(warehouse, folder, "p2", near=False)
    assert dict(+report.decisions) == {"changed": 1, "exact_duplicate": 1} and report.chunk_retries == 0
    assert report.seen_set_bypassed and report.as_metadata()["seen_set_bypassed"] is True
    assert_unique_per_version(warehouse)


def test_in_the_overlap_content_held_only_by_a_merged_row_is_not_stored_again(warehouse, tmp_path):
    """Breaks: in the overlap window the leader (a.example) changes, so the shared content/2 digest is held only by
    the merged row under content/1, in record_hashes, where no UNIQUE index catches a seen-set miss; then a third
    URL carries that content, with no seen-set.

    Must hold: the third URL is an exact duplicate (once, it was stored: two rows with one content/2 digest).
    """
    folder = tmp_path / "landing"
    _switched_with_a_merged_row(warehouse, folder)
    write_batch(folder, "p2", [{**KETTLE, "url": "https://a.example/x", "price": "12.00"}], landed=BASE + DAY)
    write_batch(folder, "p3", [{**KETTLE, "url": "https://c.example/z"}], landed=BASE + 2 * DAY)
    assert dict(+run_ladder(warehouse, folder, "p2", near=False).decisions) == {"changed": 1}
    assert dict(+run_ladder(warehouse, folder, "p3", near=False).decisions) == {"exact_duplicate": 1}
    with warehouse.engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(records)).scalar_one() == 2


def test_a_batch_staged_before_the_switch_is_canonicalised_again_under_the_new_version(warehouse, tmp_path):
    """Breaks: a batch canonicalised under content/1 reaches the exact rung after the switch to content/2, with a
    line content/2 cannot hash (no seller_id). Once, the rung crashed on the missing digest, on every retry.

    Must hold: the batch is staged again under content/2: the good line is stored, the other quarantined with
    content/2's reason, as if it had been canonicalised after the switch.
    """
    from dedup_pipeline.ladder.canonical import canonicalise_batch
    from dedup_pipeline.ladder.exact import deduplicate_batch
    from dedup_pipeline.ladder.raw import ingest_raw_batch
    from dedup_pipeline.ladder.settings import LadderSettings
    from dedup_pipeline.landing import find_batch
    from dedup_pipeline.store.schema import quarantine

    folder = tmp_path / "landing"
    no_seller = {k: v for k, v in KETTLE.items() if k != "seller_id"}
    write_batch(
        folder,
        "p1",
        [{**KETTLE, "url": "https://a.example/x"}, {**no_seller, "url": "https://b.example/y"}],
        landed=BASE,
    )
    settings = LadderSettings(chunk_size=100)
    ingest_raw_batch(warehouse, find_batch(folder, "p1"))
    assert canonicalise_batch(warehouse, "p1", settings).quarantined == 0  # content/1 hashes both
    compare_versions(warehouse, SOURCE, TARGET, low=-1, high=1)
    switch_hash_version(warehouse, TARGET, overlap_hours=0)
    report = deduplicate_batch(warehouse, "p1", "run-p1", settings)
    assert dict(+report.decisions) == {"new": 1} and report.quarantined == 1
    with warehouse.engine.connect() as conn:
        assert conn.execute(select(quarantine.c.line_no, quarantine.c.rung, quarantine.c.reason)).all() == [
            (2, "canonical", "content/2: missing identity field 'seller_id'")
        ]
        assert conn.execute(select(records.c.natural_key, records.c.hash_version)).all() == [
            ("https://a.example/x", TARGET)
        ]


def test_a_switch_relabels_the_near_index_and_the_near_rung_then_sketches_nothing(warehouse, tmp_path):
    """Breaks: listings sketched under content/1, one index row holding the whole digest (as an earlier version
    wrote it); then the active version switches to content/2, and the listings are crawled again unchanged.

    Must hold: the switch re-labels every index row with the first 16 bytes of its record's content/2 digest, and
    the near rung of the re-crawl re-sketches and re-labels nothing."""
    from sqlalchemy import update

    from dedup_pipeline.ladder.near import cluster_batch
    from dedup_pipeline.ladder.settings import NearSettings

    raws = [migration_listing(n) for n in range(6, 16)]  # none of the special cases
    write_batch(tmp_path, "b1", raws, landed=BASE)
    run_ladder(warehouse, tmp_path, "b1")
    with warehouse.engine.begin() as conn:
        first = conn.execute(select(func.min(records.c.record_id))).scalar_one()
        whole = select(records.c.content_hash).where(records.c.record_id == first).scalar_subquery()
        conn.execute(update(near_index).where(near_index.c.record_id == first).values(content_hash=whole))

    compare_versions(warehouse, SOURCE, TARGET, low=-1, high=1)
    assert switch_hash_version(warehouse, TARGET, overlap_hours=0).sketches_relabelled == len(raws)
    with warehouse.engine.connect() as conn:
        held = conn.execute(
            select(records.c.hash_version, records.c.content_hash, near_index.c.content_hash).join(
                near_index, near_index.c.record_id == records.c.record_id
            )
        ).all()
    assert len(held) == len(raws) and all(v == TARGET and bytes(i) == bytes(d)[:16] for v, d, i in held)

    write_batch(tmp_path, "b2", raws, landed=BASE + DAY)
    run_ladder(warehouse, tmp_path, "b2", near=False)
    report = cluster_batch(warehouse, "b2", NearSettings(params=NearDupParams(threshold=0.5)))
    assert (report.sketched, report.kept_sketches) == (0, 0)
