"""Fetch-time URL dedup against the real Redis."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from dedup_pipeline import first_time_seen
from dedup_pipeline.core.url import canonical_url
from dedup_pipeline.crawler import UrlSeenSet
from dedup_pipeline.crawler import _default as default_seen_set


@pytest.fixture
def seen():
    urls = UrlSeenSet("redis://127.0.0.1:6379/0", ttl_seconds=60, prefix=f"test-url:{uuid.uuid4().hex}")
    yield urls
    keys = list(urls.client.scan_iter(f"{urls.prefix}:*"))
    if keys:
        urls.client.delete(*keys)


def test_first_sighting_only_and_url_variants_agree(seen):
    assert seen.first_time_seen("https://Shop.example.com/p/1?utm_source=mail&b=2&a=1#reviews")
    assert not seen.first_time_seen("https://shop.example.com:443/p/1?a=1&b=2")
    assert seen.first_time_seen("https://shop.example.com/P/1")  # path case is identity


def test_batched_with_a_ttl_and_forgettable(seen):
    urls = [f"https://a.example/{n}" for n in range(50)]
    assert seen.first_time_seen_many(urls + urls[:5]) == [True] * 50 + [False] * 5
    assert 0 < seen.client.ttl(seen.key(urls[0])) <= 60
    assert not any(seen.first_time_seen_many(urls))
    assert seen.forget(urls[:3]) == 3
    assert seen.first_time_seen_many(urls[:4]) == [True, True, True, False]
    assert "a.example" not in seen.key(urls[0])  # keys hold a digest, not the URL


def test_fails_open_to_the_process_memory_when_redis_is_down():
    """Redis down: each URL is first seen once per process (a crawl never loops on its links), never "seen"."""
    dead = UrlSeenSet("redis://127.0.0.1:1/0")
    assert dead.first_time_seen_many(["https://a.example/1", "https://A.example/1?utm_source=x"]) == [True, False]
    assert not dead.first_time_seen("https://a.example/1") and dead.first_time_seen("https://a.example/2")


def test_a_hung_redis_costs_one_timeout(hung_redis_url):
    """A Redis that accepts connections and never answers: one timeout, then the breaker answers at once."""
    url, connections = hung_redis_url
    seen = UrlSeenSet(url, retry_after=60)
    assert [seen.first_time_seen(f"https://a.example/{n}") for n in range(5)] == [True] * 5
    assert len(connections) == 1


def test_urls_seen_while_redis_was_down_are_written_to_it_when_it_answers(tmp_path):
    from dedup_pipeline_tests.reliability.redis_server import PrivateRedis

    server = PrivateRedis(tmp_path / "redis").start()
    try:
        seen = UrlSeenSet(server.url, retry_after=0, prefix="outage")
        assert seen.first_time_seen("https://a.example/before")
        server.kill()
        assert seen.first_time_seen("https://a.example/during")
        assert seen.first_time_seen_request("POST", "https://a.example/form", b"q=1")
        server.restart()  # an empty server: what was written before the outage is gone with it
        assert not seen.first_time_seen("https://a.example/during")  # remembered, then written to Redis
        assert not seen.first_time_seen_request("POST", "https://a.example/form", b"q=1")
        fresh = UrlSeenSet(server.url, prefix="outage")  # another process of the fleet
        assert fresh.first_time_seen_many(["https://a.example/during", "https://a.example/after"]) == [False, True]
        assert not fresh.first_time_seen_request("POST", "https://a.example/form", b"q=1")
    finally:
        server.kill()


def test_a_ttl_under_one_second_is_refused(monkeypatch):
    """Redis refuses `EX 0`: a zero TTL would make every URL look new; it is a configuration error instead."""
    from dedup_pipeline.core.errors import ConfigurationError

    for ttl in (0, -5):
        with pytest.raises(ConfigurationError, match="at least 1"):
            UrlSeenSet("redis://127.0.0.1:6379/0", ttl_seconds=ttl)
    monkeypatch.setenv("DEDUP_SEEN_TTL_SECONDS", "0")
    with pytest.raises(ConfigurationError, match="DEDUP_SEEN_TTL_SECONDS"):
        UrlSeenSet("redis://127.0.0.1:6379/0")


def test_module_function(seen):
    url = f"https://example.org/{uuid.uuid4().hex}"
    assert first_time_seen(url) and not first_time_seen(url + "#x")
    default_seen_set(None, None).forget([url])


def test_prefix_from_the_environment(monkeypatch):
    monkeypatch.setenv("DEDUP_URL_PREFIX", "fleet-b:url")
    assert UrlSeenSet().key("https://a.example/").startswith("fleet-b:url:url/2:")
    assert UrlSeenSet(prefix="explicit").key("https://a.example/").startswith("explicit:url/2:")


def test_credentials_never_reach_the_url_seen_set(seen):
    """The key is the URL without its userinfo: a page fetched with and without credentials is one page."""
    assert seen.key("https://admin:hunter2@Shop.example/p/9") == seen.key("https://shop.example/p/9")
    assert seen.first_time_seen("https://admin:hunter2@shop.example/p/9")
    assert not seen.first_time_seen("https://shop.example/p/9")
    assert seen.key("http://[::0:1]/a") == seen.key("http://[::1]/a")


def test_requests_other_than_a_plain_get_are_told_apart_by_method_and_body(seen):
    search = "https://Shop.example/search?utm_source=x"
    assert seen.first_time_seen_request("POST", search, b"q=a")
    assert not seen.first_time_seen_request("post", "https://shop.example/search#top", b"q=a")  # url/2 applies
    assert seen.first_time_seen_request("POST", search, b"q=b")
    assert seen.first_time_seen_request("HEAD", search)
    assert seen.first_time_seen_request("GET", search)  # a plain GET is the URL itself
    assert not seen.first_time_seen("https://shop.example/search")
    assert 0 < seen.client.ttl(seen.key(search) + ":requests") <= 60


def test_forgetting_a_url_forgets_its_other_requests(seen):
    url = "https://shop.example/account"
    assert seen.first_time_seen(url) and seen.first_time_seen_request("POST", url, b"name=someone")
    assert seen.forget([url]) == 2
    assert seen.first_time_seen(url) and seen.first_time_seen_request("POST", url, b"name=someone")


def test_a_request_fails_open_to_the_process_memory_when_redis_is_down():
    dead = UrlSeenSet("redis://127.0.0.1:1/0")
    assert dead.first_time_seen_request("POST", "https://a.example/s", b"q=a")
    assert not dead.first_time_seen_request("POST", "https://a.example/s", b"q=a")
    assert dead.first_time_seen_request("POST", "https://a.example/s", b"q=b")


# ---------------------------------------------------------------- a real Scrapy crawl

# Links name the same pages in several URL forms; each product page links to /p/3 twice.
_INDEX_LINKS = ("/p/1?utm_source=mail", "/p/1?ref=home", "/p/1#reviews", "/P/1", "/p/2?b=2&a=1", "/p/2?a=1&b=2&gclid=x")
_PRODUCT_LINKS = ("/p/3?utm_medium=email", "/p/3")


@pytest.fixture
def shop():
    """A small site on 127.0.0.1 that records every request it serves (method, path, body)."""
    served: list[tuple[str, str, bytes]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            served.append(("GET", self.path, b""))
            path = self.path.split("?")[0]
            links = _INDEX_LINKS if path == "/" else _PRODUCT_LINKS if path != "/p/3" else ()
            self._page(links)

        def do_POST(self):
            served.append(("POST", self.path, self.rfile.read(int(self.headers["Content-Length"]))))
            self._page(())

        def _page(self, links):
            body = "".join(f'<a href="{link}">x</a>' for link in links).encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/", served
    server.shutdown()
    server.server_close()


def _crawl(start_url: str, prefix: str, redis_url: str = "redis://127.0.0.1:6379/0") -> dict:
    script = Path(__file__).with_name("scrapy_crawl.py")
    done = subprocess.run(
        [sys.executable, str(script), start_url, redis_url, prefix],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).parents[1],
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _each_page_once(start_url: str, served: list) -> None:
    gets = sorted(canonical_url(start_url.rstrip("/") + path) for method, path, _ in served if method == "GET")
    base = start_url.rstrip("/")
    # Each page once in its url/2 form; path case is identity, so /P/1 is a page of its own.
    assert gets == sorted([start_url, f"{base}/P/1", f"{base}/p/1", f"{base}/p/2?a=1&b=2", f"{base}/p/3"])
    # The same address posted with two bodies is two requests; the repeated body is dropped.
    assert sorted(body for method, _, body in served if method == "POST") == [b"q=a", b"q=b"]


def test_a_scrapy_crawl_with_redis_down_still_fetches_each_page_once(shop):
    """Redis unreachable: the dupefilter answers from the crawler's memory, as Scrapy's own filter would (once, it
    let every request through: a site whose pages link to each other was crawled for ever)."""
    start_url, served = shop
    stats = _crawl(start_url, "down", redis_url="redis://127.0.0.1:1/0")
    _each_page_once(start_url, served)
    assert stats["filtered"] == 9


def test_scrapy_crawls_fetch_each_page_once_across_the_fleet(shop, seen):
    start_url, served = shop
    first = _crawl(start_url, seen.prefix)
    _each_page_once(start_url, served)
    base = start_url.rstrip("/")
    # 2 + 1 forms of /p/1 and /p/2 from the index, 5 of the 6 links to /p/3, 1 repeated post.
    assert first["filtered"] == 9

    # Another crawler of the fleet (a new process) fetches only its start page: every link is known.
    served.clear()
    second = _crawl(start_url, seen.prefix)
    assert served == [("GET", "/", b"")]
    assert second["filtered"] == len(_INDEX_LINKS) + 3
    # The library API agrees with what the crawlers recorded.
    assert not seen.first_time_seen(f"{base}/p/3?utm_campaign=spring#top")


def test_many_threads_share_the_memory_of_an_outage(tmp_path):
    """Threads of one crawler ask while Redis goes away and comes back: no error (once, writing the memory back
    to Redis met another thread adding to it), and each URL is first seen once."""
    from concurrent.futures import ThreadPoolExecutor

    from dedup_pipeline_tests.reliability.redis_server import PrivateRedis

    server = PrivateRedis(tmp_path / "redis").start()
    seen = UrlSeenSet(server.url, retry_after=0.01, prefix="threads")
    try:

        def ask(n: int) -> list[bool]:
            return seen.first_time_seen_many([f"https://a.example/{n}/{i}" for i in range(50)])

        with ThreadPoolExecutor(16) as pool:
            answers = list(pool.map(ask, range(0, 200, 2)))
            server.kill()
            answers += list(pool.map(ask, range(200, 400, 2)))
            server.start()
            answers += list(pool.map(ask, range(400, 600, 2)))
    finally:
        server.kill()
    assert all(all(batch) for batch in answers)  # every URL new, none lost or doubled, no exception
