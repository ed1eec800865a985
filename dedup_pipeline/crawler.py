"""Fetch-time URL dedup for crawlers: the seeds' `first_time_seen`, on the pipeline's own URL rules (`url/2`).

A crawler calls this before fetching, so the cheapest duplicate (the page never
fetched) is removed first. It uses the same canonicaliser as the pipeline, so
crawler and warehouse agree on URL identity, and a Redis key per canonical URL
with a TTL (SET NX EX: atomic check-and-set, shared by every worker, never an
unbounded store). Keys hold a SHA-256 of the canonical URL, not the URL.

It fails open, to the process's own memory: while Redis is down (or hangs:
after one timeout it is left alone for 15 s), a URL counts as first seen once
per process, as Scrapy's own in-memory filter would count it, so a crawl never
loops on its links; a warning is logged once per outage. When Redis answers
again, the URLs seen meanwhile are written to it and the memory is emptied.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections.abc import Iterable
from functools import lru_cache

from dedup_pipeline import environment
from dedup_pipeline.core.url import URL_VERSION, canonical_url
from dedup_pipeline.store.seen_set import CircuitBreaker, SeenSetUnavailable, connect_redis

log = logging.getLogger(__name__)


# HSETNX, and a TTL on the hash if it has none yet (EXPIRE ... NX needs Redis 7; this runs on any).
_ADD_REQUEST = """
local added = redis.call('HSETNX', KEYS[1], ARGV[1], '1')
if added == 1 and redis.call('TTL', KEYS[1]) < 0 then redis.call('EXPIRE', KEYS[1], ARGV[2]) end
return added
"""


def _requests_of(url_key: str) -> str:
    """The key of the hash holding a URL's requests other than a plain GET, beside the URL's own key."""
    return f"{url_key}:requests"


class UrlSeenSet:
    """Canonical URLs seen by a crawl fleet, in Redis with a TTL."""

    def __init__(
        self,
        redis_url: str | None = None,
        ttl_seconds: int | None = None,
        prefix: str | None = None,
        client=None,
        retry_after: float = 15.0,
    ):
        url = redis_url or environment.redis_url() or "redis://127.0.0.1:6379/0"
        self.ttl_seconds = environment.seen_ttl_seconds(ttl_seconds)
        self.prefix = prefix or environment.url_prefix()
        # A single Redis, a cluster or behind Sentinel; unreachable, the process's memory answers until it does.
        self.client, reached = (client, True) if client is not None else connect_redis(url)
        self._breaker = CircuitBreaker(retry_after, open_now=not reached)
        self._add_request = self.client.register_script(_ADD_REQUEST)
        # What this process saw while Redis could not answer: (key, request field or "") pairs; one lock, as a
        # crawler's threads share the seen-set.
        self._meanwhile: set[tuple[str, str]] = set()
        self._lock = threading.Lock()

    def _while_down(self, items: list[tuple[str, str]], reason: str) -> list[bool]:
        """First seen, from this process's memory, for items Redis could not answer for."""
        with self._lock:
            if not self._meanwhile:
                log.warning(
                    "URL seen-set unavailable (%s): this process remembers the URLs it sees until Redis answers", reason
                )
            answers = []
            for item in items:
                answers.append(item not in self._meanwhile)
                self._meanwhile.add(item)
        return answers

    def _catch_up(self) -> None:
        """Redis answers again: write what was seen meanwhile to it (SET NX / HSETNX), then forget it here."""
        with self._lock:
            items = list(self._meanwhile)
        pipe = self.client.pipeline(transaction=False)
        for key, field in items:
            if field:
                self._add_request(keys=[key], args=[field, self.ttl_seconds], client=pipe)
            else:
                pipe.set(key, b"1", nx=True, ex=self.ttl_seconds)
        pipe.execute()
        with self._lock:
            self._meanwhile.difference_update(items)
        log.warning("URL seen-set available again: %d URL(s) seen meanwhile written to it", len(items))

    def _ask(self, items: list[tuple[str, str]], ask) -> list[bool]:
        """`ask()` Redis for `items`, through the breaker; the process's memory answers while it cannot."""
        try:
            if self._meanwhile:
                self._breaker.call(self._catch_up)
            return self._breaker.call(ask)
        except SeenSetUnavailable as exc:
            return self._while_down(items, str(exc))

    def key(self, url: str) -> str:
        """The key of a URL: a digest of its canonical form (`URL_VERSION`, no userinfo; never the URL itself)."""
        digest = hashlib.sha256(canonical_url(url).encode("utf-8", "surrogatepass")).hexdigest()
        return f"{self.prefix}:{URL_VERSION}:{digest}"

    def first_time_seen_request(self, method: str, url: str, body: bytes = b"") -> bool:
        """`first_time_seen` for a request: a GET without a body is its URL.

        Any other request (a form POST, a body) is told apart by its method and
        body as well, so two different posts to one address are two requests.
        They are fields of one Redis hash beside the URL's key (a digest of
        method and body each), so forgetting the URL forgets them too; the
        hash expires one TTL after its first request.
        """
        method = method.upper()
        if method == "GET" and not body:
            return self.first_time_seen(url)
        field = hashlib.sha256(method.encode() + b"\0" + body).hexdigest()
        key = _requests_of(self.key(url))
        return self._ask([(key, field)], lambda: [bool(self._add_request(keys=[key], args=[field, self.ttl_seconds]))])[
            0
        ]

    def first_time_seen_many(self, urls: Iterable[str]) -> list[bool]:
        """For each URL, True only on its first sighting within the TTL; one round trip for all of them.

        A URL repeated within `urls` is first seen once (its first occurrence).
        """
        keys = [self.key(url) for url in urls]

        def ask() -> list[bool]:
            pipe = self.client.pipeline(transaction=False)
            for key in keys:
                pipe.set(key, b"1", nx=True, ex=self.ttl_seconds)
            return [bool(added) for added in pipe.execute()]

        return self._ask([(key, "") for key in keys], ask) if keys else []

    def first_time_seen(self, url: str) -> bool:
        """Atomic check-and-set: True only on the first sighting of this canonical URL within the TTL."""
        return self.first_time_seen_many([url])[0]

    def forget(self, urls: Iterable[str]) -> int:
        """Drop URLs and their other requests (an erasure request, or a forced re-crawl); returns the keys removed.

        Raises `SeenSetUnavailable` when Redis cannot answer (at once while the breaker is open): the caller
        reports what is left to expire.
        """
        keys = [key for url_key in map(self.key, urls) for key in (url_key, _requests_of(url_key))]
        dropped = set(keys)
        with self._lock:
            self._meanwhile = {item for item in self._meanwhile if item[0] not in dropped}
        return int(self._breaker.call(lambda: self.client.delete(*keys))) if keys else 0


