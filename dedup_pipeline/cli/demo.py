"""A realistic sample crawl for `dedup-pipeline demo`: every kind of duplicate a crawler makes.

Deterministic (seeded), so the demo prints the same figures every time on an
empty warehouse:
- pagination overlap: the last items of page N reappear on page N+1;
- tracking-parameter and fragment variants of the same product URL;
- an unchanged re-crawl a day later (only scraped_at, crawl_id, proxy_ip, response_ms, etag differ);
- price changes on a few products in the re-crawl (same key, new content);
- articles syndicated to another host with small edits (near duplicates);
- a few broken lines (malformed JSON, no URL, a javascript: URL).
"""

from __future__ import annotations

import gzip
import json
import os
import random
from datetime import UTC, datetime
from pathlib import Path

_WORDS = (
    "market price quality design steel frame light compact battery travel office garden kitchen "
    "classic modern premium durable wireless portable ergonomic natural organic fresh handmade "
    "report city council budget plan river bridge school station weather summer winter season "
    "team league match season coach player fans record history museum festival music theatre "
    "science study research energy solar wind climate coast island harbour village library"
).split()
_SHOP = "https://Shop.Example.com"
_NEWS = "https://news.example.org"
_MIRROR = "https://www.daily-mirror-site.example"


def _product(rng: random.Random, n: int) -> dict:
    words = rng.sample(_WORDS, 4)
    return {
        "url": f"{_SHOP}/p/{1000 + n}",
        "title": f"{words[0].title()} {words[1]} {words[2]} no. {n}",
        "description": " ".join(rng.choices(_WORDS, k=18)),
        "price": f"{rng.randint(3, 400)}.{rng.choice(['00', '49', '90', '99'])}",
        "currency": "EUR",
        "seller_id": f"seller-{n % 7}",
        "sku": f"SKU-{1000 + n}",
    }


def _article(rng: random.Random, n: int) -> dict:
    body = " ".join(rng.choices(_WORDS, k=120))
    return {
        "url": f"{_NEWS}/2026/11/story-{n}",
        "title": f"The {rng.choice(_WORDS)} {rng.choice(_WORDS)} story {n}",
        "description": body,
        "price": "0",
        "currency": "EUR",
        "seller_id": "news-desk",
        "sku": f"ART-{n}",
    }


def _fetch(record: dict, crawl: str, rng: random.Random, day: int) -> dict:
    return {
        **record,
        "scraped_at": f"2026-11-{day:02d}T{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}:00Z",
        "crawl_id": crawl,
        "proxy_ip": f"10.0.{rng.randint(0, 255)}.{rng.randint(1, 254)}",
        "response_ms": rng.randint(40, 900),
        "etag": f'W/"{rng.getrandbits(32):08x}"',
    }


def _tracking_variant(url: str, rng: random.Random) -> str:
    extra = rng.choice(
        ["?utm_source=newsletter&utm_medium=email", "?gclid=Cj0KCQ", "#reviews", "?ref=homepage&utm_campaign=bf"]
    )
    return url.replace("Shop.Example.com", rng.choice(["shop.example.com", "SHOP.example.com:443"])) + extra


def _edit(text: str, rng: random.Random) -> str:
    words = text.split()
    for _ in range(3):
        words[rng.randrange(len(words))] = rng.choice(_WORDS)
    return " ".join(words) + " Read more on our site."


#: Products in the shop's catalogue: every shop crawl holds at least 100 records, the collapse check's minimum.
_PRODUCTS = 100
#: Days the shop is crawled: from the fourth on, the collapse check has three earlier crawls to judge against.
_SHOP_DAYS = 4


def _recrawl(products: list[dict], rng: random.Random, day: int) -> list[str]:
    """Every product fetched again on `day`; a few prices changed (same key, new content)."""
    lines = []
    for n, product in enumerate(products):
        record = dict(product)
        if n % 12 == 5 + day:
            record["price"] = f"{float(record['price']) * 0.8:.2f}"
        lines.append(json.dumps(_fetch(record, f"crawl-11{day:02d}", rng, day)))
    return lines


def write_demo_crawl(folder: Path, seed: int = 7) -> list[Path]:
    """Write the demo's batch files into `folder` and return their paths in batch order.

    Byte for byte the same every time (gzip with a fixed header time, fixed modification times), so writing
    them again over the files of an earlier demo changes nothing a batch's registration compares.
    """
    rng = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    products = [_product(rng, n) for n in range(_PRODUCTS)]
    articles = [_article(rng, n) for n in range(12)]

    day1: list[str] = []
    for page in range(_PRODUCTS // 15):  # 20 per page with 5 items of overlap: pagination drift
        for product in products[page * 15 : page * 15 + 20]:
            record = dict(product)
            if rng.random() < 0.25:
                record["url"] = _tracking_variant(record["url"], rng)
            day1.append(json.dumps(_fetch(record, "crawl-1101", rng, 1)))
    day1 += [json.dumps(_fetch(a, "crawl-1101", rng, 1)) for a in articles]
    day1.insert(17, '{"url": "https://shop.example.com/p/broken", "title": "cut off mid-line')
    day1.insert(40, json.dumps({"title": "a record without a url", "price": "1.00"}))

    day2 = _recrawl(products, rng, 2)
    day2.append(json.dumps(_fetch({**products[3], "url": "javascript:void(0)"}, "crawl-1102", rng, 2)))

    syndication = []
    for n, article in enumerate(articles[:8]):
        copy = {
            **article,
            "url": f"{_MIRROR}/world/{n}-{article['sku'].lower()}",
            "seller_id": "mirror-wire",
            "description": _edit(article["description"], rng),
        }
        syndication.append(json.dumps(_fetch(copy, "crawl-mirror", rng, 2)))

    batches = [
        ("2026-11-01-shop.jsonl", 1, day1),
        ("2026-11-02-shop.jsonl.gz", 2, day2),
        ("2026-11-02-syndication.jsonl", 2, syndication),
        *((f"2026-11-{day:02d}-shop.jsonl", day, _recrawl(products, rng, day)) for day in range(3, _SHOP_DAYS + 1)),
    ]
    paths = []
    for order, (name, day, lines) in enumerate(batches):
        path = folder / name
        data = ("\n".join(lines) + "\n").encode("utf-8")
        if name.endswith(".gz"):
            # mtime=0: the header carries no time, so the file is the same bytes on every run of the demo
            with open(path, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as handle:
                handle.write(data)
        else:
            path.write_bytes(data)
        landed = datetime(2026, 11, day, 23, 0, tzinfo=UTC).timestamp() + order  # landing time orders batches
        os.utime(path, (landed, landed))
        paths.append(path)
    return paths
