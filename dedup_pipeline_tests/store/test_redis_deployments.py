"""The seen-sets on the Redis deployments of production: a Redis Cluster and a Sentinel-monitored master.

Cluster: three local nodes, keys spread over every slot range. A plain
client's MGET or a multi-key script over a chunk's digests fails on a cluster
(the keys hash to many slots), which the exact rung would survive by falling
back at every chunk: correct, and never fast. The seen-sets recognise a
cluster node and use a cluster client instead.

Sentinel: a master, its replica and a Sentinel; a `redis+sentinel://` URL
follows the master through a failover.
"""

from __future__ import annotations

import random
import shutil
import socket
import subprocess
import time
import uuid

import pytest
import redis

from dedup_pipeline.crawler import UrlSeenSet
from dedup_pipeline.store.seen_set import RedisSeenSet, SeenSetUnavailable, sentinel_client
from dedup_pipeline_tests.helpers import snapshot
from dedup_pipeline_tests.store.test_seen_set import _baseline, batches, clear, digests, run  # noqa: F401 (fixture)

pytestmark = pytest.mark.skipif(
    not shutil.which("redis-server") or not shutil.which("redis-cli"),
    reason="needs redis-server and redis-cli to start a local cluster",
)


def _free(port: int) -> bool:
    """Whether a server could listen on `port`: bound by nothing, the local end of a client's connection included
    (which a connect probe does not see)."""
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def _free_ports(count: int) -> list[int]:
    """`count` ports whose cluster-bus ports (port + 10000) are free too, all below Linux's ephemeral range
    (32768 and up), where the local ends of client connections come and go between the probe and the start."""
    while True:
        base = random.randrange(20_000, 22_700 - count)
        ports = list(range(base, base + count))
        if all(_free(p) and _free(p + 10_000) for p in ports):
            return ports


def _redis_server(folder, port: int, *options: str, sentinel_config=None) -> subprocess.Popen:
    """A throw-away redis-server (or, given its config file, a Sentinel) on 127.0.0.1:`port`, a child process."""
    command = (
        ["redis-server", str(sentinel_config), "--sentinel"] if sentinel_config else ["redis-server", "--save", ""]
    )
    return subprocess.Popen(
        [
            *command,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(folder),
            "--logfile",
            str(folder / f"{port}.log"),
            *options,
        ]
    )


def _stop(servers) -> None:
    for server in servers:
        server.terminate()
    for server in servers:
        server.wait(timeout=30)


@pytest.fixture(scope="module")
def cluster_url(tmp_path_factory):
    folder = tmp_path_factory.mktemp("redis-cluster")
    ports = _free_ports(3)
    servers = [
        _redis_server(folder, port, "--cluster-enabled", "yes", "--cluster-config-file", f"nodes-{port}.conf")
        for port in ports
    ]
    try:
        for port in ports:
            _wait(lambda port=port: redis.Redis(port=port).ping())
        subprocess.run(
            [
                "redis-cli",
                "--cluster",
                "create",
                *(f"127.0.0.1:{p}" for p in ports),
                "--cluster-replicas",
                "0",
                "--cluster-yes",
            ],
            check=True,
            capture_output=True,
        )
        _wait(lambda: all(redis.Redis(port=p).execute_command("CLUSTER INFO")["cluster_state"] == "ok" for p in ports))
        yield f"redis://127.0.0.1:{ports[0]}/0", ports
    finally:
        _stop(servers)


def _wait(ready, seconds: float = 15.0) -> None:
    deadline = time.monotonic() + seconds
    while True:
        try:
            if ready():
                return
        except redis.exceptions.RedisError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError("the local Redis Cluster did not come up")
        time.sleep(0.1)


@pytest.fixture
def cluster_seen_set(cluster_url):
    seen = RedisSeenSet(cluster_url[0], ttl_seconds=120, prefix=f"test:{uuid.uuid4().hex}")
    yield seen
    clear(seen)


def test_the_content_seen_set_spreads_a_chunk_over_every_node(cluster_seen_set, cluster_url):
    seen = cluster_seen_set
    assert seen.cluster
    known, unknown = digests(3000), digests(1000, "other")
    seen.remember("content/1", known)
    assert (
        seen.maybe_seen("content/1", unknown[:500] + known + unknown[500:])
        == [False] * 500 + [True] * 3000 + [False] * 500
    )
    assert all(redis.Redis(port=port).dbsize() > 500 for port in cluster_url[1])  # every node holds its share
    assert 0 < seen.client.ttl(seen.key("content/1", known[0])) <= 120
    assert seen.forget("content/1", known[:1000]) == 1000
    assert seen.maybe_seen("content/1", known[:1000]) == [False] * 1000


def test_the_exact_rung_uses_a_cluster_without_falling_back(warehouse, batches, tmp_path, cluster_seen_set):  # noqa: F811
    run(warehouse, batches, "a", cluster_seen_set)
    report = run(warehouse, batches, "b", cluster_seen_set)
    assert report.seen_set_fallbacks == 0 and report.seen_set_hits == 100
    assert report.decisions["exact_duplicate"] == 100 and report.decisions["new"] == 100
    assert snapshot(warehouse.engine) == _baseline(tmp_path, batches)


