"""Planner statistics refreshed where a run grows a table faster than autovacuum looks at it."""

from __future__ import annotations

import time

import numpy as np
import pytest
from sqlalchemy import text

from dedup_pipeline.store.bulk import copy_int_columns
from dedup_pipeline.store.schema import lsh_buckets, minhash_signatures
from dedup_pipeline.store.warehouse import ANALYZE_FLOOR, Warehouse, analyze_grown

on_postgresql = pytest.mark.parametrize("warehouse_url", ["postgresql"], indirect=True)


def without_autovacuum(warehouse) -> None:
    """Autovacuum would analyse the table on its own at any moment; these tests need to know who did."""
    with warehouse.engine.begin() as conn:
        conn.execute(text("ALTER TABLE lsh_buckets SET (autovacuum_enabled = false)"))


def add_buckets(warehouse, start: int, n: int) -> None:
    ids = np.arange(start, start + n, dtype=np.int64)
    with warehouse.engine.begin() as conn:
        copy_int_columns(conn, lsh_buckets, {"band": np.zeros(n, dtype=np.int32), "bucket": ids, "record_id": ids})


def counted_and_live(warehouse) -> tuple[float, int]:
    """(rows the statistics counted, rows PostgreSQL's counter says are live) of lsh_buckets."""
    with warehouse.engine.connect() as conn:
        return tuple(
            conn.execute(
                text(
                    "SELECT c.reltuples, s.n_live_tup FROM pg_stat_user_tables s JOIN pg_class c ON c.oid = s.relid "
                    "WHERE s.relname = 'lsh_buckets'"
                )
            ).one()
        )


def wait_for_live_rows(warehouse, n: int) -> None:
    """PostgreSQL publishes a backend's row counts up to a second or so after its commit."""
    deadline = time.monotonic() + 30
    while counted_and_live(warehouse)[1] < n:
        assert time.monotonic() < deadline, "the statistics counter never caught up"
        time.sleep(0.2)


def grown(warehouse, tables) -> list[str]:
    with warehouse.engine.begin() as conn:
        return analyze_grown(conn, tables)


@on_postgresql
def test_a_table_is_analysed_when_it_grew_by_half_and_by_the_floor(warehouse):
    without_autovacuum(warehouse)
    add_buckets(warehouse, 0, ANALYZE_FLOOR + 2000)
    wait_for_live_rows(warehouse, ANALYZE_FLOOR + 2000)
    assert grown(warehouse, {lsh_buckets: ("record_id",), minhash_signatures: ()}) == ["lsh_buckets"]  # empty: left
    assert counted_and_live(warehouse)[0] == ANALYZE_FLOOR + 2000  # a column-limited ANALYZE counts the rows too
    assert grown(warehouse, {lsh_buckets: ("record_id",)}) == []  # at once again: nothing new

    add_buckets(warehouse, 10**6, 3000)  # below the floor and below half the table
    wait_for_live_rows(warehouse, ANALYZE_FLOOR + 5000)
    assert grown(warehouse, {lsh_buckets: ()}) == []
    assert counted_and_live(warehouse)[0] == ANALYZE_FLOOR + 2000

    add_buckets(warehouse, 2 * 10**6, 8000)  # 11,000 more than counted: past the floor and half the table
    wait_for_live_rows(warehouse, ANALYZE_FLOOR + 13000)
    assert grown(warehouse, {lsh_buckets: ()}) == ["lsh_buckets"]
    assert counted_and_live(warehouse)[0] == ANALYZE_FLOOR + 13000


def test_nothing_to_do_on_sqlite(tmp_path):
    warehouse = Warehouse(f"sqlite:///{tmp_path / 'w.sqlite'}").create_schema()
    assert grown(warehouse, {lsh_buckets: ()}) == []
    warehouse.dispose()
