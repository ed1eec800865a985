"""Bulk writes: integer columns framed as one binary COPY on PostgreSQL, executemany on SQLite."""

from __future__ import annotations

from datetime import UTC

import numpy as np
import pytest
from sqlalchemy import select

from dedup_pipeline.store.bulk import copy_int_columns
from dedup_pipeline.store.schema import lsh_buckets, near_duplicate_links


def test_integer_columns_arrive_exactly_including_the_int64_extremes(warehouse):
    buckets = np.array([-(2**63), -1, 0, 1, 2**63 - 1, 123_456_789_012], dtype=np.int64)
    bands = np.arange(len(buckets), dtype=np.int32) * 1000
    owners = np.array([1, 2, 3, 2**40, 5, 6], dtype=np.int64)
    with warehouse.engine.begin() as conn:
        copy_int_columns(conn, lsh_buckets, {"band": bands, "bucket": buckets, "record_id": owners})
        copy_int_columns(conn, lsh_buckets, {"band": bands[:0], "bucket": buckets[:0], "record_id": owners[:0]})
    with warehouse.engine.connect() as conn:
        stored = sorted(conn.execute(select(lsh_buckets.c.band, lsh_buckets.c.bucket, lsh_buckets.c.record_id)).all())
    assert stored == sorted(zip(bands.tolist(), buckets.tolist(), owners.tolist()))


def test_a_float_column_is_refused_before_anything_is_sent(warehouse):
    with warehouse.engine.begin() as conn, pytest.raises(TypeError, match="not an integer column"):
        copy_int_columns(conn, near_duplicate_links, {"similarity": np.array([1])})


def test_json_columns_take_values_or_with_json_as_text_the_text_a_worker_encoded(warehouse):
    """Both arrive as the same JSON value; `json_as_text` only spares the pass over every row."""
    from datetime import datetime

    from dedup_pipeline.store.bulk import copy_rows
    from dedup_pipeline.store.schema import exact_rung_runs

    now = datetime(2026, 12, 1, tzinfo=UTC)
    columns = ("batch_id", "run_id", "finished_at", "stats")
    with warehouse.engine.begin() as conn:
        copy_rows(conn, exact_rung_runs, columns, [("a", "r", now, {"n": 1, "s": "ü"})])
        copy_rows(conn, exact_rung_runs, columns, [("b", "r", now, '{"n": 2, "s": "ü"}')], json_as_text=True)
    with warehouse.engine.connect() as conn:
        stored = conn.execute(select(exact_rung_runs.c.stats).order_by(exact_rung_runs.c.batch_id)).scalars().all()
    assert stored == [{"n": 1, "s": "ü"}, {"n": 2, "s": "ü"}]
