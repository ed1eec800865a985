"""The canonical rung (dedup_pipeline.ladder.canonical): worker processes, and a worker lost mid-batch."""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time
from concurrent.futures.process import BrokenProcessPool

import pytest
from sqlalchemy import select

from dedup_pipeline.core.parallel import available_cpus
from dedup_pipeline.ladder import canonical
from dedup_pipeline.ladder.canonical import PARALLEL_FLOOR, canonicalise_batch, worker_count
from dedup_pipeline.ladder.raw import ingest_raw_batch
from dedup_pipeline.ladder.settings import LadderSettings
from dedup_pipeline.landing import find_batch
from dedup_pipeline.store.schema import canonical_records, quarantine
from dedup_pipeline_tests.helpers import listing, write_batch


def _staged(warehouse, batch_id):
    """The batch's canonical_records and quarantine rows, as comparable values."""
    with warehouse.engine.connect() as conn:
        staged = conn.execute(
            select(canonical_records)
            .where(canonical_records.c.batch_id == batch_id)
            .order_by(canonical_records.c.line_no)
        ).all()
        quarantined = conn.execute(
            select(quarantine.c.line_no, quarantine.c.rung, quarantine.c.reason, quarantine.c.raw_line)
            .where(quarantine.c.batch_id == batch_id)
            .order_by(quarantine.c.line_no)
        ).all()
    return [tuple(row) for row in staged], [tuple(row) for row in quarantined]


def test_worker_processes_canonicalise_exactly_as_the_step_itself(warehouse, tmp_path, monkeypatch):
    """Chunks spread over processes: the same rows, quarantine and counts as inline, and no process left."""
    lines = [listing(n) for n in range(230)]
    lines[17] = '{"url": "https://shop.example.com/p/17", "title": "broken'  # the raw rung's quarantine
    lines[60] = {"title": "no url here"}  # the canonical rung's quarantine, in a later chunk
    lines[201] = listing(201, url="ftp://shop.example.com/p/201")
    write_batch(tmp_path, "wide", lines)
    ingest_raw_batch(warehouse, find_batch(tmp_path, "wide"))
    monkeypatch.setattr(canonical, "PARALLEL_FLOOR", 100)  # a small batch, many chunks, still through the pool

    reports, states = [], []
    for workers in (2, 1):  # each run rewrites the partition whole
        reports.append(canonicalise_batch(warehouse, "wide", LadderSettings(chunk_size=25, canonical_workers=workers)))
        states.append(_staged(warehouse, "wide"))
    assert [r.workers for r in reports] == [2, 1]
    assert [(r.records_in, r.canonical, r.quarantined) for r in reports] == [(229, 227, 2)] * 2
    assert states[0] == states[1]
    staged, quarantined = states[0]
    assert [row[1] for row in staged] == [n for n in range(1, 231) if n not in (18, 61, 202)]
    assert [(line, rung) for line, rung, _, _ in quarantined] == [(18, "raw"), (61, "canonical"), (202, "canonical")]
    assert not multiprocessing.active_children()


def test_worker_count_follows_the_batch_size_and_the_setting():
    settings = LadderSettings(chunk_size=1000, canonical_workers=4)
    assert worker_count(settings, PARALLEL_FLOOR - 1) == 1  # small batches stay in the step's process
    assert worker_count(settings, PARALLEL_FLOOR) == 4
    assert worker_count(LadderSettings(chunk_size=10_000, canonical_workers=4), PARALLEL_FLOOR) == 2  # two chunks
    assert worker_count(LadderSettings(chunk_size=1000, canonical_workers=0), 10**6) == available_cpus()
    assert worker_count(LadderSettings(chunk_size=1000, canonical_workers=1), 10**6) == 1
    with pytest.raises(ValueError, match="canonical_workers"):
        LadderSettings(canonical_workers=-1)


def test_a_worker_killed_mid_batch_fails_the_rung_and_leaves_the_partition_as_it_was(warehouse, tmp_path, monkeypatch):
    """A worker lost (out of memory, killed) fails the step; its transaction leaves nothing half-written."""
    write_batch(tmp_path, "killed", [listing(n) for n in range(3000)])
    ingest_raw_batch(warehouse, find_batch(tmp_path, "killed"))
    canonicalise_batch(warehouse, "killed", LadderSettings(chunk_size=500, canonical_workers=1))
    before = _staged(warehouse, "killed")
    monkeypatch.setattr(canonical, "PARALLEL_FLOOR", 100)

    def kill_a_worker():
        while len(children := multiprocessing.active_children()) < 2:
            time.sleep(0.002)
        os.kill(children[0].pid, signal.SIGKILL)

    killer = threading.Thread(target=kill_a_worker, daemon=True)
    killer.start()
    with pytest.raises(BrokenProcessPool):
        canonicalise_batch(warehouse, "killed", LadderSettings(chunk_size=20, canonical_workers=2))
    killer.join(timeout=10)
    assert _staged(warehouse, "killed") == before
    assert not multiprocessing.active_children()
