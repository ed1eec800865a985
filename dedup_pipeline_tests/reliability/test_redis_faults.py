"""Redis faults against a private redis-server: stopped before a run, SIGKILLed mid-run and restarted empty, flushed.

In every case the run must succeed on the database path (the UNIQUE index is
the authority) and leave exactly the tables a run with a healthy Redis leaves.
"""

from __future__ import annotations

import uuid

import dagster as dg
import pytest

from dedup_pipeline.defs.assets import ladder_assets
from dedup_pipeline.defs.partitions import crawl_batches_partitions
from dedup_pipeline.defs.resources import (
    LadderResource,
    LandingResource,
    NearDupResource,
    SeenSetResource,
    WarehouseResource,
)
from dedup_pipeline.store.seen_set import RedisSeenSet
from dedup_pipeline.store.warehouse import Warehouse
from dedup_pipeline_tests.helpers import listing, snapshot, write_batch
from dedup_pipeline_tests.reliability.ladder_run import (
    LadderReports,
    assert_one_row_per_key_and_content,
    run_ladder,
    set_active_version,
)
from dedup_pipeline_tests.reliability.redis_server import PrivateRedis

KEYS = ("a", "b", "c")
#: Redis is the production seen-set, next to PostgreSQL (the embedded default uses a Bloom file).
ON_POSTGRESQL = pytest.mark.parametrize("warehouse_url", ["postgresql"], indirect=True)


@pytest.fixture
def private_redis(tmp_path):
    server = PrivateRedis(tmp_path / "redis").start()
    yield server
    server.kill()


@pytest.fixture
def crawl(tmp_path):
    """Three overlapping batches: re-crawls (exact duplicates), price changes, new products, and in batch b
    copies of batch a's listings under another host (the same content under `content/2`, another key)."""
    folder = tmp_path / "landing"
    write_batch(folder, "a", [listing(n) for n in range(60)], landed=1e9)
    mirrors = [listing(n, url=f"https://mirror.example.net/p/{n}", crawl_id="m") for n in range(0, 60, 3)]
    write_batch(
        folder,
        "b",
        mirrors + [listing(n, crawl_id="b", price=f"{n}.5" if n % 10 == 0 else f"{10 + n}.90") for n in range(30, 100)],
        landed=1e9 + 60,
    )
    write_batch(folder, "c", [listing(n, crawl_id="c") for n in range(80, 130)], landed=1e9 + 120)
    return folder


def healthy_run(tmp_path, folder, server: PrivateRedis, version: str = "content/1") -> tuple[dict, list[LadderReports]]:
    """The baseline: the same batches with a healthy Redis, on a private SQLite warehouse."""
    warehouse = Warehouse(f"sqlite:///{tmp_path / 'healthy.sqlite'}").create_schema()
    set_active_version(warehouse, version)
    seen = RedisSeenSet(server.url, prefix=f"healthy:{uuid.uuid4().hex}")
    reports = [run_ladder(warehouse, folder, key, seen_set=seen) for key in KEYS]
    assert reports[1].exact.seen_set_hits > 0 and reports[1].exact.seen_set_fallbacks == 0  # the fast path did work
    tables = snapshot(warehouse.engine)
    warehouse.dispose()
    return tables, reports


def decisions(reports: list[LadderReports]) -> list[dict]:
    return [dict(r.exact.decisions) for r in reports]


class KillingSeenSet(RedisSeenSet):
    """The real Redis seen-set; the server is SIGKILLed right after chunk `kill_after` commits, and
    restarted empty after chunk `restart_after` (both counted in `remember` calls, which follow each commit)."""

    def __init__(self, server: PrivateRedis, kill_after: int, restart_after: int):
        super().__init__(server.url, timeout=0.2, retry_after=0.0, prefix=f"kill:{uuid.uuid4().hex}")
        self.server, self.kill_after, self.restart_after, self.commits = server, kill_after, restart_after, 0

    def remember(self, version, digests):
        try:
            super().remember(version, digests)
        finally:
            self.commits += 1
            if self.commits == self.kill_after:
                self.server.kill()
            elif self.commits == self.restart_after:
                self.server.restart()


@ON_POSTGRESQL
def test_redis_stopped_before_the_run(warehouse, tmp_path, crawl, private_redis):
    """Breaks: Redis is down (SIGKILLed) before the run starts, and stays down.

    Must hold: every batch succeeds on the database path (each chunk falls
    back, the circuit breaker answers at once), the decisions and the tables
    equal those of a run with a healthy Redis.
    """
    expected, healthy = healthy_run(tmp_path, crawl, private_redis)
    private_redis.kill()
    seen = RedisSeenSet(private_redis.url, timeout=0.2)
    reports = [run_ladder(warehouse, crawl, key, seen_set=seen) for key in KEYS]
    assert all(r.exact.seen_set_fallbacks > 0 and r.exact.seen_set_hits == 0 for r in reports)
    assert decisions(reports) == decisions(healthy)
    assert snapshot(warehouse.engine) == expected
    assert_one_row_per_key_and_content(warehouse.engine)


