"""The collapse-rate verdict (dedup_pipeline.quality.collapse): pure, against a fixed band and the trailing median."""

from __future__ import annotations

import pytest

from dedup_pipeline.quality.collapse import BatchRate, CollapseRules, judge_collapse


def rates(*values, n=200):
    return [BatchRate(f"b{i}", n, round(v * n)) for i, v in enumerate(values)]


def test_fixed_band_applies_without_history():
    rules = CollapseRules(band_low=0.01, band_high=0.95, min_records=100)
    assert judge_collapse(BatchRate("x", 200, 40), [], rules).passed
    low = judge_collapse(BatchRate("x", 200, 0), [], rules)  # a first crawl, or a leak from day one: a warning
    assert not low.passed and not low.error and "below the fixed band" in low.note and "no history" in low.note
    high = judge_collapse(BatchRate("x", 200, 198), [], rules)
    assert not high.passed and not high.error and "above the fixed band" in high.note
    small = judge_collapse(BatchRate("x", 50, 0), [], rules)
    assert not small.judged and not small.passed and not small.error and "too small" in small.note


def test_history_catches_a_collapse_the_fixed_band_lets_through():
    rules = CollapseRules(band_low=0.01, min_records=100)
    history = rates(0.31, 0.33, 0.35, 0.32)
    leaked = judge_collapse(BatchRate("x", 200, 10), history, rules)  # 0.05: inside the fixed band
    assert not leaked.passed and leaked.error
    assert "collapsed toward zero" in leaked.note and leaked.trailing_median == pytest.approx(0.325)
    assert leaked.lower_bound == pytest.approx(0.325 * 0.25)
    normal = judge_collapse(BatchRate("x", 200, 56), history, rules)  # 0.28: ordinary variation
    assert normal.passed and normal.note == "in band"


def test_history_catches_a_jump_and_ignores_small_batches():
    rules = CollapseRules(min_records=100, min_history=3)
    history = rates(0.30, 0.32, 0.34) + [BatchRate("tiny", 10, 10)]  # the tiny batch is no evidence
    jump = judge_collapse(BatchRate("x", 200, 160), history, rules)  # 0.8, still inside the fixed band
    assert not jump.passed and not jump.error and "jumped far above" in jump.note
    assert jump.history == (0.30, 0.32, 0.34)
    too_little = judge_collapse(BatchRate("x", 200, 160), history[:2], rules)  # two batches: band only
    assert too_little.passed and too_little.trailing_median is None
