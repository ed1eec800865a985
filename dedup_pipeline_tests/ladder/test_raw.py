"""The raw rung (dedup_pipeline.ladder.raw): a batch is registered once, with the landing time it first had."""

from __future__ import annotations

import json
import os

import pytest
from sqlalchemy import select

from dedup_pipeline.landing import BOM
from dedup_pipeline_tests.helpers import listing, snapshot, write_batch
from dedup_pipeline_tests.ladder.common import run_batch


def test_an_old_batch_whose_file_was_touched_keeps_its_place(warehouse, two_overlapping_batches):
    """Breaks: after both batches ran, the older batch's file gets a new modification time (`touch`, a copy, a
    restore, a re-delivery with a correction) and the folder is materialised again.

    Must hold: the batch keeps the landing time it was first registered with, so its old content is judged
    stale against the newer batch and nothing changes (once, it was re-dated to now: its old prices overwrote
    the newer ones, and the newer batch became stale).
    """
    from dedup_pipeline.store.schema import crawl_batches

    folder = two_overlapping_batches
    for key in ("2026-11-01", "2026-11-02"):
        run_batch(warehouse, folder, key)
    before = snapshot(warehouse.engine)
    with warehouse.engine.connect() as conn:
        landed = dict(conn.execute(select(crawl_batches.c.batch_id, crawl_batches.c.landed_at)).all())
    old_file = folder / "2026-11-01.jsonl"
    os.utime(old_file, None)  # now
    for key in ("2026-11-01", "2026-11-02"):
        _, _, exact, _ = run_batch(warehouse, folder, key)
        assert exact.survivors == 0
    assert snapshot(warehouse.engine) == before
    with warehouse.engine.connect() as conn:
        assert dict(conn.execute(select(crawl_batches.c.batch_id, crawl_batches.c.landed_at)).all()) == landed


def _quarantined(warehouse) -> dict[int, tuple[str, bytes]]:
    from dedup_pipeline.store.schema import quarantine

    with warehouse.engine.connect() as conn:
        rows = conn.execute(select(quarantine.c.line_no, quarantine.c.reason, quarantine.c.raw_line)).all()
    return {row.line_no: (row.reason, bytes(row.raw_line)) for row in rows}


@pytest.mark.parametrize("gz", [False, True], ids=["plain", "gzip"])
def test_a_byte_order_mark_at_the_start_of_a_file_costs_no_record(warehouse, tmp_path, gz):
    """Breaks: a crawler (or a Windows tool) writes a UTF-8 BOM before the first line of a batch.

    Must hold: the first record is read like the others (it was quarantined "Unexpected UTF-8 BOM"), plain and
    gzipped; a BOM anywhere else still quarantines its line.
    """
    from dedup_pipeline.store.schema import records

    lines = [BOM + json.dumps(listing(1)).encode(), listing(2), BOM + json.dumps(listing(3)).encode()]
    folder = tmp_path / "landing"
    write_batch(folder, "2026-11-01-shop", lines, gz=gz)
    raw, canonical, exact, _ = run_batch(warehouse, folder, "2026-11-01-shop")
    assert (raw.lines, raw.parsed, raw.quarantined) == (3, 2, 1)
    assert list(_quarantined(warehouse)) == [3]
    assert "Unexpected UTF-8 BOM" in _quarantined(warehouse)[3][0]
    assert exact.survivors == 2
    with warehouse.engine.connect() as conn:
        keys = set(conn.execute(select(records.c.natural_key)).scalars())
    assert keys == {"https://shop.example.com/p/1", "https://shop.example.com/p/2"}
