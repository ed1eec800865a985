"""Retention (dedup_pipeline.ladder.retention): identifiers and copies are kept only for their time."""

from __future__ import annotations

from datetime import timedelta

import pytest

from dedup_pipeline.ladder.retention import RetentionSettings, prune_retention
from dedup_pipeline.store.schema import (
    canonical_records,
    dedup_decisions,
    quarantine,
    record_history,
    records,
)
from dedup_pipeline.store.warehouse import utcnow
from dedup_pipeline_tests.erasure_helpers import T0, count, crawl_two_days, run_ladder
from dedup_pipeline_tests.helpers import listing, write_batch


@pytest.fixture
def crawled(warehouse, tmp_path):
    return crawl_two_days(warehouse, tmp_path)


def test_retention_prunes_only_what_is_past_its_time(warehouse, crawled):
    decisions, history, staged, quarantined = (
        count(warehouse, t) for t in (dedup_decisions, record_history, canonical_records, quarantine)
    )
    assert decisions and history and staged and quarantined
    kept = prune_retention(warehouse, RetentionSettings(staging_days=0), now=utcnow() + timedelta(days=29))
    assert kept.pruned == {"dedup_decisions": 0, "record_history": 0, "quarantine": 0}
    later = prune_retention(
        warehouse, RetentionSettings(batch_size=3, staging_days=10_000), now=utcnow() + timedelta(days=91)
    )
    # Decisions (90 days) and quarantine (30) are past their time; history (365) and staging (10,000 days) are not.
    assert later.pruned == {
        "dedup_decisions": decisions,
        "record_history": 0,
        "canonical_records": 0,
        "quarantine": quarantined,
    }
    assert count(warehouse, record_history) == history and count(warehouse, canonical_records) == staged
    final = prune_retention(warehouse, RetentionSettings(), now=utcnow() + timedelta(days=400))
    assert final.pruned["record_history"] == history and final.pruned["canonical_records"] == staged  # batches of 2023
    assert count(warehouse, records) == 14  # the warehouse itself is never pruned


def test_staged_rows_are_kept_for_their_time_after_staging_whatever_the_file_time(warehouse, tmp_path):
    """Breaks: staged rows were pruned by their file's landing time, so a batch whose file kept an old time (`cp -p`)
    lost its staged rows minutes after it ran."""
    folder = tmp_path / "landing"
    write_batch(folder, "old-file", [listing(1), listing(2)], landed=T0)  # 2023, as an archived crawl's file
    run_ladder(warehouse, folder, "old-file")
    staged = count(warehouse, canonical_records)
    assert staged == 2
    assert prune_retention(warehouse, RetentionSettings()).pruned["canonical_records"] == 0
    month = prune_retention(warehouse, RetentionSettings(), now=utcnow() + timedelta(days=31))
    assert month.pruned["canonical_records"] == staged and count(warehouse, canonical_records) == 0


def test_retention_settings_come_from_the_environment(monkeypatch):
    monkeypatch.setenv("DEDUP_DECISION_RETENTION_DAYS", "7")
    monkeypatch.setenv("DEDUP_QUARANTINE_RETENTION_DAYS", "0")
    settings = RetentionSettings.from_env(history_days=30)
    assert (settings.decision_days, settings.quarantine_days, settings.history_days, settings.staging_days) == (
        7,
        0,
        30,
        30,
    )
    monkeypatch.setenv("DEDUP_HISTORY_RETENTION_DAYS", "a week")
    with pytest.raises(ValueError, match="DEDUP_HISTORY_RETENTION_DAYS"):
        RetentionSettings.from_env()
