"""Builders for rehash-migration tests and the benchmark: a warehouse written before the target version existed.

`migration_listing(n)` is a cheap deterministic listing with the cases a
rule change meets: every 40th listing is a mirror copy of the one before
under another host (distinct under `content/1`, which hashes the URL, one
content under `content/2`, which does not), a "call for price" price and a
missing seller id (which `content/2` cannot hash). Expected figures are
computed from the core hash functions, never written down by hand.
"""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

from sqlalchemy import func, select, text

from dedup_pipeline.core.fields import canonical_fields
from dedup_pipeline.core.hashing import compute_hashes
from dedup_pipeline.core.near import NearDupParams
from dedup_pipeline.ladder.canonical import canonicalise_batch
from dedup_pipeline.ladder.exact import deduplicate_batch
from dedup_pipeline.ladder.near import cluster_batch
from dedup_pipeline.ladder.raw import ingest_raw_batch
from dedup_pipeline.ladder.settings import LadderSettings, NearSettings
from dedup_pipeline.landing import find_batch
from dedup_pipeline.store.bulk import copy_rows
from dedup_pipeline.store.schema import RECORD_COLUMNS, record_hashes, records
from dedup_pipeline_tests.helpers import new_run_id

_WORDS = "steel kettle copper enamel whistle travel quiet compact classic modern glass induction".split()
LEGACY_TIME = datetime(2026, 1, 1, tzinfo=UTC)
#: The rungs' settings of `run_ladder` unless a test gives its own.
SETTINGS = LadderSettings(chunk_size=500)


def migration_listing(n: int) -> dict:
    """A raw product listing; see the module docstring for the special cases."""
    if n % 40 == 1:
        mirror = migration_listing(n - 1)
        mirror["url"] = f"https://mirror.example.net/item/{n - 1}"
        mirror["crawl_id"] = "mirror"
        return mirror
    record = {
        "url": f"https://shop.example.com/p/{n}?utm_source=feed",
        "title": f"{_WORDS[n % 12].title()} {_WORDS[(n // 12) % 12]} kettle no. {n}",
        "description": f"{_WORDS[(n // 7) % 12]} {_WORDS[(n // 5) % 12]} {_WORDS[n % 11]} model {n}",
        "price": f"{10 + n % 900}.{n % 100:02d}",
        "currency": "EUR",
        "seller_id": f"seller-{n % 17}",
        "sku": f"SKU-{n}",
        "scraped_at": "2026-01-01T10:00:00Z",
        "crawl_id": "legacy",
    }
    if n % 97 == 3:
        record["price"] = "call for price"
    if n % 101 == 5:
        del record["seller_id"]
    return record


class Expectation:
    """Tallies, with the core rules, what a migration to `target` must find over stored rows."""

    def __init__(self, target: str = "content/2"):
        self.target = target
        self.rows = self.unhashable = 0
        self.target_digests: Counter = Counter()

    def add(self, digests: dict, errors: dict) -> None:
        self.rows += 1
        if self.target in errors:
            self.unhashable += 1
        else:
            self.target_digests[digests[self.target]] += 1

    def figures(self) -> dict:
        groups = [n for n in self.target_digests.values() if n > 1]
        return {
            "rows": self.rows,
            "unhashable": self.unhashable,
            "hashable": sum(self.target_digests.values()),
            "distinct_target": len(self.target_digests),
            "merge_groups": len(groups),
            "rows_merged_away": sum(groups) - len(groups),
        }


def expected(raws: list[dict], source: str = "content/1", target: str = "content/2") -> dict:
    """What a migration over these raw records (one stored row each) must find."""
    tally = Expectation(target)
    for raw in raws:
        tally.add(*compute_hashes(canonical_fields(raw), (source, target)))
    return tally.figures()


def load_legacy_rows(
    warehouse,
    raws: list[dict],
    versions=("content/1",),
    target: str = "content/2",
    batch_id: str = "legacy",
) -> dict:
    """Store raw records as a pipeline that only knew `versions` would have: one row each, bulk-copied.

    The row is stored under the first version; `record_hashes` gets every
    listed version. Ids continue after the existing rows. Returns
    `expected(raws)` for `target`, from the same pass.
    """
    tally = Expectation(target)
    with warehouse.engine.begin() as conn:
        start = conn.execute(select(func.coalesce(func.max(records.c.record_id), 0))).scalar_one()
        rows, hashes = [], []
        for i, raw in enumerate(raws, start=1):
            payload = canonical_fields(raw)  # the URL in its url/1 form, as the ladder stores it
            url = payload["url"]
            digests, errors = compute_hashes(payload, (*versions, target))
            tally.add(digests, errors)
            rid = start + i
            rows.append(
                (
                    rid,
                    url,
                    url,
                    "url/1",
                    versions[0],
                    bytes.fromhex(digests[versions[0]]),
                    payload,
                    LEGACY_TIME,
                    LEGACY_TIME,
                    batch_id,
                    batch_id,
                    LEGACY_TIME,
                    i,
                )
            )
            hashes += [(rid, v, bytes.fromhex(digests[v]), None) for v in versions]
        copy_rows(
            conn,
            records,
            RECORD_COLUMNS,
            rows,
        )
        copy_rows(conn, record_hashes, ("record_id", "hash_version", "content_hash", "error"), hashes)
        if conn.dialect.name == "postgresql":
            conn.execute(
                text(
                    "SELECT setval(pg_get_serial_sequence('records', 'record_id'), "
                    "(SELECT max(record_id) FROM records))"
                )
            )
            conn.execute(text("ANALYZE records, record_hashes"))
    return tally.figures()


def run_ladder(warehouse, folder: Path, key: str, settings: LadderSettings = SETTINGS, near: bool = True):
    """One batch file down the real ladder; returns the exact rung's report."""
    ingest_raw_batch(warehouse, find_batch(folder, key))
    canonicalise_batch(warehouse, key, settings)
    report = deduplicate_batch(warehouse, key, new_run_id(key), settings)
    if near:
        cluster_batch(warehouse, key, NearSettings(params=NearDupParams(threshold=0.5)))
    return report


def assert_unique_per_version(warehouse) -> None:
    """No two rows share (hash_version, content_hash), and every row has a stored digest of its own version."""
    with warehouse.engine.connect() as conn:
        dupes = conn.execute(
            select(records.c.hash_version, records.c.content_hash)
            .group_by(records.c.hash_version, records.c.content_hash)
            .having(func.count() > 1)
        ).all()
        assert dupes == []
        own = record_hashes.alias("own")
        mismatched = conn.execute(
            select(func.count())
            .select_from(records.join(own, own.c.record_id == records.c.record_id))
            .where(own.c.hash_version == records.c.hash_version, own.c.content_hash != records.c.content_hash)
        ).scalar_one()
        assert mismatched == 0
