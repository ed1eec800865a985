"""The collapse-rate history (dedup_pipeline.quality.history) read from the decision log, on SQLite and PostgreSQL."""

from __future__ import annotations

import pytest
from sqlalchemy import delete, update

from dedup_pipeline.quality.collapse import CollapseRules, judge_collapse
from dedup_pipeline.quality.history import batch_rates, first_decision_counts
from dedup_pipeline.store.schema import dedup_decisions, exact_rung_runs
from dedup_pipeline_tests.helpers import listing, write_batch
from dedup_pipeline_tests.quality.common import DAY, run_rungs, sliding_batches


def test_history_is_the_first_decision_per_line_and_survives_a_replay(warehouse, tmp_path):
    folder = tmp_path / "landing"
    keys = sliding_batches(folder, 5, leak_in=4)
    for key in keys:
        run_rungs(warehouse, folder, key, near=False)
    replay = run_rungs(warehouse, folder, keys[2], run_id="replay", near=False)[2]
    assert replay.collapse_rate == 1.0  # a replay finds everything stored...

    with warehouse.engine.connect() as conn:
        current, history = batch_rates(conn, keys[2], window=10)
        assert (current.records_in, current.duplicates) == (120, 40)  # ...but the batch's rate is its first run's
        assert [h.batch_id for h in history] == [keys[1], keys[0]]
        assert [h.rate for h in history] == [pytest.approx(1 / 3), 0.0]
        leaked, before = batch_rates(conn, keys[4], window=3)
    assert [h.batch_id for h in before] == [keys[3], keys[2], keys[1]]
    # A field that changes every crawl (view_count) leaked into content/1: the overlap is "changed", not a duplicate.
    assert leaked.duplicates == 0 and leaked.records_in == 120
    verdict = judge_collapse(leaked, before, CollapseRules(min_records=100))
    assert not verdict.passed and verdict.error and "collapsed toward zero" in verdict.note


def test_history_is_the_batch_s_own_source_and_counts_only_judged_batches(warehouse, tmp_path):
    """Breaks: a new source's first crawl lands after batches of another source; a small batch sits in a source's
    history. Once, the first crawl was judged against the other source's median (an ERROR, "a leaked field"),
    and the small batch used up a place in the window without being judged.

    Must hold: history is the batch's own source (dated keys name it; keys naming none are one source), the
    window holds `window` judged batches, and a first crawl with no history is at most a warning.
    """
    folder = tmp_path / "landing"
    keys = []
    for k in range(4):  # shop-a: 40 of each batch's 120 listings seen the day before (rate 1/3 from day 2)
        keys.append(f"2026-11-{k + 1:02d}-shop-a")
        write_batch(folder, keys[-1], [listing(n) for n in range(80 * k, 80 * k + 120)], landed=1_700_000_000 + k * DAY)
    write_batch(folder, "2026-11-05-shop-b", [listing(5000 + n) for n in range(150)], landed=1_700_000_000 + 4 * DAY)
    write_batch(folder, "2026-11-06-shop-a", [listing(n) for n in range(300, 330)], landed=1_700_000_000 + 5 * DAY)
    write_batch(folder, "2026-11-07-shop-a", [listing(n) for n in range(320, 440)], landed=1_700_000_000 + 6 * DAY)
    for key in [*keys, "2026-11-05-shop-b", "2026-11-06-shop-a", "2026-11-07-shop-a"]:
        run_rungs(warehouse, folder, key, near=False)
    with warehouse.engine.connect() as conn:
        first_crawl, none_before = batch_rates(conn, "2026-11-05-shop-b", window=3, min_records=100)
        _, judged = batch_rates(conn, "2026-11-07-shop-a", window=3, min_records=100)
    assert none_before == [] and first_crawl.rate == 0.0
    verdict = judge_collapse(first_crawl, none_before, CollapseRules(min_records=100))
    assert not verdict.passed and not verdict.error and "no history of this source" in verdict.note
    assert [h.batch_id for h in judged] == [keys[3], keys[2], keys[1]]  # not shop-b, not the 30-line batch


def test_history_reads_the_counts_each_batch_s_rung_recorded_and_the_log_for_batches_without(warehouse, tmp_path):
    """Breaks: every check counted the decision log of up to 80 trailing batches again, line by line (a cost that
    grew with the batches' size), and lost a batch from the history once retention pruned its decisions.

    Must hold: a batch's first-decision counts, recorded by its exact rung once it finished the batch, are its
    rate whatever became of its decision rows since; a batch with none recorded (staged by an older version) is
    counted from the log, to the same rates; a replay records nothing that changes them."""
    folder = tmp_path / "landing"
    keys = sliding_batches(folder, 4)
    for key in keys:
        run_rungs(warehouse, folder, key, near=False)
    run_rungs(warehouse, folder, keys[1], run_id="replay", near=False)
    with warehouse.engine.connect() as conn:
        logged = first_decision_counts(conn, keys)
        expected = batch_rates(conn, keys[3], window=10)
    assert [(h.records_in, h.duplicates) for h in expected[1]] == [(120, 40), (120, 40), (120, 0)]
    assert sum(logged[keys[1]].values()) == 120  # the replay's 120 later decisions are not first ones
    with warehouse.engine.begin() as conn:  # retention prunes the decision log of the first two batches
        conn.execute(delete(dedup_decisions).where(dedup_decisions.c.batch_id.in_(keys[:2])))
    with warehouse.engine.connect() as conn:
        assert batch_rates(conn, keys[3], window=10) == expected
    with warehouse.engine.begin() as conn:  # batches 3 and 4 as an older version left them: no counts recorded
        conn.execute(update(exact_rung_runs).where(exact_rung_runs.c.batch_id.in_(keys[2:])).values(stats={}))
    with warehouse.engine.connect() as conn:
        assert batch_rates(conn, keys[3], window=10) == expected
