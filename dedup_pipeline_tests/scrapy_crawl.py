"""A real Scrapy crawl with `RedisUrlDupeFilter`, run by test_crawler.py in a process of its own.

    python scrapy_crawl.py START_URL REDIS_URL PREFIX

The spider follows every link of every page and, on the start page, posts the
search form three times (bodies q=a, q=b, q=a). It prints one JSON object:
Scrapy's `dupefilter/filtered` count. The site it crawls, and the record of
what was really fetched, belong to the test (a Twisted reactor cannot be
restarted, so each crawl needs a process of its own).
"""

from __future__ import annotations

import json
import sys

import scrapy
from scrapy.crawler import CrawlerProcess


class FollowEverything(scrapy.Spider):
    name = "follow_everything"

    def parse(self, response):
        for href in response.css("a::attr(href)").getall():
            yield response.follow(href, callback=self.parse)
        if response.url == self.start_urls[0]:
            for query in ("a", "b", "a"):
                yield scrapy.FormRequest(response.urljoin("/search"), formdata={"q": query}, callback=self.parse)


def main() -> None:
    start_url, redis_url, prefix = sys.argv[1:4]
    process = CrawlerProcess(
        {
            "DUPEFILTER_CLASS": "dedup_pipeline.crawler.RedisUrlDupeFilter",
            "DEDUP_REDIS_URL": redis_url,
            "DEDUP_URL_PREFIX": prefix,
            "DEDUP_SEEN_TTL_SECONDS": 60,
            "LOG_LEVEL": "WARNING",
            "ROBOTSTXT_OBEY": False,
            "TELNETCONSOLE_ENABLED": False,
        }
    )
    crawler = process.create_crawler(FollowEverything)
    process.crawl(crawler, start_urls=[start_url])
    process.start()
    print(json.dumps({"filtered": crawler.stats.get_value("dupefilter/filtered", 0)}))


if __name__ == "__main__":
    main()