@lru_cache(maxsize=4)
def _default(redis_url: str | None, ttl_seconds: int | None) -> UrlSeenSet:
    return UrlSeenSet(redis_url, ttl_seconds)


def first_time_seen(url: str, *, redis_url: str | None = None, ttl_seconds: int | None = None) -> bool:
    """True only the first time any worker asks about this URL (in its `url/2` form) within the TTL.

    Uses $DEDUP_REDIS_URL (else Redis on 127.0.0.1), $DEDUP_SEEN_TTL_SECONDS (else 30 days) and
    $DEDUP_URL_PREFIX (else ``dedup:url``).
    """
    return _default(redis_url, ttl_seconds).first_time_seen(url)


class RedisUrlDupeFilter:
    """A Scrapy dupefilter on the shared URL seen-set (set DUPEFILTER_CLASS to this class's path).

    Scrapy settings: DEDUP_REDIS_URL, DEDUP_SEEN_TTL_SECONDS, DEDUP_URL_PREFIX (each
    falls back to the environment variable of the same name), DUPEFILTER_DEBUG.
    A GET request is a duplicate when its URL, in canonical `url/2` form, was seen by any
    crawler of the fleet (or by `first_time_seen`) within the TTL; any other
    request (a POST, a body) when the same method, URL and body were. Requests
    with `dont_filter=True` (Scrapy's start URLs, by default) never reach a
    dupefilter, as with Scrapy's own. Filtered requests are counted in the
    crawl stats as `dupefilter/filtered`, as Scrapy's own filter counts them.
    """

    def __init__(self, seen: UrlSeenSet, debug: bool = False):
        self.seen, self.debug = seen, debug
        self._logged_once = False

    @classmethod
    def from_crawler(cls, crawler) -> RedisUrlDupeFilter:
        settings = crawler.settings
        seen = UrlSeenSet(
            settings.get("DEDUP_REDIS_URL"), settings.get("DEDUP_SEEN_TTL_SECONDS"), settings.get("DEDUP_URL_PREFIX")
        )
        return cls(seen, settings.getbool("DUPEFILTER_DEBUG"))

    def request_seen(self, request) -> bool:
        return not self.seen.first_time_seen_request(request.method, request.url, request.body or b"")

    def open(self) -> None:
        pass

    def close(self, reason: str) -> None:
        self.seen.client.close()

    def log(self, request, spider) -> None:
        """Called by Scrapy's scheduler for each request it drops as a duplicate."""
        if self.debug or not self._logged_once:
            more = "" if self.debug else " - no more duplicates will be shown (see DUPEFILTER_DEBUG to show all)"
            log.debug("Filtered duplicate request (URL seen-set): %s%s", request, more)
            self._logged_once = True
        spider.crawler.stats.inc_value("dupefilter/filtered")
