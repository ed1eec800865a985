"""Shared helpers of the benchmarks: a private PostgreSQL database, timing, synthetic crawls."""

from __future__ import annotations

import json
import os
import random
import statistics
import time
import uuid
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy import create_engine, text

#: The Redis the benchmarks use ($DEDUP_REDIS_URL, else the local one); their keys have prefixes of their own
#: and are deleted afterwards.
REDIS_URL = os.environ.get("DEDUP_REDIS_URL") or "redis://127.0.0.1:6379/0"

# The server the benchmarks make their scratch databases on (the tests' variable: one setting for both).
PG_ADMIN_URL = os.environ.get("DEDUP_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
_WORDS = (
    "kettle steel whistle handle stove copper enamel lid spout base cord wooden matte glossy quiet fast boil "
    "litre compact travel family vintage modern classic induction gas electric warm cool red blue green grey"
).split()


@contextmanager
def scratch_database(admin_url: str = PG_ADMIN_URL):
    """A fresh PostgreSQL database for one benchmark, dropped afterwards."""
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    name = f"dedup_bench_{uuid.uuid4().hex[:10]}"
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield admin_url.rsplit("/", 1)[0] + f"/{name}"
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def product(n: int, rng: random.Random, **overrides) -> dict:
    """A scraped product listing with volatile fetch metadata."""
    record = {
        "url": f"https://shop{n % 17}.example.com/p/{n}?utm_source=feed&ref=home",
        "title": f"{rng.choice(_WORDS).title()} {rng.choice(_WORDS)} kettle {n}",
        "description": " ".join(rng.choice(_WORDS) for _ in range(30)),
        "price": round(rng.uniform(3, 400), 2),
        "currency": "EUR",
        "seller_id": f"seller-{n % 97}",
        "sku": f"SKU-{n}",
        "scraped_at": f"2026-11-{1 + n % 28:02d}T10:00:00Z",
        "crawl_id": f"crawl-{n % 5}",
        "proxy_ip": f"10.0.{n % 256}.{n % 250 + 1}",
        "response_ms": rng.randint(40, 900),
        "etag": f"e{rng.getrandbits(32):08x}",
    }
    record.update(overrides)
    return record


def crawl_with_duplicates(n: int, duplicate_share: float = 0.5, seed: int = 1) -> list[dict]:
    """`n` records of which `duplicate_share` are exact re-crawls (other volatile fields) of earlier ones."""
    rng = random.Random(seed)
    unique = int(n * (1 - duplicate_share))
    records = [product(i, rng) for i in range(unique)]
    for _ in range(n - unique):
        original = records[rng.randrange(unique)]
        records.append({**original, "scraped_at": "2026-11-29T08:00:00Z", "crawl_id": "recrawl",
                        "proxy_ip": "10.9.9.9", "etag": "changed", "response_ms": 1})
    rng.shuffle(records)
    return records


def write_jsonl(records: list[dict], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def timed(function, *args, **kwargs) -> tuple[float, object]:
    start = time.perf_counter()
    result = function(*args, **kwargs)
    return time.perf_counter() - start, result


def median(values) -> float:
    return statistics.median(values)
