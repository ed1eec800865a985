"""Seen-sets against the real Redis, and the exact rung failing open when they are wrong or gone."""

from __future__ import annotations

import hashlib
import math
import uuid

import pytest
import redis

from dedup_pipeline.ladder.canonical import canonicalise_batch
from dedup_pipeline.ladder.exact import deduplicate_batch
from dedup_pipeline.ladder.raw import ingest_raw_batch
from dedup_pipeline.ladder.settings import LadderSettings
from dedup_pipeline.landing import find_batch
from dedup_pipeline.store.seen_set import BloomSeenSet, NoSeenSet, RedisSeenSet, SeenSetUnavailable
from dedup_pipeline_tests.helpers import listing, new_run_id, snapshot, write_batch

REDIS_URL = "redis://127.0.0.1:6379/0"
DEAD_REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens there: a stopped Redis


def digests(n, salt=""):
    return [hashlib.sha256(f"{salt}{i}".encode()).digest() for i in range(n)]


def clear(seen: RedisSeenSet) -> None:
    """Flush this test's key space (never the whole Redis: other tests share it)."""
    keys = list(seen.client.scan_iter(f"{seen.prefix}:*"))
    if keys:
        seen.client.delete(*keys)


@pytest.fixture
def redis_seen_set():
    seen = RedisSeenSet(REDIS_URL, ttl_seconds=120, prefix=f"test:{uuid.uuid4().hex}")  # a private key space
    yield seen, "content/1"
    clear(seen)


def test_redis_remembers_with_a_ttl(redis_seen_set):
    seen, version = redis_seen_set
    known, unknown = digests(5), digests(5, "other")
    assert seen.maybe_seen(version, known) == [False] * 5
    seen.remember(version, known)
    assert seen.maybe_seen(version, known + unknown) == [True] * 5 + [False] * 5
    ttl = seen.client.ttl(seen.key(version, known[0]))
    assert 0 < ttl <= 120
    assert seen.maybe_seen("another/version", known) == [False] * 5  # versions never meet
    assert seen.forget(version, known[:2]) == 2
    assert seen.maybe_seen(version, known) == [False, False, True, True, True]


def round_trips(client, monkeypatch) -> list[bytes]:
    """What `client` sends from now on, one entry per round trip (a pipeline or a script call is one).

    Counted on the client's own connections, not from the server's statistics: the Redis is shared, and
    another test worker's commands must not count.
    """
    pool, own, sent = client.connection_pool, set(), []
    get_connection, send = pool.get_connection, redis.connection.AbstractConnection.send_packed_command

    def own_connection(*args, **kwargs):
        connection = get_connection(*args, **kwargs)
        own.add(id(connection))
        return connection

    def counted(self, command, check_health=True):
        if id(self) in own:
            sent.append(command)
        return send(self, command, check_health)

    monkeypatch.setattr(pool, "get_connection", own_connection)
    monkeypatch.setattr(redis.connection.AbstractConnection, "send_packed_command", counted)
    return sent


def test_redis_round_trips_are_per_chunk_not_per_record(redis_seen_set, monkeypatch):
    seen, version = redis_seen_set
    sent = round_trips(seen.client, monkeypatch)
    seen.remember(version, digests(500))
    remembered = len(sent)
    seen.maybe_seen(version, digests(500))
    # One script call SETs the chunk's 500 keys (three round trips when the server must first be sent the
    # script), one MGET reads them: nothing like a round trip per record.
    assert 1 <= remembered <= 3 and len(sent) - remembered == 1


def test_a_stopped_redis_is_unavailable_quickly_and_stays_marked_down():
    seen = RedisSeenSet(DEAD_REDIS_URL, timeout=0.2, retry_after=60)
    with pytest.raises(SeenSetUnavailable):
        seen.maybe_seen("content/1", digests(3))
    with pytest.raises(SeenSetUnavailable, match="marked down"):
        seen.remember("content/1", digests(3))


def test_bloom_persists_between_runs(tmp_path):
    first = BloomSeenSet(tmp_path, capacity=1000, error_rate=0.001)
    first.remember("content/1", digests(100))
    first.flush()
    second = BloomSeenSet(tmp_path, capacity=1000, error_rate=0.001)
    assert all(second.maybe_seen("content/1", digests(100)))
    assert sum(second.maybe_seen("content/1", digests(1000, "new"))) < 10
    assert not any(second.maybe_seen("content/2", digests(100)))


