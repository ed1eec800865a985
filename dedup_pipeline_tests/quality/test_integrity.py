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

    # One violation of each kind in each table the batch wrote: rows, their hashes, its decision-log lines.
    with warehouse.engine.begin() as conn:
        victims = conn.execute(
            select(records.c.record_id).where(records.c.last_batch_id == keys[1]).order_by(records.c.record_id)
        ).scalars()
        first, second, third = list(victims)[:3]
        conn.execute(update(records).where(records.c.record_id == first).values(content_hash=b"\x03" * 31))
        conn.execute(update(records).where(records.c.record_id == second).values(hash_version="content/8"))
        hashes = record_hashes.c
        conn.execute(
            update(record_hashes)
            .where(hashes.record_id == third, hashes.hash_version == "content/2")
            .values(content_hash=b"\x01" * 31)
        )
        conn.execute(
            update(record_hashes)
            .where(hashes.record_id == first, hashes.hash_version == "content/1")
            .values(hash_version="content/7")
        )
        for line_no, version, digest in ((998, "content/1", b"\x02" * 33), (999, "content/9", b"\x02" * 32)):
            row = dict(batch_id=keys[1], line_no=line_no, run_id="rogue", natural_key="k", decision="new")
            row.update(hash_version=version, content_hash=digest, decided_at=utcnow())
            conn.execute(insert(dedup_decisions).values(row))
    with warehouse.engine.connect() as conn:
        broken = check_batch_integrity(conn, keys[1])
        other = check_batch_integrity(conn, keys[0])
    # malformed: a row's digest, a hash row's, a decision's; unknown: a row's version, a hash row's, a decision's
    assert (broken.rows_checked, broken.malformed_hashes, broken.unknown_versions) == (120, 3, 3)
    assert (broken.duplicate_content, broken.duplicate_keys) == (0, 0) and not broken.passed
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
