"""Planner statistics refreshed where a run grows a table faster than autovacuum looks at it."""

from __future__ import annotations

import time
from datetime import UTC, datetime

import pytest
from sqlalchemy import text

from dedup_pipeline.store.bulk import copy_rows
from dedup_pipeline.store.schema import dedup_decisions, record_hashes
from dedup_pipeline.store.warehouse import (
    ANALYZE_FLOOR,
    BATCH_STATISTICS_TARGET,
    Warehouse,
    analyze_grown,
    analyze_new_batch,
)

on_postgresql = pytest.mark.parametrize("warehouse_url", ["postgresql"], indirect=True)


def without_autovacuum(warehouse) -> None:
    """Autovacuum would analyse the table on its own at any moment; these tests need to know who did."""
    with warehouse.engine.begin() as conn:
        conn.execute(text("ALTER TABLE dedup_decisions SET (autovacuum_enabled = false)"))


def add_rows(warehouse, start: int, n: int) -> None:
    """`n` rows in a table that has no foreign key (any table would do: the statistics are the subject)."""
    now = datetime(2026, 12, 1, tzinfo=UTC)
    with warehouse.engine.begin() as conn:
        copy_rows(
            conn,
            dedup_decisions,
            ("batch_id", "line_no", "run_id", "decision", "decided_at"),
            (("b", line, "r", "new", now) for line in range(start, start + n)),
        )


def counted_and_live(warehouse) -> tuple[float, int]:
    """(rows the statistics counted, rows PostgreSQL's counter says are live) of dedup_decisions."""
    with warehouse.engine.connect() as conn:
        return tuple(
            conn.execute(
                text(
                    "SELECT c.reltuples, s.n_live_tup FROM pg_stat_user_tables s JOIN pg_class c ON c.oid = s.relid "
                    "WHERE s.relname = 'dedup_decisions'"
                )
            ).one()
        )


def wait_for_live_rows(warehouse, n: int) -> None:
    """PostgreSQL publishes a backend's row counts up to a second or so after its commit."""
    deadline = time.monotonic() + 30
    while counted_and_live(warehouse)[1] < n:
        assert time.monotonic() < deadline, "the statistics counter never caught up"
        time.sleep(0.2)


def bounds(warehouse) -> int:
    """Histogram bounds of dedup_decisions.line_no: the target of the ANALYZE that made them, plus one."""
    with warehouse.engine.connect() as conn:
        return conn.execute(
            text(
                "SELECT array_length(histogram_bounds, 1) FROM pg_stats "
                "WHERE tablename = 'dedup_decisions' AND attname = 'line_no'"
            )
        ).scalar_one()


def grown(warehouse, tables) -> list[str]:
    with warehouse.engine.begin() as conn:
        return analyze_grown(conn, tables)


@on_postgresql
def test_a_table_is_analysed_when_it_grew_by_half_and_by_the_floor(warehouse):
    without_autovacuum(warehouse)
    add_rows(warehouse, 0, ANALYZE_FLOOR + 2000)
    wait_for_live_rows(warehouse, ANALYZE_FLOOR + 2000)
    assert grown(warehouse, {dedup_decisions: ("line_no",), record_hashes: ()}) == ["dedup_decisions"]  # empty: left
    assert counted_and_live(warehouse)[0] == ANALYZE_FLOOR + 2000  # a column-limited ANALYZE counts the rows too
    assert grown(warehouse, {dedup_decisions: ("line_no",)}) == []  # at once again: nothing new

    add_rows(warehouse, 10**6, 3000)  # below the floor and below half the table
    wait_for_live_rows(warehouse, ANALYZE_FLOOR + 5000)
    assert grown(warehouse, {dedup_decisions: ()}) == []
    assert counted_and_live(warehouse)[0] == ANALYZE_FLOOR + 2000

    add_rows(warehouse, 2 * 10**6, 8000)  # 11,000 more than counted: past the floor and half the table
    wait_for_live_rows(warehouse, ANALYZE_FLOOR + 13000)
    assert grown(warehouse, {dedup_decisions: ()}) == ["dedup_decisions"]
    assert counted_and_live(warehouse)[0] == ANALYZE_FLOOR + 13000


