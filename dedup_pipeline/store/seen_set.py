"""Seen-sets: a fast "maybe seen" answer in front of the warehouse's UNIQUE index.

A seen-set never decides anything on its own. A hit is confirmed against the
warehouse before a record counts as an exact duplicate, so a Bloom false
positive or a stale Redis key never drops a new record; a miss goes straight
to the insert, where the UNIQUE index catches a cold or flushed seen-set. When
the backend is down or times out, `maybe_seen` raises `SeenSetUnavailable`
and the exact rung carries on against the database alone (fails open).

Three implementations behind one interface:
- `RedisSeenSet`: one key per digest, written with SET NX EX (a TTL, so the set
  is never an unbounded store of identifiers); every call is one pipelined
  round trip for a whole chunk (one per node on a Redis Cluster); on a single
  Redis, a Redis Cluster or a master that Sentinel fails over (`redis_client`);
- `BloomSeenSet`: an in-process rbloom filter per hash version, sized from the
  expected count and false-positive rate, saved to a file between runs;
- `NoSeenSet`: every lookup goes to the database.
Keys and filters are per hash version: digests of different versions never meet.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence
from pathlib import Path

from dedup_pipeline import environment
from dedup_pipeline.environment import DEFAULT_BLOOM_CAPACITY, DEFAULT_BLOOM_ERROR_RATE, DEFAULT_REDIS_PREFIX

log = logging.getLogger(__name__)


class SeenSetUnavailable(RuntimeError):
    """The seen-set backend cannot answer now; use the database."""


class CircuitBreaker:
    """Calls to a Redis that fail open: after a failure, "unavailable" at once for `retry_after` seconds.

    A Redis that hangs costs one timeout, not one per call. `call` raises `SeenSetUnavailable` while the
    breaker is open and when the call fails (which opens it).
    """

    def __init__(self, retry_after: float = 15.0, open_now: bool = False) -> None:
        self.retry_after = retry_after
        self._errors = redis_errors()
        self._down_until = time.monotonic() + retry_after if open_now else 0.0

    @property
    def is_open(self) -> bool:
        return time.monotonic() < self._down_until

    def call(self, action):
        if self.is_open:
            raise SeenSetUnavailable("redis marked down after a recent failure")
        try:
            return action()
        except self._errors as exc:
            self._down_until = time.monotonic() + self.retry_after
            raise SeenSetUnavailable(f"redis: {type(exc).__name__}") from None


def fallback_warning(kind: str, chunks: int) -> str:
    """What an operator is told when `chunks` chunks of a batch ran without the seen-set."""
    return (
        f"seen-set {kind} unavailable for {chunks} chunk(s): they ran on the warehouse's UNIQUE index alone "
        "(slower, nothing lost)"
    )


class SeenSet:
    """The interface: `maybe_seen`, `remember`, `forget`, `flush`."""

    kind = "none"

    def maybe_seen(self, version: str, digests: Sequence[bytes]) -> list[bool]:
        """For each digest, whether it may have been stored already (never a definite yes)."""
        return [False] * len(digests)

    def remember(self, version: str, digests: Sequence[bytes]) -> None:
        """Note digests that are now stored in the warehouse."""

    def forget(self, version: str, digests: Sequence[bytes]) -> int:
        """Remove digests where the backend can (erasure); returns how many were removed."""
        return 0

    def flush(self) -> None:
        """Persist whatever the backend keeps in process (end of a batch)."""

    def fill(self, version: str) -> float | None:
        """How full a fixed-size backend is (1.0: at capacity); None for a backend that has no capacity."""
        return None


class NoSeenSet(SeenSet):
    """Every record is checked against the database."""


_SET_NX_EX = """
for _, key in ipairs(KEYS) do redis.call('SET', key, '1', 'NX', 'EX', ARGV[1]) end
return #KEYS
"""


def redis_errors() -> tuple[type[BaseException], ...]:
    """What redis-py raises when the server is down, slow or refuses: the seen-sets fail open on these."""
    import redis

    return redis.exceptions.RedisError, redis.exceptions.RedisClusterException, OSError


SENTINEL_SCHEME = "redis+sentinel://"


def redis_client(url: str, timeout: float = 1.0, detect: bool = True):
    """A redis-py client for `url`: a cluster client for a Redis Cluster node, else a plain one.

    The server is asked once (INFO cluster); `detect=False` skips that and gives
    a plain client. A cluster client sends each key to the node that holds its
    slot, so many keys still go out as one round trip per node. A
    `redis+sentinel://` URL gives a client of the master that Sentinel names,
    which follows a failover (`sentinel_client`). Raises what redis-py raises
    (`redis_errors`) when the server cannot be reached.
    """
    import redis
    from redis.cluster import RedisCluster

    options = {"socket_connect_timeout": timeout, "socket_timeout": timeout}
    if url.startswith(SENTINEL_SCHEME):
        return sentinel_client(url, options)
    client = redis.Redis.from_url(url, **options)
    if not detect or client.info("cluster").get("cluster_enabled") != 1:
        return client
    client.close()
    return RedisCluster.from_url(url, **options)


def connect_redis(url: str, timeout: float = 1.0) -> tuple[object, bool]:
    """`redis_client(url)`, failing open: (client, True); or, when Redis cannot be reached now, a plain
    client that serves once it answers, and False (a cluster is recognised at the next start; until then its
    nodes refuse other slots' keys, which the seen-sets treat as unavailable too)."""
    try:
        return redis_client(url, timeout), True
    except redis_errors() as exc:
        log.warning(
            "redis at %s not reached (%s): the seen-set is unavailable for now", url.split("@")[-1], type(exc).__name__
        )
        return redis_client(url, timeout, detect=False), False


def sentinel_client(url: str, options: dict):
    """The master of a Sentinel-monitored Redis, from `redis+sentinel://[[user]:password@]host[:port][,host[:port]...]/service[/db]`.

    The hosts are the Sentinels (port 26379 unless given); the password is the
    master's. The client asks the Sentinels for the master at connection time,
    so after a failover it reconnects to the new master.
    """
    from urllib.parse import unquote

    from redis.sentinel import Sentinel

    location, _, path = url.removeprefix(SENTINEL_SCHEME).partition("/")
    userinfo, _, hosts = location.rpartition("@")
    user, _, password = userinfo.partition(":")
    service, _, database = path.partition("/")
    sentinels = [_host_and_port(host, 26379) for host in hosts.split(",") if host]
    if not sentinels or not service or not (database or "0").isdigit():
        raise ValueError(f"expected {SENTINEL_SCHEME}host[:port][,host[:port]...]/service[/db], got {url!r}")
    return Sentinel(sentinels, sentinel_kwargs=options, **options).master_for(
        unquote(service),
        db=int(database or 0),
        username=unquote(user) or None,
        password=unquote(password) or None,
        **options,
    )


def _host_and_port(text: str, default_port: int) -> tuple[str, int]:
    """`host`, `host:port`, `[ipv6]` or `[ipv6]:port`."""
    host, colon, port = text.rpartition(":")
    if colon and port.isdigit() and (not host.startswith("[") or host.endswith("]")):
        return host.strip("[]"), int(port)
    return text.strip("[]"), default_port


class RedisSeenSet(SeenSet):
    """Digests as Redis keys with a TTL, shared by every worker; on a single Redis, a cluster or behind Sentinel."""

    kind = "redis"

    def __init__(
        self,
        url: str,
        ttl_seconds: int | None = None,
        timeout: float = 1.0,
        retry_after: float = 15.0,
        prefix: str = DEFAULT_REDIS_PREFIX,
    ):
        from redis.cluster import RedisCluster

        self.prefix = prefix
        self.ttl_seconds = environment.seen_ttl_seconds(ttl_seconds)
        self.client, reached = connect_redis(url, timeout)
        self._breaker = CircuitBreaker(retry_after, open_now=not reached)  # not reached: that was the one timeout
        self.cluster = isinstance(self.client, RedisCluster)
        self._set_nx_ex = self.client.register_script(_SET_NX_EX)

    def key(self, version: str, digest: bytes) -> str:
        return f"{self.prefix}:{version}:{digest.hex()}"

    def _call(self, action):
        return self._breaker.call(action)

    def maybe_seen(self, version: str, digests: Sequence[bytes]) -> list[bool]:
        if not digests:
            return []
        keys = [self.key(version, d) for d in digests]
        values = self._call(lambda: self.client.mget_nonatomic(keys) if self.cluster else self.client.mget(keys))
        return [value is not None for value in values]

    def remember(self, version: str, digests: Sequence[bytes]) -> None:
        """SET NX EX for every digest of a chunk: one Lua call (one round trip, one command), or on a cluster,
        whose script keys must share a slot, one pipeline per node."""
        if not digests:
            return
        keys = [self.key(version, d) for d in digests]
        self._call(
            lambda: self._set_nx_ex(keys=keys, args=[self.ttl_seconds]) if not self.cluster else self._set_each(keys)
        )

    def _set_each(self, keys: list[str]) -> None:
        pipe = self.client.pipeline(transaction=False)
        for key in keys:
            pipe.set(key, b"1", nx=True, ex=self.ttl_seconds)
        pipe.execute()

    def forget(self, version: str, digests: Sequence[bytes]) -> int:
        if not digests:
            return 0
        return int(self._call(lambda: self.client.delete(*[self.key(version, d) for d in digests])))


def _bloom_hash(item: bytes) -> int:
    # rbloom wants a signed 128-bit int; a SHA-256 digest is already uniformly random.
    return int.from_bytes(item[:16], "big", signed=True)


class BloomSeenSet(SeenSet):
    """An in-process Bloom filter per hash version, saved in `folder` between runs.

    Sized for `capacity` digests at `error_rate` false positives; the file name
    holds both, so a filter of another size starts empty beside the old file.
    Past its capacity (`fill` above 1) a filter still answers, with more false
    positives (each costs a lookup, never a record). It cannot forget
    (erasure relies on tombstones instead) and a digest stays in it until the
    file is deleted; it holds only bits, no identifiers.
    """

    kind = "bloom"

    def __init__(
        self, folder: Path, capacity: int = DEFAULT_BLOOM_CAPACITY, error_rate: float = DEFAULT_BLOOM_ERROR_RATE
    ):
        if capacity < 1:
            raise ValueError(f"bloom capacity must be at least 1 digest, not {capacity}")
        if not 0 < error_rate < 1:
            raise ValueError(f"bloom error rate must lie strictly between 0 and 1, not {error_rate}")
        self.folder, self.capacity, self.error_rate = Path(folder), capacity, error_rate
        self._filters: dict = {}
        self._added_to: set[str] = set()  # versions whose filter holds digests its file lacks

    def _path(self, version: str) -> Path:
        return self.folder / f"seen-{version.replace('/', '-')}-{self.capacity}-{self.error_rate}.bloom"

    def _filter(self, version: str):
        from rbloom import Bloom

        if version not in self._filters:
            path = self._path(version)
            self._filters[version] = (
                Bloom.load(str(path), _bloom_hash)
                if path.exists()
                else Bloom(self.capacity, self.error_rate, _bloom_hash)
            )
        return self._filters[version]

    def maybe_seen(self, version: str, digests: Sequence[bytes]) -> list[bool]:
        bloom = self._filter(version)
        return [digest in bloom for digest in digests]

    def remember(self, version: str, digests: Sequence[bytes]) -> None:
        if digests:
            self._filter(version).update(digests)
            self._added_to.add(version)

    def flush(self) -> None:
        """Merge with the file (another worker may have saved since we loaded) and replace it atomically.

        A filter nothing was added to since the last flush is left alone: its file has all it holds.
        """
        from rbloom import Bloom

        for version in sorted(self._added_to):
            bloom, path = self._filters[version], self._path(version)
            temporary = path.with_suffix(f".{os.getpid()}.tmp")
            try:
                self.folder.mkdir(parents=True, exist_ok=True)
                if path.exists():
                    bloom.update(Bloom.load(str(path), _bloom_hash))
                bloom.save(str(temporary))
                temporary.replace(path)
            except OSError as exc:  # a full or read-only disk: the filter stays as it was, the warehouse decides
                temporary.unlink(missing_ok=True)
                raise SeenSetUnavailable(f"bloom: cannot save {path.name}: {exc.strerror or exc}") from None
            self._added_to.discard(version)

    def fill(self, version: str) -> float | None:
        """About how many digests the version's filter holds, over its capacity.

        The estimate grows without bound as the last bits get set; it is capped
        at the filter's size in bits (by then nearly every lookup is a hit).
        """
        bloom = self._filter(version)
        return min(bloom.approx_items, bloom.size_in_bits) / self.capacity


def seen_set_from_env(
    kind: str = "auto",
    folder: Path | None = None,
    ttl_seconds: int | None = None,
    bloom_capacity: int | None = None,
    bloom_error_rate: float | None = None,
    redis_url: str | None = None,
) -> SeenSet:
    """The configured seen-set: Redis when a Redis URL is given or DEDUP_REDIS_URL is set, else a Bloom file in
    the data folder.

    `kind` forces one of "redis", "bloom", "none". Arguments left as None come
    from the environment (DEDUP_REDIS_URL, DEDUP_SEEN_TTL_SECONDS, DEDUP_BLOOM_CAPACITY,
    DEDUP_BLOOM_ERROR_RATE), else the defaults.
    """
    from dedup_pipeline.store.warehouse import data_dir

    url = redis_url or environment.redis_url()
    if kind == "auto":
        kind = "redis" if url else "bloom"
    if kind == "redis":
        if not url:
            raise ValueError(f"seen-set 'redis' needs {environment.REDIS_URL_ENV}")
        return RedisSeenSet(url, ttl_seconds, prefix=environment.redis_prefix())
    if kind == "bloom":
        if bloom_capacity is None:
            bloom_capacity = environment.bloom_capacity()
        if bloom_error_rate is None:
            bloom_error_rate = environment.bloom_error_rate()
        return BloomSeenSet(folder or data_dir() / "seen-sets", bloom_capacity, bloom_error_rate)
    if kind == "none":
        return NoSeenSet()
    raise ValueError(f"unknown seen-set kind {kind!r}: use auto, redis, bloom or none")
