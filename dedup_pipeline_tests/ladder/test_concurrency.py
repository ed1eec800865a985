"""Two workers writing overlapping batches at the same time, as separate processes, on the real PostgreSQL."""

from __future__ import annotations

import multiprocessing
import random

from sqlalchemy import func, select

from dedup_pipeline.ladder.canonical import canonicalise_batch
from dedup_pipeline.ladder.exact import deduplicate_batch
from dedup_pipeline.ladder.raw import ingest_raw_batch
from dedup_pipeline.ladder.settings import LadderSettings
from dedup_pipeline.landing import find_batch
from dedup_pipeline.store.schema import dedup_decisions, record_hashes, records
from dedup_pipeline.store.warehouse import Warehouse
from dedup_pipeline_tests.helpers import listing, write_batch

SETTINGS = LadderSettings(chunk_size=40)


def _stage(url, folder, key):
    warehouse = Warehouse(url)
    ingest_raw_batch(warehouse, find_batch(folder, key))
    canonicalise_batch(warehouse, key, SETTINGS)


def _dedup(url, key, start):
    start.wait()  # both workers begin writing at the same moment
    report = deduplicate_batch(Warehouse(url), key, f"run-{key}", SETTINGS)
    return dict(report.decisions), report.chunk_retries


def test_overlapping_batches_in_parallel_processes(pg_database_url, tmp_path):
    url = pg_database_url
    from sqlalchemy import create_engine

    from dedup_pipeline.store.schema import metadata

    engine = create_engine(url)
    metadata.drop_all(engine)
    engine.dispose()
    Warehouse(url).create_schema()
    folder = tmp_path / "landing"
    rng = random.Random(3)
    # Both batches hold the same 300 keys (same content) in different orders, plus 100 of their own.
    shared = [listing(n) for n in range(300)]
    write_batch(folder, "w1", rng.sample(shared, 300) + [listing(n) for n in range(1000, 1100)], landed=1e9)
    write_batch(folder, "w2", rng.sample(shared, 300) + [listing(n) for n in range(2000, 2100)], landed=1e9)
    for key in ("w1", "w2"):
        _stage(url, folder, key)

    ctx = multiprocessing.get_context("spawn")
    with ctx.Manager() as manager:
        start = manager.Barrier(2)
        with ctx.Pool(2) as pool:
            results = pool.starmap(_dedup, [(url, "w1", start), (url, "w2", start)])

    decisions = [d for d, _ in results]
    print("chunk retries per worker:", [r for _, r in results])
    with Warehouse(url).engine.connect() as conn:
        rows = conn.execute(select(func.count()).select_from(records)).scalar_one()
        keys = conn.execute(select(func.count(func.distinct(records.c.natural_key)))).scalar_one()
        contents = conn.execute(select(func.count(func.distinct(records.c.content_hash)))).scalar_one()
        logged = conn.execute(select(func.count()).select_from(dedup_decisions)).scalar_one()
        hash_rows = conn.execute(select(func.count()).select_from(record_hashes)).scalar_one()
    assert rows == keys == contents == 500  # exactly one row per key and per content
    assert hash_rows == 500 * 2
    # every record got exactly one decision, and together they add up
    assert sum(d.get("new", 0) for d in decisions) == 500
    assert sum(d.get("exact_duplicate", 0) for d in decisions) == 300
    assert logged == 800
