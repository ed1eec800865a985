"""The raw rung (dedup_pipeline.ladder.raw): a batch is registered once, with the landing time it first had."""

from __future__ import annotations

import os

from sqlalchemy import select

from dedup_pipeline_tests.helpers import snapshot
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
