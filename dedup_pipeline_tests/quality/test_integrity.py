"""The warehouse invariants behind the integrity check (dedup_pipeline.quality.integrity)."""

from __future__ import annotations

import pytest
from sqlalchemy import insert, inspect, select, text, update

from dedup_pipeline.quality.integrity import check_batch_integrity
from dedup_pipeline.store.schema import dedup_decisions, record_hashes, records
from dedup_pipeline.store.warehouse import utcnow
from dedup_pipeline_tests.quality.common import run_rungs, sliding_batches


def test_integrity_passes_on_a_clean_warehouse_and_counts_each_violation(warehouse, tmp_path):
    folder = tmp_path / "landing"
    keys = sliding_batches(folder, 2)
    for key in keys:
        run_rungs(warehouse, folder, key, near=False)
    with warehouse.engine.connect() as conn:
        clean = check_batch_integrity(conn, keys[1])
    # the batch's 120 listings: 80 it stored, 40 re-crawled unchanged from batch 1 (their rows are dated to it)
    assert clean.passed and clean.rows_checked == 120 and clean.active_version == "content/1"

    with warehouse.engine.begin() as conn:
        victim = conn.execute(select(records.c.record_id).where(records.c.last_batch_id == keys[1]).limit(1)).scalar()
        conn.execute(
            update(record_hashes)
            .where(record_hashes.c.record_id == victim, record_hashes.c.hash_version == "content/2")
            .values(content_hash=b"\x01" * 31)
        )
        conn.execute(
            insert(dedup_decisions).values(
                batch_id=keys[1],
                line_no=999,
                run_id="rogue",
                natural_key="k",
                hash_version="content/9",
                content_hash=b"\x02" * 32,
                decision="new",
                decided_at=utcnow(),
            )
        )
    with warehouse.engine.connect() as conn:
        broken = check_batch_integrity(conn, keys[1])
        other = check_batch_integrity(conn, keys[0])
    assert (broken.malformed_hashes, broken.unknown_versions) == (1, 1) and not broken.passed
    assert (broken.duplicate_content, broken.duplicate_keys) == (0, 0)
    assert other.passed  # scoped to the batch's rows


@pytest.mark.postgres
def test_integrity_finds_duplicates_once_the_constraints_are_gone(pg_database_url, tmp_path):
    from sqlalchemy import create_engine

    from dedup_pipeline.store.warehouse import Warehouse

    engine = create_engine(pg_database_url)
    with engine.begin() as conn:
        conn.execute(text("DROP SCHEMA public CASCADE; CREATE SCHEMA public"))
    engine.dispose()
    warehouse = Warehouse(pg_database_url).create_schema()
    folder = tmp_path / "landing"
    [key] = sliding_batches(folder, 1)
    run_rungs(warehouse, folder, key, near=False)
    with warehouse.engine.begin() as conn:  # a migration that dropped the constraints, then a buggy writer
        for constraint in inspect(conn).get_unique_constraints("records"):
            conn.execute(text(f'ALTER TABLE records DROP CONSTRAINT "{constraint["name"]}"'))
        row = conn.execute(select(records).limit(1)).mappings().one()
        conn.execute(insert(records).values({k: v for k, v in row.items() if k != "record_id"}))
    with warehouse.engine.connect() as conn:
        report = check_batch_integrity(conn, key)
    warehouse.dispose()
    assert (report.duplicate_content, report.duplicate_keys) == (2, 2) and not report.passed
