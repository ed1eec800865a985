"""Per-chunk progress of the rungs in the step's log: records done, rate, time left."""

from __future__ import annotations

import dagster as dg

from dedup_pipeline.defs.assets import ladder_assets
from dedup_pipeline.defs.partitions import crawl_batches_partitions
from dedup_pipeline.ladder.progress import ChunkProgress
from dedup_pipeline_tests.defs.common import ladder_resources
from dedup_pipeline_tests.helpers import listing, write_batch


def test_a_chunk_s_line_says_records_done_rate_and_time_left():
    ticks = iter([0.0, 2.0, 4.0])
    lines: list[str] = []
    progress = ChunkProgress("exact", 10_000, lines.append, clock=lambda: next(ticks), every=1.0)
    progress.advance(4000)
    progress.advance(4000)
    assert lines == [
        "exact: 4,000 / 10,000 records (40%), 2,000 records/s, about 3 s left",
        "exact: 8,000 / 10,000 records (80%), 2,000 records/s, about 1 s left",
    ]
    unknown = []
    ChunkProgress("near", None, unknown.append, clock=iter([0.0, 0.5]).__next__).advance(100)
    assert unknown == ["near: 100 records, 200 records/s"]


def test_lines_come_after_the_first_chunk_then_at_most_every_interval_and_after_the_last():
    """Breaks: a line per chunk, so a batch of a million lines wrote hundreds of events to the run's log."""
    clock = iter(float(t) for t in [0, 1, 2, 3, 12, 13, 14, 15]).__next__  # start, then one tick per chunk
    lines: list[str] = []
    progress = ChunkProgress("canonical", 7_000, lines.append, clock=clock, every=10.0)
    for _ in range(7):
        progress.advance(1000)
    progress.finish()  # the last chunk reached the total: its line is out already, no second one
    assert [line.split(" records")[0] for line in lines] == [
        "canonical: 1,000 / 7,000",
        "canonical: 4,000 / 7,000",
        "canonical: 7,000 / 7,000",
    ]
    unknown: list[str] = []
    progress = ChunkProgress("near", None, unknown.append, clock=iter([0.0, 1.0, 2.0, 3.0]).__next__, every=10.0)
    progress.advance(10)
    progress.advance(10)
    assert unknown == ["near: 10 records, 10 records/s"]  # the second chunk's line is held back
    progress.finish()
    assert unknown[-1] == "near: 20 records, 7 records/s"  # the total is only known at the end
    progress.finish()
    assert len(unknown) == 2


def test_every_rung_logs_its_chunks_in_the_step_log(tmp_path):
    """Breaks: the ladder assets logged nothing per chunk, so a long step looked stuck."""
    folder, url = tmp_path / "landing", f"sqlite:///{tmp_path / 'w.sqlite'}"
    write_batch(folder, "b1", [listing(n) for n in range(25)], landed=1e9)
    instance = dg.DagsterInstance.ephemeral()
    instance.add_dynamic_partitions(crawl_batches_partitions.name, ["b1"])
    result = dg.materialize(
        ladder_assets, partition_key="b1", instance=instance, resources=ladder_resources(url, folder, chunk_size=10)
    )
    assert result.success
    rungs = ("canonical:", "exact:", "near:")
    logged = [e.message for e in instance.all_logs(result.run_id) if e.step_key and e.message.startswith(rungs)]
    # a step of a few seconds: its first chunk's line and its last's (the next would be 10 s after the first)
    assert [m.split(" records")[0] for m in logged if m.startswith("canonical:")] == [
        "canonical: 10 / 25",
        "canonical: 25 / 25",
    ]
    assert [m.split(" records")[0] for m in logged if m.startswith("exact:")] == ["exact: 10 / 25", "exact: 25 / 25"]
    assert all("records/s, about " in m for m in logged if not m.startswith("near:"))
    assert [m.split(" records")[0] for m in logged if m.startswith("near:")] == ["near: 25"]  # one near chunk