def test_a_plain_client_on_a_cluster_would_fall_back_at_every_chunk(cluster_url):
    """Why the cluster client: a chunk's keys hash to many slots, which a node refuses."""
    plain = redis.Redis.from_url(cluster_url[0])
    with pytest.raises(redis.exceptions.ResponseError, match="same slot|MOVED"):
        plain.mget([f"test:{n}" for n in range(100)])


def test_the_url_seen_set_on_a_cluster(cluster_url):
    seen = UrlSeenSet(cluster_url[0], ttl_seconds=120, prefix=f"test:{uuid.uuid4().hex}")
    urls = [f"https://shop.example.com/p/{n}?utm_source=x" for n in range(200)]
    assert seen.first_time_seen_many(urls) == [True] * 200
    assert seen.first_time_seen_many([u.replace("?utm_source=x", "") for u in urls]) == [False] * 200
    assert seen.first_time_seen_request("POST", urls[0], b"q=1") and not seen.first_time_seen_request(
        "POST", urls[0], b"q=1"
    )
    assert seen.forget(urls) == 201  # each URL's key, and the one URL's request hash
    assert seen.first_time_seen(urls[0])


SERVICE = "seen-set-master"


@pytest.fixture(scope="module")
def sentinel(tmp_path_factory):
    """A master, its replica and a Sentinel watching them: (seen-set URL, processes, master/replica/Sentinel ports)."""
    folder = tmp_path_factory.mktemp("redis-sentinel")
    master, replica, watcher = _free_ports(3)
    config = folder / "sentinel.conf"  # Sentinel rewrites its own config file
    config.write_text(
        f"sentinel monitor {SERVICE} 127.0.0.1 {master} 1\n"
        f"sentinel down-after-milliseconds {SERVICE} 1000\nsentinel failover-timeout {SERVICE} 5000\n"
    )
    servers = [_redis_server(folder, master), _redis_server(folder, replica, "--replicaof", "127.0.0.1", str(master))]
    try:
        # The Sentinel starts once the replica is in sync, so that its first look at the master finds the replica
        # (it looks again only every 10 s).
        _wait(lambda: redis.Redis(port=replica).info("replication")["master_link_status"] == "up")
        servers.append(_redis_server(folder, watcher, sentinel_config=config))
        probe = redis.Redis(port=watcher)
        _wait(
            lambda: any(
                int(r["port"]) == replica and r.get("master-link-status") == "ok"
                for r in probe.sentinel_slaves(SERVICE)
            )
        )
        yield f"redis+sentinel://127.0.0.1:{watcher}/{SERVICE}", servers, master, replica, watcher
    finally:
        _stop(servers)


def _master_port(watcher: int) -> int:
    return int(redis.Redis(port=watcher).sentinel_get_master_addr_by_name(SERVICE)[1])


def test_the_seen_sets_follow_the_master_when_it_dies_and_sentinel_fails_over(sentinel):
    url, servers, master, replica, watcher = sentinel
    seen = RedisSeenSet(url, ttl_seconds=120, retry_after=0.2, prefix=f"test:{uuid.uuid4().hex}")
    urls = UrlSeenSet(url, ttl_seconds=120, prefix=f"test:{uuid.uuid4().hex}")
    before, after = digests(300), digests(300, "after")
    seen.remember("content/1", before)
    assert urls.first_time_seen("https://shop.example.com/p/1")
    assert redis.Redis(port=master).exists(seen.key("content/1", before[0])) == 1  # written on the master
    assert redis.Redis(port=master).wait(1, 5000) == 1  # and replicated

    servers[0].kill()  # the master dies
    servers[0].wait()
    _wait(lambda: _master_port(watcher) == replica)
    # Chunks fall back while the master is gone; then the client asks the Sentinel again and writes to the new one.
    _wait(lambda: _remembered(seen, after))
    assert redis.Redis(port=replica).exists(seen.key("content/1", after[0])) == 1
    assert seen.maybe_seen("content/1", before) == [True] * 300
    assert not urls.first_time_seen("https://shop.example.com/p/1?utm_source=x")


def _remembered(seen: RedisSeenSet, found: list[bytes]) -> bool:
    try:
        seen.remember("content/1", found)
        return all(seen.maybe_seen("content/1", found))
    except SeenSetUnavailable:
        return False


def test_a_sentinel_url_is_parsed_or_refused():
    client = sentinel_client("redis+sentinel://user:p%40ss@one:26380,[::1],three/my-master/2", {"socket_timeout": 1})
    pool = client.connection_pool
    assert (pool.service_name, pool.connection_kwargs["db"], pool.connection_kwargs["password"]) == (
        "my-master",
        2,
        "p@ss",
    )
    assert [
        (s.connection_pool.connection_kwargs["host"], s.connection_pool.connection_kwargs["port"])
        for s in pool.sentinel_manager.sentinels
    ] == [("one", 26380), ("::1", 26379), ("three", 26379)]
    for bad in ("redis+sentinel://one/", "redis+sentinel:///my-master", "redis+sentinel://one/my-master/x"):
        with pytest.raises(ValueError, match="expected redis\\+sentinel://"):
            sentinel_client(bad, {})
