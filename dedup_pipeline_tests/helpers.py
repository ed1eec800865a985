"""Small builders shared by the tests: batch files, table snapshots and scratch PostgreSQL databases."""

from __future__ import annotations

import gzip
import json
import os
import random
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy import create_engine, select, text

from dedup_pipeline.store.schema import near_duplicate_clusters, near_duplicate_links, record_history, records

PG_ADMIN_URL = os.environ.get("DEDUP_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")


@contextmanager
def fresh_database(prefix: str) -> Iterator[str]:
    """A new, empty PostgreSQL database on the test server; yields its name and drops it afterwards."""
    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield name
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def database_url(name: str) -> str:
    """The SQLAlchemy (psycopg 3) URL of a database on the test server."""
    return PG_ADMIN_URL.rsplit("/", 1)[0] + f"/{name}"


_WORDS = (
    "kettle steel whistle handle stove copper enamel lid spout base cord wooden matte glossy quiet fast "
    "boil litre compact travel family vintage modern classic induction gas electric warm cool red blue"
).split() + [
    a + b + c for a in "bdklmprst" for b in ("a", "e", "i", "o", "u", "ai", "ou") for c in ("n", "r", "st", "l", "x")
]
# The made-up words (315 of them) keep two descriptions from sharing most of their words: with 32 words, any two
# listings were near duplicates by their word and character sets, the shingles of short texts.


def description(n: int, words: int = 24) -> str:
    """A distinct, deterministic product description (so listings are not near duplicates of each other)."""
    rng = random.Random(n)
    return " ".join(rng.choice(_WORDS) for _ in range(words))


def listing(n: int, **overrides) -> dict:
    """A product listing with volatile fetch metadata, like a crawler writes it."""
    record = {
        "url": f"https://shop.example.com/p/{n}",
        "title": f"Product {n} kettle",
        "description": description(n),
        "price": f"{10 + n}.90",
        "currency": "EUR",
        "seller_id": f"seller-{n % 3}",
        "sku": f"SKU-{n}",
        "scraped_at": f"2026-11-01T10:{n % 60:02d}:00Z",
        "crawl_id": "crawl-a",
        "proxy_ip": f"10.0.0.{n % 250}",
        "response_ms": 100 + n,
        "etag": f"e{n}",
    }
    record.update(overrides)
    return record


def write_batch(folder: Path, name: str, lines: list, landed: float | None = None, gz: bool = False) -> Path:
    """Write a batch file (dicts are dumped as JSON, str/bytes written as they are)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / (name + (".jsonl.gz" if gz else ".jsonl"))
    data = b"".join(
        (line if isinstance(line, bytes) else (line if isinstance(line, str) else json.dumps(line)).encode("utf-8"))
        + b"\n"
        for line in lines
    )
    if gz:
        data = gzip.compress(data)
    path.write_bytes(data)
    if landed is not None:
        os.utime(path, (landed, landed))
    return path


def snapshot(engine) -> dict:
    """The data tables as comparable values (ids and wall-clock times left out)."""
    with engine.connect() as conn:
        ids = {rid: key for rid, key in conn.execute(select(records.c.record_id, records.c.natural_key))}
        return {
            "records": sorted(
                (r.natural_key, r.hash_version, r.content_hash.hex(), str(sorted(r.payload.items())), r.last_batch_id)
                for r in conn.execute(select(records))
            ),
            "history": sorted(
                (h.natural_key, h.content_hash.hex(), h.superseded_by_batch_id)
                for h in conn.execute(select(record_history))
            ),
            "links": sorted(
                (ids[a], ids[b], round(s, 6))
                for a, b, s in conn.execute(
                    select(
                        near_duplicate_links.c.record_a,
                        near_duplicate_links.c.record_b,
                        near_duplicate_links.c.similarity,
                    )
                )
            ),
            "clusters": sorted((ids[r], ids[c], rep) for r, c, rep in conn.execute(select(near_duplicate_clusters))),
        }


def new_run_id(key: str) -> str:
    """A fresh run id, as each Dagster run of a partition has one (the same id twice would resume the first run)."""
    return f"run-{key}-{uuid.uuid4().hex[:8]}"


def clusters_by_key(conn, keys: dict[int, str]) -> set[tuple[frozenset, str]]:
    """Each near-duplicate cluster as (its members' natural keys, its representative's): free of record ids,
    which follow the order records were first stored. `keys`: record id -> natural key."""
    c = near_duplicate_clusters.c
    members: dict[int, set[str]] = {}
    representative: dict[int, str] = {}
    for rid, cid, rep in conn.execute(select(c.record_id, c.cluster_id, c.is_representative)):
        members.setdefault(cid, set()).add(keys[rid])
        if rep:
            representative[cid] = keys[rid]
    return {(frozenset(m), representative[cid]) for cid, m in members.items()}