@ON_POSTGRESQL
def test_redis_killed_mid_run_and_restarted_empty(warehouse, tmp_path, crawl, private_redis):
    """Breaks: Redis is SIGKILLed between two chunks of a batch, and comes back empty two chunks later.

    Must hold: the chunks while it is down run on the warehouse alone, the
    chunks after the restart trust a cold Redis and the warehouse catches its
    misses; the batch succeeds and the decisions and tables equal a healthy
    run's. (`content/2` active, so batch b's mirror copies are exact
    duplicates under other keys: only the UNIQUE index can catch those.)
    """
    expected, healthy = healthy_run(tmp_path, crawl, private_redis, "content/2")
    set_active_version(warehouse, "content/2")
    private_redis.flush()
    run_ladder(warehouse, crawl, "a", seen_set=RedisSeenSet(private_redis.url, prefix="mid"))
    seen = KillingSeenSet(private_redis, kill_after=1, restart_after=2)  # chunks are 7 records; 20 mirrors lead batch b
    second = run_ladder(warehouse, crawl, "b", seen_set=seen)
    assert seen.commits >= 6 and private_redis.process.poll() is None  # it was killed, then restarted
    assert (
        second.exact.seen_set_fallbacks == 1
    )  # the chunk while it was down: its probe and remember failed, counted once
    assert second.exact.seen_set_cold_misses >= 1  # a chunk after the restart trusted the empty Redis
    assert second.exact.seen_set_hits < healthy[1].exact.seen_set_hits
    third = run_ladder(warehouse, crawl, "c", seen_set=RedisSeenSet(private_redis.url, prefix="mid"))
    assert decisions([second, third]) == decisions(healthy[1:])
    assert snapshot(warehouse.engine) == expected
    assert_one_row_per_key_and_content(warehouse.engine)


@ON_POSTGRESQL
def test_redis_flushed_between_runs(warehouse, tmp_path, crawl, private_redis):
    """Breaks: FLUSHALL on the (private) Redis between batches: every key gone, the server healthy.

    Must hold: the next batch's re-crawled records miss in Redis; the
    warehouse catches them (by natural key, and the UNIQUE index for the
    mirror copies: `content/2` is active, so they are the same content under
    other keys; their chunks are replayed); the decisions and tables equal a
    healthy run's.
    """
    expected, healthy = healthy_run(tmp_path, crawl, private_redis, "content/2")
    set_active_version(warehouse, "content/2")
    seen = RedisSeenSet(private_redis.url, prefix="flushed")
    reports = []
    for key in KEYS:
        private_redis.flush()
        reports.append(run_ladder(warehouse, crawl, key, seen_set=seen))
    assert reports[1].exact.seen_set_cold_misses > 0  # chunks whose misses the UNIQUE index caught, then replayed
    assert decisions(reports) == decisions(healthy)
    assert snapshot(warehouse.engine) == expected
    assert private_redis.keys() > 0  # the run refilled it


def test_dagster_run_succeeds_with_redis_down(tmp_path, crawl, private_redis, monkeypatch):
    """Breaks: the Dagster ladder job's seen-set resource points at a Redis that is down.

    Must hold: the run succeeds, the exact rung's metadata says every chunk
    fell back, and the tables equal a healthy run's.
    """
    expected, _ = healthy_run(tmp_path, crawl, private_redis)
    private_redis.kill()
    monkeypatch.setenv("DEDUP_REDIS_URL", private_redis.url)
    url = f"sqlite:///{tmp_path / 'dagster.sqlite'}"
    instance = dg.DagsterInstance.ephemeral()
    instance.add_dynamic_partitions(crawl_batches_partitions.name, list(KEYS))
    resources = {
        "warehouse": WarehouseResource(database_url=url),
        "landing": LandingResource(folder=str(crawl), settle_seconds=0),
        "ladder": LadderResource(chunk_size=7),
        "near_dup": NearDupResource(chunk_size=7),
        "seen_set": SeenSetResource(kind="redis"),
    }
    for key in KEYS:
        result = dg.materialize(ladder_assets, partition_key=key, instance=instance, resources=resources)
        assert result.success
        (exact,) = result.asset_materializations_for_node("deduplicated_records")
        assert exact.metadata["seen_set"].value == "redis" and exact.metadata["seen_set_fallbacks"].value > 0
    assert snapshot(Warehouse(url).engine) == expected
