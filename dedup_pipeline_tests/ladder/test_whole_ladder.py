"""The whole ladder on SQLite and on the real PostgreSQL: counts, table contents, idempotence, chunk sizes."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from dedup_pipeline.ladder.settings import LadderSettings
from dedup_pipeline.store.schema import dedup_decisions, quarantine, record_hashes, record_history, records
from dedup_pipeline_tests.helpers import snapshot
from dedup_pipeline_tests.ladder.common import count, run_batch


def test_two_overlapping_batches(warehouse, two_overlapping_batches):
    folder = two_overlapping_batches
    raw1, can1, ex1, near1 = run_batch(warehouse, folder, "2026-11-01")
    assert (raw1.lines, raw1.parsed, raw1.quarantined) == (23, 22, 1)
    assert (can1.records_in, can1.canonical, can1.quarantined) == (22, 21, 1)
    assert ex1.decisions["new"] == 20 and ex1.decisions["exact_duplicate"] == 1  # the tracking variant
    assert ex1.collapse_rate == pytest.approx(1 / 21)

    raw2, can2, ex2, near2 = run_batch(warehouse, folder, "2026-11-02")
    assert raw2.quarantined == 0 and can2.canonical == 21
    assert ex2.decisions["exact_duplicate"] == 9  # products 11..19, re-crawled unchanged
    assert ex2.decisions["changed"] == 1  # product 10's new price
    assert ex2.decisions["new"] == 11  # products 20..29 and the mirror copy
    assert near2.pairs == 1 and len(near2.near_duplicates) == 1  # the mirror copy is linked to product 4, kept

    assert count(warehouse, records) == 31
    assert count(warehouse, record_history) == 1
    assert count(warehouse, quarantine) == 2
    assert count(warehouse, dedup_decisions) == 21 + 21
    assert count(warehouse, record_hashes) == 31 * 2
    with warehouse.engine.connect() as conn:
        price = conn.execute(
            select(records.c.payload).where(records.c.natural_key == "https://shop.example.com/p/10")
        ).scalar_one()
        assert price["price"] == "99"
        old = conn.execute(select(record_history.c.payload)).scalar_one()
        assert old["price"] == "20.9"
        versions = set(conn.execute(select(records.c.hash_version)).scalars())
        assert versions == {"content/1"}
    tables = snapshot(warehouse.engine)
    original, mirror = "https://shop.example.com/p/4", "https://mirror.example.net/kettle-4"
    assert [(a, b) for a, b, _ in tables["links"]] == [(original, mirror)]
    assert tables["clusters"] == [(mirror, original, False), (original, original, True)]


def test_rematerialising_changes_nothing(warehouse, two_overlapping_batches):
    folder = two_overlapping_batches
    for key in ("2026-11-01", "2026-11-02"):
        run_batch(warehouse, folder, key)
    before = snapshot(warehouse.engine)
    for key in ("2026-11-02", "2026-11-01", "2026-11-02"):  # latest again, an old one, latest again
        _, _, exact, near = run_batch(warehouse, folder, key)
        assert exact.survivors == 0 and near.sketched == 0
    assert snapshot(warehouse.engine) == before


def test_chunk_size_does_not_change_the_outcome(warehouse_url, two_overlapping_batches, tmp_path):
    from dedup_pipeline.store.warehouse import Warehouse

    results = []
    for chunk in (1, 3, 1000):
        wh = Warehouse(f"sqlite:///{tmp_path / f'c{chunk}.sqlite'}").create_schema()
        for key in ("2026-11-01", "2026-11-02"):
            run_batch(wh, two_overlapping_batches, key, LadderSettings(chunk_size=chunk))
        results.append(snapshot(wh.engine))
        wh.dispose()
    assert results[0] == results[1] == results[2]
