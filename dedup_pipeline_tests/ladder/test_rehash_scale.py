"""The rehash migration on the real PostgreSQL at 100,000 rows, with a shard killed mid-run and batches arriving.

The killed shard is a real process killed with SIGKILL while it waits on a
row lock the test holds, so it dies between committed pages; the resumed run
must hash exactly the rows the killed one left.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from datetime import timedelta

import pytest
from sqlalchemy import create_engine, func, select, text

from dedup_pipeline.ladder.rehash import (
    backfill,
    backfill_shard,
    compare_versions,
    retire_hash_version,
    switch_hash_version,
)
from dedup_pipeline.store import rehash as store
from dedup_pipeline.store.schema import record_hashes, records
from dedup_pipeline_tests.helpers import write_batch
from dedup_pipeline_tests.rehash_helpers import (
    assert_unique_per_version,
    expected,
    load_legacy_rows,
    migration_listing,
    run_ladder,
)

pytestmark = [pytest.mark.postgres, pytest.mark.slow]  # 100,000 rows: out of `make test-fast`
ROWS = 100_000
SOURCE, TARGET = "content/1", "content/2"
KILLED = "rehash-killed-shard"
DAY = 86400.0
BASE = time.time() - 10 * DAY


def wait_for(what, probe, timeout=120.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def shard_rows_in_order(conn, shard):
    low, high = store.shard_range(shard)
    query = select(records.c.record_id).where(records.c.hash_version == SOURCE, records.c.content_hash >= low)
    if high is not None:
        query = query.where(records.c.content_hash < high)
    return conn.execute(query.order_by(records.c.content_hash)).scalars().all()


def kill_a_shard_between_pages(warehouse_url, warehouse, shard):
    """Run `shard` in a subprocess, block it on a row lock two thirds in, SIGKILL it; returns rows it committed."""
    with warehouse.engine.connect() as conn:
        order = shard_rows_in_order(conn, shard)
    blocker_engine = create_engine(warehouse_url)
    blocker = blocker_engine.connect()
    # An uncommitted target row for a record two thirds into the shard: the shard's insert of that page waits on it.
    blocker.execute(
        record_hashes.insert().values(
            record_id=order[2 * len(order) // 3],
            hash_version=TARGET,
            content_hash=None,
            error="held by the test",
        )
    )
    code = (
        "from dedup_pipeline.ladder.rehash import backfill_shard;"
        "from dedup_pipeline.store.warehouse import Warehouse;"
        f"backfill_shard(Warehouse({warehouse_url + '?application_name=' + KILLED!r}), {TARGET!r}, {shard!r}, "
        "chunk_size=300)"
    )
    process = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    admin = create_engine(warehouse_url, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            waiting = text(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = :app AND wait_event_type = 'Lock'"
            )
            wait_for(
                "the shard to block on the held row",
                lambda: process.poll() is None and conn.execute(waiting, {"app": KILLED}).scalar(),
            )
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            blocker.rollback()
            conn.execute(
                text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = :app"),
                {"app": KILLED},
            )
            wait_for(
                "the killed shard's sessions to end",
                lambda: conn.execute(
                    text("SELECT count(*) = 0 FROM pg_stat_activity WHERE application_name = :app"), {"app": KILLED}
                ).scalar(),
            )
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
        blocker.close()
        blocker_engine.dispose()
        admin.dispose()
    with warehouse.engine.connect() as conn:
        return store.progress(conn, TARGET, shard).done, len(order)


@pytest.mark.parametrize("warehouse_url", ["postgresql"], indirect=True)
def test_migration_of_100k_rows_with_a_killed_shard_and_batches_in_the_middle(warehouse_url, warehouse, tmp_path):
    raws = [migration_listing(n) for n in range(ROWS)]
    want = load_legacy_rows(warehouse, raws)

    # A shard killed between pages resumes with exactly the rows it left.
    done_before, shard_total = kill_a_shard_between_pages(warehouse_url, warehouse, "a")
    assert 0 < done_before < shard_total
    resumed = backfill_shard(warehouse, TARGET, "a", chunk_size=300)
    assert resumed.complete and resumed.already_hashed == 0
    assert resumed.hashed + resumed.unhashable == shard_total - done_before

    # Half the shards, a batch, the other half: new rows carry both versions, changed rows get both back.
    first_half = [backfill_shard(warehouse, TARGET, shard) for shard in store.SHARDS[:8]]

    def ordinary(n):  # neither in a merge group nor unhashable under content/2
        return n % 40 not in (0, 1) and n % 97 != 3 and n % 101 != 5

    unmerged = [n for n in range(2, 3000) if ordinary(n)]
    plain = [n for n in range(ROWS + 1000, ROWS + 1300) if ordinary(n)]
    twice = {**migration_listing(ROWS + 5000), "url": "https://shop.example.com/p/split"}
    mid_lines = (
        [migration_listing(n) for n in range(1000, 1300)]  # unchanged re-crawls
        + [{**migration_listing(n), "price": "1.25"} for n in unmerged[:100]]  # changed prices
        + [migration_listing(n) for n in range(ROWS, ROWS + 500)]  # new listings
        + [{**twice, "price": "9.99999"}, {**twice, "price": "10.00001"}]  # one content/1 digest, two content/2
    )
    write_batch(tmp_path, "mid", mid_lines, landed=BASE)
    mid = run_ladder(warehouse, tmp_path, "mid")
    assert (mid.decisions["exact_duplicate"], mid.decisions["changed"], mid.decisions["new"]) == (301, 100, 501)
    second_half = [backfill_shard(warehouse, TARGET, shard) for shard in store.SHARDS[8:]]
    reports = [resumed, *first_half, *second_half]
    assert all(r.complete for r in reports) and second_half[-1].warehouse_progress.left == 0
    with warehouse.engine.connect() as conn:
        target_rows = conn.execute(
            select(func.count()).select_from(record_hashes).where(record_hashes.c.hash_version == TARGET)
        ).scalar_one()
        assert target_rows == conn.execute(select(func.count()).select_from(records)).scalar_one() == ROWS + 501

    # A second whole backfill writes nothing.
    assert sum(r.hashed + r.unhashable for r in backfill(warehouse, TARGET)) == 0

    # Compare: legacy merges stay (the changed rows were outside merge groups); the batch adds one split.
    result = compare_versions(warehouse, SOURCE, TARGET, -0.01, 0.05)
    f = result.figures
    fresh = expected([migration_listing(n) for n in range(ROWS, ROWS + 500)])  # the batch's new listings
    assert result.passed and f["rows_left"] == 0
    assert f["rows_unhashable"] == want["unhashable"] + fresh["unhashable"]
    assert f["merge_groups"] == want["merge_groups"] + fresh["merge_groups"]
    assert f["rows_merged_away"] == want["rows_merged_away"] + fresh["rows_merged_away"]
    assert f["split_groups"] == 1

    # Switch, then a batch decided on content/2.
    switched = switch_hash_version(warehouse, TARGET, overlap_hours=24)
    assert (switched.kept_merged, switched.kept_unhashable) == (f["rows_merged_away"], f["rows_unhashable"])
    assert_unique_per_version(warehouse)
    write_batch(
        tmp_path,
        "after",
        [
            {**migration_listing(n), "url": f"https://third.example.org/{n}"}
            for n in unmerged[200:400]  # same content, new URL
        ]
        + [migration_listing(n) for n in plain[:100]],
        landed=BASE + DAY,
    )
    after = run_ladder(warehouse, tmp_path, "after")
    assert (after.decisions["exact_duplicate"], after.decisions["new"]) == (200, 100)

    # Retire after the overlap window: merged rows to history, old digests gone, dedup still right.
    retired = retire_hash_version(warehouse, SOURCE, now=switched.overlap_until + timedelta(seconds=1))
    assert (retired.merged_moved, retired.kept_unhashable) == (f["rows_merged_away"], f["rows_unhashable"])
    assert_unique_per_version(warehouse)
    write_batch(tmp_path, "later", [migration_listing(41), migration_listing(ROWS + 2000)], landed=BASE + 2 * DAY)
    later = run_ladder(warehouse, tmp_path, "later")
    assert (later.decisions["exact_duplicate"], later.decisions["new"]) == (1, 1)
