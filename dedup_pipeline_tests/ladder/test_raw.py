"""The raw rung (dedup_pipeline.ladder.raw): a batch is registered once, with the landing time it first had."""

from __future__ import annotations

import gzip
import json
import os
import tracemalloc

import pytest
from sqlalchemy import select

from dedup_pipeline.ladder.settings import LadderSettings
from dedup_pipeline.landing import BOM, HEAD_BYTES, iter_lines
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
    assert "a byte-order mark starts the line" in _quarantined(warehouse)[3][0]
    assert exact.survivors == 2
    with warehouse.engine.connect() as conn:
        keys = set(conn.execute(select(records.c.natural_key)).scalars())
    assert keys == {"https://shop.example.com/p/1", "https://shop.example.com/p/2"}


@pytest.mark.parametrize("gz", [False, True], ids=["plain", "gzip"])
def test_a_line_over_the_size_limit_is_quarantined_with_its_length(warehouse, tmp_path, gz):
    """Breaks: one line of a batch is far longer than any record (a crawler dumped a page into a field).

    Must hold: it is quarantined with its length and the limit (only its head kept), the lines around it are
    read as usual, the canonical rung leaves it out, and the last line of the file may be over the limit too.
    """
    limit = 4096
    huge = listing(2, description="x" * 50_000)
    prefix = b'{"url": "https://shop.example.com/p/5", "title": "xy", "description": "'  # 4096 cuts an "é" in two
    accented = prefix + "é".encode() * 3000 + b'"}'
    lines = [listing(1), huge, listing(3), accented, listing(4, description="y" * 9000)]
    folder = tmp_path / "landing"
    path = write_batch(folder, "2026-11-01-shop", lines)
    data = path.read_bytes().removesuffix(b"\n")  # the last line ends the file, without a newline
    path.unlink()
    (folder / f"2026-11-01-shop.jsonl{'.gz' if gz else ''}").write_bytes(gzip.compress(data) if gz else data)
    settings = LadderSettings(chunk_size=7, max_line_bytes=limit)
    raw, canonical, exact, _ = run_batch(warehouse, folder, "2026-11-01-shop", settings)
    assert (raw.lines, raw.parsed, raw.quarantined, raw.too_long) == (5, 2, 3, 3)
    bad = _quarantined(warehouse)
    assert sorted(bad) == [2, 4, 5]
    assert len(prefix) % 2 == 1 and bad[4] == (
        f"line too long ({len(accented)} bytes; at most {limit}, max_line_bytes): only its first 4095 bytes kept",
        accented[:4095],
    )
    length = len(json.dumps(huge).encode())
    assert bad[2][0].startswith(f"line too long ({length} bytes; at most {limit}")
    assert bad[2][1] == json.dumps(huge).encode()[:HEAD_BYTES]
    assert (canonical.records_in, canonical.canonical, exact.survivors) == (2, 2, 2)


def test_reading_a_50_mb_line_holds_a_bounded_amount_of_memory(tmp_path):
    """Breaks: a single 50 MB line (it was stored, at 1.19 GB peak memory).

    Must hold: the reader skips it to its newline holding at most the limit and a read block, never the line.
    """
    path = tmp_path / "big.jsonl"
    with open(path, "wb") as handle:
        handle.write(json.dumps(listing(1)).encode() + b"\n" + b'{"description": "')
        for _ in range(50):
            handle.write(b"z" * (1 << 20))
        handle.write(b'"}\n' + json.dumps(listing(2)).encode() + b"\n")
    tracemalloc.start()
    try:
        lines = [(line.number, line.too_long, line.length) for line in iter_lines(path, max_line_bytes=1 << 20)]
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert lines == [(1, False, None), (2, True, 50 * (1 << 20) + 19), (3, False, None)]
    assert peak < 8 * (1 << 20), f"peak {peak / (1 << 20):.1f} MiB"


def test_blank_lines_are_counted_in_the_batch_figures(warehouse, tmp_path):
    """Breaks: a batch with empty and whitespace-only lines between its records.

    Must hold: they are counted (`blank`), keep their line numbers, and are neither records nor quarantined.
    """
    folder = tmp_path / "landing"
    write_batch(folder, "2026-11-01-shop", [listing(1), "", "   \t", listing(2), "\r", listing(3)])
    raw, canonical, exact, _ = run_batch(warehouse, folder, "2026-11-01-shop")
    assert (raw.lines, raw.parsed, raw.quarantined, raw.blank) == (3, 3, 0, 3)
    assert raw.as_metadata()["blank"] == 3
    assert exact.survivors == 3
    assert _quarantined(warehouse) == {}
