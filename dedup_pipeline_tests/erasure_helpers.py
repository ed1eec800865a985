"""What the erasure, tombstone and retention tests share: a small crawl run down the whole ladder."""

from __future__ import annotations

from sqlalchemy import func, select

from dedup_pipeline.core.near import NearDupParams
from dedup_pipeline.ladder.canonical import canonicalise_batch
from dedup_pipeline.ladder.exact import deduplicate_batch
from dedup_pipeline.ladder.near import cluster_batch
from dedup_pipeline.ladder.raw import ingest_raw_batch
from dedup_pipeline.ladder.settings import LadderSettings, NearSettings
from dedup_pipeline.landing import find_batch
from dedup_pipeline.store.schema import records
from dedup_pipeline_tests.helpers import listing, new_run_id, write_batch

DAY = 86400.0
T0 = 1_700_000_000
SETTINGS = LadderSettings(chunk_size=7)
P4 = "https://shop.example.com/p/4"


def run_ladder(warehouse, folder, key, seen_set=None):
    ingest_raw_batch(warehouse, find_batch(folder, key))
    canonicalise_batch(warehouse, key, SETTINGS)
    exact = deduplicate_batch(warehouse, key, new_run_id(key), SETTINGS, seen_set)
    cluster_batch(warehouse, key, NearSettings(params=NearDupParams(threshold=0.5)))
    return exact


def count(warehouse, table, *where):
    with warehouse.engine.connect() as conn:
        return conn.execute(select(func.count()).select_from(table).where(*where)).scalar_one()


def mirror(n: int, suffix: str, url: str) -> dict:
    """A syndicated copy of listing n: same title, description plus a few words, another URL."""
    base = listing(n)
    return listing(n + 100, url=url, title=base["title"], description=f"{base['description']} {suffix}")


def record_id(warehouse, natural_key):
    with warehouse.engine.connect() as conn:
        return conn.execute(
            select(records.c.record_id).where(records.c.natural_key == natural_key)
        ).scalar_one_or_none()


def crawl_two_days(warehouse, tmp_path):
    """Two days of crawl: p/4 changes price on day 2 and has two syndicated copies; bad lines in quarantine."""
    folder = tmp_path / "landing"
    day1 = [listing(n) for n in range(12)]
    day1 += [
        mirror(4, "shipped today", "https://mirror.example.net/k4"),
        mirror(4, "fast delivery", "https://copy.example.org/kettle"),
    ]
    day1 += [
        '{"url": "https://Shop.Example.com/p/4?utm_source=a", "title": "broken',  # holds the subject
        '{"url": "https://shop.example.com/p/40", "title": "broken',
    ]  # does not
    write_batch(folder, "day1", day1, landed=T0)
    write_batch(folder, "day2", [listing(4, price="99.00", crawl_id="c2"), listing(5, crawl_id="c2")], landed=T0 + DAY)
    for key in ("day1", "day2"):
        run_ladder(warehouse, folder, key)
    return folder
