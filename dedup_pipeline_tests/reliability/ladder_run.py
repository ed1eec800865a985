"""Running the real ladder (the functions the assets call) and reading back what happened to each line."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import func, select

from dedup_pipeline.core.near import NearDupParams
from dedup_pipeline.ladder.canonical import CanonicalReport, canonicalise_batch
from dedup_pipeline.ladder.exact import ExactReport, deduplicate_batch
from dedup_pipeline.ladder.near import NearReport, cluster_batch
from dedup_pipeline.ladder.raw import RawReport, ingest_raw_batch
from dedup_pipeline.ladder.settings import LadderSettings, NearSettings
from dedup_pipeline.landing import find_batch
from dedup_pipeline.store.schema import (
    canonical_records,
    crawl_batches,
    dedup_decisions,
    quarantine,
    record_hashes,
    record_history,
    records,
)
from dedup_pipeline.store.seen_set import SeenSet
from dedup_pipeline.store.warehouse import Warehouse
from dedup_pipeline_tests.helpers import new_run_id

SETTINGS = LadderSettings(chunk_size=7)
NEAR = NearDupParams(threshold=0.5)


@dataclass
class LadderReports:
    raw: RawReport
    canonical: CanonicalReport
    exact: ExactReport
    near: NearReport


def run_ladder(
    warehouse: Warehouse,
    folder: Path,
    key: str,
    settings: LadderSettings = SETTINGS,
    seen_set: SeenSet | None = None,
    run_id: str | None = None,
) -> LadderReports:
    """All four rungs for one batch, as the `dedup_ladder` job runs them."""
    raw = ingest_raw_batch(warehouse, find_batch(folder, key))
    canonical = canonicalise_batch(warehouse, key, settings)
    exact = deduplicate_batch(warehouse, key, run_id or new_run_id(key), settings, seen_set)
    near = cluster_batch(warehouse, key, NearSettings(params=NEAR, chunk_size=settings.chunk_size))
    return LadderReports(raw, canonical, exact, near)


def count(engine, table, *where) -> int:
    with engine.connect() as conn:
        return conn.execute(select(func.count()).select_from(table).where(*where)).scalar_one()


def quarantined_lines(engine, batch: str) -> dict[int, tuple[str, str, bytes]]:
    """line -> (rung, reason, raw bytes) of the batch's quarantine rows."""
    with engine.connect() as conn:
        rows = conn.execute(
            select(quarantine.c.line_no, quarantine.c.rung, quarantine.c.reason, quarantine.c.raw_line).where(
                quarantine.c.batch_id == batch
            )
        ).all()
    return {line: (rung, reason, bytes(raw)) for line, rung, reason, raw in rows}


def canonical_lines(engine, batch: str) -> dict[int, str]:
    """line -> natural key of the batch's canonical records."""
    with engine.connect() as conn:
        rows = conn.execute(
            select(canonical_records.c.line_no, canonical_records.c.natural_key).where(
                canonical_records.c.batch_id == batch
            )
        ).all()
    return dict(rows)


def decisions_by_line(engine, batch: str) -> dict[int, list[str]]:
    """line -> the decisions logged for it, in log order (one per run of the exact rung)."""
    out: dict[int, list[str]] = {}
    with engine.connect() as conn:
        for line, decision in conn.execute(
            select(dedup_decisions.c.line_no, dedup_decisions.c.decision)
            .where(dedup_decisions.c.batch_id == batch)
            .order_by(dedup_decisions.c.decision_id)
        ):
            out.setdefault(line, []).append(decision)
    return out


def stored_payloads(engine) -> dict[str, dict]:
    """natural key -> payload of every current row."""
    with engine.connect() as conn:
        return {key: payload for key, payload in conn.execute(select(records.c.natural_key, records.c.payload))}


def hash_errors(engine) -> dict[tuple[str, str], str]:
    """(natural key, version) -> the reason that version could not hash the stored row."""
    with engine.connect() as conn:
        rows = conn.execute(
            select(records.c.natural_key, record_hashes.c.hash_version, record_hashes.c.error)
            .join(record_hashes, record_hashes.c.record_id == records.c.record_id)
            .where(record_hashes.c.error.is_not(None))
        ).all()
    return {(key, version): error for key, version, error in rows}


def invariants(engine) -> dict:
    """Figures that must hold in any warehouse state: one row per key and per content, every row hashed."""
    with engine.connect() as conn:
        rows = conn.execute(select(func.count()).select_from(records)).scalar_one()
        keys = conn.execute(select(func.count(func.distinct(records.c.natural_key)))).scalar_one()
        contents = conn.execute(
            select(func.count()).select_from(
                select(records.c.hash_version, records.c.content_hash).distinct().subquery()
            )
        ).scalar_one()
        unhashed = conn.execute(
            select(func.count())
            .select_from(records)
            .where(
                ~select(record_hashes.c.record_id)
                .where(
                    record_hashes.c.record_id == records.c.record_id,
                    record_hashes.c.hash_version == records.c.hash_version,
                )
                .exists()
            )
        ).scalar_one()
        history = conn.execute(select(func.count()).select_from(record_history)).scalar_one()
        batches = conn.execute(select(func.count()).select_from(crawl_batches)).scalar_one()
    return {
        "rows": rows,
        "keys": keys,
        "contents": contents,
        "rows_without_active_hash": unhashed,
        "history": history,
        "batches": batches,
    }


def assert_one_row_per_key_and_content(engine) -> dict:
    figures = invariants(engine)
    assert figures["rows"] == figures["keys"] == figures["contents"], figures
    assert figures["rows_without_active_hash"] == 0, figures
    return figures


def clean_run(
    tmp_path: Path, folder: Path, keys: list[str], settings: LadderSettings = SETTINGS, name: str = "clean"
) -> dict:
    """The tables one clean, sequential run of `keys` gives, on a private SQLite warehouse (the baseline)."""
    from dedup_pipeline_tests.helpers import snapshot

    warehouse = Warehouse(f"sqlite:///{tmp_path / f'{name}.sqlite'}").create_schema()
    try:
        for key in keys:
            run_ladder(warehouse, folder, key, settings)
        return snapshot(warehouse.engine)
    finally:
        warehouse.dispose()


def set_active_version(warehouse: Warehouse, version: str) -> None:
    """Make `version` the active hash version of a fresh warehouse (as a completed rehash switch would)."""
    from sqlalchemy import update

    from dedup_pipeline.store.schema import settings as settings_table
    from dedup_pipeline.store.warehouse import ACTIVE_HASH_VERSION, utcnow

    with warehouse.engine.begin() as conn:
        conn.execute(
            update(settings_table)
            .where(settings_table.c.name == ACTIVE_HASH_VERSION)
            .values(value=version, updated_at=utcnow())
        )