def test_nothing_to_do_on_sqlite(tmp_path):
    warehouse = Warehouse(f"sqlite:///{tmp_path / 'w.sqlite'}").create_schema()
    assert grown(warehouse, {dedup_decisions: ()}) == []
    warehouse.dispose()


@on_postgresql
def test_a_table_another_session_is_analysing_is_left_to_it_not_waited_for(warehouse):
    """Breaks: two lanes see one table grow and both analyse it; the other's ANALYZE holds the table's lock.

    Must hold: this session does not wait for that lock (it would hit its lock timeout), and the statistics are
    refreshed once the other lets go."""
    without_autovacuum(warehouse)
    add_rows(warehouse, 0, ANALYZE_FLOOR + 2000)
    wait_for_live_rows(warehouse, ANALYZE_FLOOR + 2000)
    with warehouse.engine.connect() as other:
        other.execute(text("LOCK TABLE dedup_decisions IN SHARE UPDATE EXCLUSIVE MODE"))  # what an ANALYZE takes
        with warehouse.engine.begin() as conn:
            conn.execute(text("SET LOCAL lock_timeout = '3s'"))
            started = time.monotonic()
            assert analyze_grown(conn, {dedup_decisions: ()}) == ["dedup_decisions"]
            assert time.monotonic() - started < 2
        assert counted_and_live(warehouse)[0] < ANALYZE_FLOOR  # skipped: the statistics are the old ones
        other.rollback()
    assert grown(warehouse, {dedup_decisions: ()}) == ["dedup_decisions"]
    assert counted_and_live(warehouse)[0] == ANALYZE_FLOOR + 2000


@on_postgresql
def test_a_statistics_target_sets_the_sample_of_that_analyze_only(warehouse):
    """Breaks: the near rung analyses its index on a small sample (`statistics_target`). Must hold: that ANALYZE
    keeps a histogram of the target's size, and the next one without a target is back to the default's."""
    without_autovacuum(warehouse)
    add_rows(warehouse, 0, ANALYZE_FLOOR + 2000)
    wait_for_live_rows(warehouse, ANALYZE_FLOOR + 2000)

    with warehouse.engine.begin() as conn:
        assert analyze_grown(conn, {dedup_decisions: ("line_no",)}, statistics_target=10) == ["dedup_decisions"]
    assert bounds(warehouse) == 11
    add_rows(warehouse, 10**6, ANALYZE_FLOOR)
    wait_for_live_rows(warehouse, 2 * ANALYZE_FLOOR + 2000)
    assert grown(warehouse, {dedup_decisions: ("line_no",)}) == ["dedup_decisions"]
    assert bounds(warehouse) == 101


@on_postgresql
def test_a_batch_is_analysed_on_a_small_sample_once_it_wrote_the_floor(warehouse):
    """Breaks: each batch's ANALYZE of `records` and `canonical_records` sampled 30,000 rows, a random read of as
    many pages of a wide table. Must hold: a batch under the floor is left alone; one at the floor is analysed on
    the batch sample, and an ANALYZE after it in another transaction is back to the default's."""
    without_autovacuum(warehouse)
    add_rows(warehouse, 0, ANALYZE_FLOOR + 2000)
    wait_for_live_rows(warehouse, ANALYZE_FLOOR + 2000)
    with warehouse.engine.begin() as conn:
        analyze_new_batch(conn, dedup_decisions, ("line_no",), ANALYZE_FLOOR - 1)
    assert counted_and_live(warehouse)[0] < ANALYZE_FLOOR  # not analysed
    with warehouse.engine.begin() as conn:
        analyze_new_batch(conn, dedup_decisions, ("line_no",), ANALYZE_FLOOR)
    assert bounds(warehouse) == BATCH_STATISTICS_TARGET + 1
    with warehouse.engine.begin() as conn:
        conn.execute(text("ANALYZE dedup_decisions (line_no)"))
    assert bounds(warehouse) == 101
