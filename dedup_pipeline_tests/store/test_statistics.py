"""Planner statistics refreshed where a run changes a table faster than autovacuum looks at it."""

from __future__ import annotations

import time

import numpy as np
import pytest
from sqlalchemy import text

from dedup_pipeline.store.bulk import copy_int_columns
from dedup_pipeline.store.schema import lsh_buckets, minhash_signatures
from dedup_pipeline.store.warehouse import GROWTH_FLOOR, analyze_grown

on_postgresql = pytest.mark.parametrize("warehouse_url", ["postgresql"], indirect=True)


def add_buckets(warehouse, start: int, n: int) -> None:
    ids = np.arange(start, start + n, dtype=np.int64)
    with warehouse.engine.begin() as conn:
        copy_int_columns(conn, lsh_buckets, {"band": np.zeros(n, dtype=np.int32), "bucket": ids, "record_id": ids})


def changed_since_analyze(warehouse) -> int:
    with warehouse.engine.connect() as conn:
        return conn.execute(
            text("SELECT n_mod_since_analyze FROM pg_stat_user_tables WHERE relname = 'lsh_buckets'")
        ).scalar_one()


def wait_for_counter(warehouse, at_least: int) -> None:
    """PostgreSQL publishes a backend's row counts up to a second or so after its commit."""
    deadline = time.monotonic() + 30
    while changed_since_analyze(warehouse) < at_least:
        assert time.monotonic() < deadline, "the statistics counter never caught up"
        time.sleep(0.2)


@on_postgresql
def test_a_table_that_grew_is_analysed_once_and_a_small_change_is_left_to_autovacuum(warehouse):
    add_buckets(warehouse, 0, GROWTH_FLOOR + 2000)
    wait_for_counter(warehouse, GROWTH_FLOOR + 2000)
    with warehouse.engine.begin() as conn:
        assert analyze_grown(conn, lsh_buckets, minhash_signatures) == ["lsh_buckets"]  # the empty table is left
    with warehouse.engine.connect() as conn:
        rows = conn.execute(text("SELECT reltuples FROM pg_class WHERE relname = 'lsh_buckets'")).scalar_one()
    assert rows == GROWTH_FLOOR + 2000
    assert changed_since_analyze(warehouse) == 0

    add_buckets(warehouse, 10**6, 3000)  # below the floor and below half the table
    wait_for_counter(warehouse, 3000)
    with warehouse.engine.begin() as conn:
        assert analyze_grown(conn, lsh_buckets) == []
    assert changed_since_analyze(warehouse) == 3000


def test_nothing_to_do_on_sqlite(tmp_path):
    from dedup_pipeline.store.warehouse import Warehouse

    warehouse = Warehouse(f"sqlite:///{tmp_path / 'w.sqlite'}").create_schema()
    with warehouse.engine.begin() as conn:
        assert analyze_grown(conn, lsh_buckets) == []
    warehouse.dispose()
