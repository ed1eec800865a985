"""Fixtures of the rung tests."""

from __future__ import annotations

import pytest

from dedup_pipeline_tests.helpers import listing, write_batch
from dedup_pipeline_tests.ladder.common import DAY


@pytest.fixture
def two_overlapping_batches(tmp_path):
    folder = tmp_path / "landing"
    day1 = [listing(n) for n in range(20)]
    day1.insert(
        5, listing(3, url="https://SHOP.example.com:443/p/3?utm_source=mail#x", crawl_id="b")
    )  # tracking variant
    day1.insert(9, '{"url": "https://shop.example.com/p/99", "title": "broken')  # malformed line
    day1.insert(12, {"title": "no url here"})
    write_batch(folder, "2026-11-01", day1, landed=1_700_000_000)
    day2 = [
        listing(n, crawl_id="crawl-b", scraped_at="2026-11-02T09:00:00Z", proxy_ip="10.9.9.9") for n in range(10, 30)
    ]
    day2[0] = listing(10, price="99.00", crawl_id="crawl-b")  # same key, new content
    day2.append(
        listing(40, url="https://mirror.example.net/kettle-4", description=listing(4)["description"] + " shipped today")
    )
    write_batch(folder, "2026-11-02", day2, landed=1_700_000_000 + DAY)
    return folder
