"""Bulk writes: COPY on PostgreSQL, executemany on SQLite."""

from __future__ import annotations

from datetime import UTC

from sqlalchemy import select


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
