"""Fetch-time URL dedup against the real Redis."""

from __future__ import annotations

import uuid
from types import SimpleNamespace

import pytest

from dedup_pipeline import first_time_seen
from dedup_pipeline.crawler import RedisUrlDupeFilter, UrlSeenSet
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


def test_fails_open_when_redis_is_down():
    dead = UrlSeenSet("redis://127.0.0.1:1/0")
    assert dead.first_time_seen_many(["https://a.example/1", "https://a.example/1"]) == [True, True]


def test_module_function_and_scrapy_dupefilter(seen):
    url = f"https://example.org/{uuid.uuid4().hex}"
    assert first_time_seen(url) and not first_time_seen(url + "#x")
    settings = SimpleNamespace(get=lambda name: {"DEDUP_SEEN_TTL_SECONDS": "60"}.get(name), getbool=lambda name: False)
    dupefilter = RedisUrlDupeFilter.from_settings(settings)
    dupefilter.seen.prefix = seen.prefix
    request = SimpleNamespace(url="https://example.org/item?gclid=abc")
    assert not dupefilter.request_seen(request)
    assert dupefilter.request_seen(SimpleNamespace(url="https://EXAMPLE.org/item"))
    default_seen_set(None, None).forget([url])