def test_bloom_is_sized_from_the_resource_or_the_environment(tmp_path, monkeypatch):
    from dedup_pipeline.defs.resources import SeenSetResource

    monkeypatch.setenv("DEDUP_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("DEDUP_BLOOM_CAPACITY", "5000")
    from_env = SeenSetResource(kind="bloom").get()
    assert (from_env.capacity, from_env.error_rate) == (5000, 0.001)
    configured = SeenSetResource(kind="bloom", bloom_capacity=20_000, bloom_error_rate=0.01).get()
    assert (configured.capacity, configured.error_rate) == (20_000, 0.01)
    configured.remember("content/1", digests(10))
    configured.flush()
    assert [p.name for p in (tmp_path / "seen-sets").iterdir()] == ["seen-content-1-20000-0.01.bloom"]
    with pytest.raises(ValueError, match="capacity"):
        SeenSetResource(kind="bloom", bloom_capacity=0).get()
    with pytest.raises(ValueError, match="error rate"):
        SeenSetResource(kind="bloom", bloom_error_rate=1.5).get()


def run(warehouse, folder, key, seen_set, chunk=50):
    ingest_raw_batch(warehouse, find_batch(folder, key))
    canonicalise_batch(warehouse, key, LadderSettings(chunk_size=chunk))
    return deduplicate_batch(warehouse, key, new_run_id(key), LadderSettings(chunk_size=chunk), seen_set)


@pytest.fixture
def batches(tmp_path):
    folder = tmp_path / "landing"
    write_batch(folder, "a", [listing(n) for n in range(200)], landed=1e9)
    write_batch(folder, "b", [listing(n, crawl_id="2") for n in range(100, 300)], landed=1e9 + 60)
    return folder


def _baseline(tmp_path, batches):
    from dedup_pipeline.store.warehouse import Warehouse

    wh = Warehouse(f"sqlite:///{tmp_path / 'baseline.sqlite'}").create_schema()
    for key in ("a", "b"):
        run(wh, batches, key, NoSeenSet())
    return snapshot(wh.engine)


def test_warm_redis_fast_path_gives_the_same_tables(warehouse, batches, tmp_path, redis_seen_set):
    seen, _ = redis_seen_set
    run(warehouse, batches, "a", seen)
    report = run(warehouse, batches, "b", seen)
    assert report.seen_set == "redis" and report.seen_set_hits == 100 and report.seen_set_fallbacks == 0
    assert report.decisions["exact_duplicate"] == 100 and report.decisions["new"] == 100
    assert snapshot(warehouse.engine) == _baseline(tmp_path, batches)


def test_flushed_redis_is_caught_by_the_unique_index(warehouse, batches, tmp_path, redis_seen_set):
    seen, _ = redis_seen_set
    run(warehouse, batches, "a", seen)
    clear(seen)  # every key gone between runs, as after FLUSHDB
    report = run(warehouse, batches, "b", seen)
    assert report.decisions["exact_duplicate"] == 100 and report.decisions["new"] == 100
    assert snapshot(warehouse.engine) == _baseline(tmp_path, batches)


def test_dead_redis_fails_open_to_the_warehouse(warehouse, batches, tmp_path):
    seen = RedisSeenSet(DEAD_REDIS_URL, timeout=0.2)
    run(warehouse, batches, "a", seen)
    report = run(warehouse, batches, "b", seen)
    assert report.seen_set_fallbacks == 4  # every chunk said so, once (its probe and its remember both failed)
    assert report.decisions["exact_duplicate"] == 100 and report.decisions["new"] == 100
    assert snapshot(warehouse.engine) == _baseline(tmp_path, batches)


def test_a_hung_redis_costs_one_timeout_then_the_rung_runs_on_the_warehouse(
    warehouse, batches, tmp_path, hung_redis_url
):
    url, connections = hung_redis_url
    seen = RedisSeenSet(url, timeout=0.3, retry_after=60)
    run(warehouse, batches, "a", seen)
    report = run(warehouse, batches, "b", seen)
    assert report.seen_set_fallbacks >= 4  # every chunk said so
    assert len(connections) == 1  # one timeout was paid; the breaker answered every later chunk at once
    assert report.decisions["exact_duplicate"] == 100 and report.decisions["new"] == 100
    assert snapshot(warehouse.engine) == _baseline(tmp_path, batches)


def test_a_bloom_file_is_written_only_when_digests_were_added(tmp_path):
    first = BloomSeenSet(tmp_path, capacity=1000, error_rate=0.01)
    first.maybe_seen("content/1", digests(10))
    first.remember("content/1", [])
    first.flush()
    assert not list(tmp_path.iterdir())  # nothing to keep
    first.remember("content/1", digests(10))
    first.flush()
    [saved] = tmp_path.iterdir()
    written = saved.stat().st_ino  # every save renames a new file into place
    again = BloomSeenSet(tmp_path, capacity=1000, error_rate=0.01)
    assert all(again.maybe_seen("content/1", digests(10)))  # a batch of re-crawls only looks
    again.flush()
    assert saved.stat().st_ino == written
    again.remember("content/1", digests(5, "new"))
    again.flush()
    assert saved.stat().st_ino != written
    assert all(BloomSeenSet(tmp_path, capacity=1000, error_rate=0.01).maybe_seen("content/1", digests(5, "new")))


def test_bloom_fill_is_its_digests_over_its_capacity(tmp_path):
    seen = BloomSeenSet(tmp_path, capacity=1000, error_rate=0.01)
    seen.remember("content/1", digests(500))
    assert 0.45 < seen.fill("content/1") < 0.55
    seen.remember("content/1", digests(1000, "more"))
    assert seen.fill("content/1") > 1.3
    assert seen.fill("content/2") == 0
    assert NoSeenSet().fill("content/1") is None
    full = BloomSeenSet(tmp_path / "full", capacity=10, error_rate=0.5)
    full.remember("content/1", digests(1000))  # every bit set: the estimate itself would be infinite
    assert 1 < full.fill("content/1") < math.inf


def test_the_rung_reports_the_bloom_fill_and_warns_past_capacity(warehouse, batches, tmp_path, caplog):
    roomy = run(warehouse, batches, "a", BloomSeenSet(tmp_path / "roomy", capacity=10_000, error_rate=0.01))
    assert 0.015 < roomy.as_metadata()["seen_set_fill"] < 0.025  # 200 digests of 10,000
    assert roomy.seen_set_over_capacity is None
    with caplog.at_level("WARNING", logger="dedup_pipeline.ladder.exact"):
        small = run(warehouse, batches, "b", BloomSeenSet(tmp_path / "small", capacity=150, error_rate=0.01))
    assert small.seen_set_fill > 1  # 100 new and 100 re-crawled digests in a filter sized for 150
    assert "raise bloom_capacity" in small.seen_set_over_capacity and small.seen_set_over_capacity in caplog.text
    assert small.decisions["new"] == 100


class RecordingBloom(BloomSeenSet):
    """A Bloom seen-set that notes every digest the rung asks it to remember."""

    def __init__(self, folder):
        super().__init__(folder, capacity=10_000, error_rate=0.001)
        self.remembered: list[bytes] = []

    def remember(self, version, digests):
        self.remembered += digests
        super().remember(version, digests)


def test_only_digests_the_seen_set_lacks_are_remembered(warehouse, batches, tmp_path):
    seen = RecordingBloom(tmp_path / "bloom")
    run(warehouse, batches, "a", seen)
    assert len(seen.remembered) == len(set(seen.remembered)) == 200
    seen.remembered.clear()
    report = run(warehouse, batches, "b", seen)  # 100 re-crawls of batch a, 100 new listings
    assert report.seen_set_hits == 100
    assert len(seen.remembered) == 100  # the new ones; adding the hits again would change nothing
    assert all(seen.maybe_seen("content/1", seen.remembered))


def test_bloom_false_positives_never_drop_a_new_record(warehouse, batches, tmp_path):
    # A filter far too small: most lookups come back "maybe seen".
    seen = BloomSeenSet(tmp_path / "bloom", capacity=10, error_rate=0.5)
    run(warehouse, batches, "a", seen)
    report = run(warehouse, batches, "b", seen)
    assert report.seen_set_false_positives > 0
    assert report.decisions["new"] == 100
    assert snapshot(warehouse.engine) == _baseline(tmp_path, batches)
