"""Is a batch's collapse rate normal? Judged against a fixed band and the trailing median of earlier batches.

Pure: the caller reads the rates (see `dedup_pipeline.quality.history`). The
collapse rate is exact duplicates / records that reached the exact rung.

- A rate that **collapses toward zero** (below `collapse_ratio` x the trailing
  median) is the classic sign of a volatile field leaking into the hash: every
  re-crawl suddenly looks new. That is an error.
- A rate that **jumps far above** the trailing median (more than
  `max(jump_delta, jump_mads x 1.4826 x MAD)` above it) means the crawl
  re-fetched far more unchanged content than usual (a stuck paginator, a replayed
  feed, or a hash rule that merges too much). That is a warning.
- The fixed band `[band_low, band_high]` always applies too: it is the floor of
  protection when there is no history yet, and the history can only narrow it.
  Outside it is a warning: without history, a rate near zero may just be a
  source's first crawl.

Batches smaller than `min_records` are not judged (`judged` is False: the
check reports a warning that says so, never a pass) and are left out of the
history, as are batches whose rate is unknown.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from statistics import median

#: Scale factor that makes the median absolute deviation comparable to a standard deviation.
MAD_TO_SIGMA = 1.4826


@dataclass(frozen=True)
class CollapseRules:
    band_low: float = 0.01
    band_high: float = 0.95
    min_records: int = 100
    window: int = 20
    min_history: int = 3
    collapse_ratio: float = 0.25
    jump_delta: float = 0.30
    jump_mads: float = 5.0

    def __post_init__(self) -> None:
        if not 0.0 <= self.band_low <= self.band_high <= 1.0:
            raise ValueError("the collapse band must satisfy 0 <= band_low <= band_high <= 1")
        if self.window < 1 or self.min_history < 1:
            raise ValueError("window and min_history must be at least 1")


@dataclass(frozen=True)
class BatchRate:
    """One batch's first decisions: how many records reached the exact rung and how many were exact duplicates."""

    batch_id: str
    records_in: int
    duplicates: int

    @property
    def rate(self) -> float:
        return self.duplicates / self.records_in if self.records_in else 0.0


@dataclass(frozen=True)
class CollapseVerdict:
    batch_id: str
    rate: float
    records_in: int
    lower_bound: float
    upper_bound: float
    history: tuple[float, ...]
    trailing_median: float | None
    trailing_mad: float | None
    passed: bool
    error: bool  # True when the rate collapsed below the trailing median's share: a bug, not a crawl quirk
    reasons: list[str] = field(default_factory=list)
    judged: bool = True  # False when the batch is too small to say anything about its rate

    @property
    def note(self) -> str:
        if self.reasons:
            return "; ".join(self.reasons)
        if self.records_in < 1:
            return "no records reached the exact rung"
        return "in band"


def judge_collapse(current: BatchRate, history: Sequence[BatchRate], rules: CollapseRules) -> CollapseVerdict:
    """The verdict on `current` given earlier batches (most recent first)."""
    usable = [h.rate for h in history if h.records_in >= rules.min_records][: rules.window]
    lower, upper = rules.band_low, rules.band_high
    m = mad = None
    if len(usable) >= rules.min_history:
        m = median(usable)
        mad = median(abs(r - m) for r in usable)
        lower = max(lower, m * rules.collapse_ratio)
        upper = min(upper, m + max(rules.jump_delta, rules.jump_mads * MAD_TO_SIGMA * mad))
        upper = max(upper, lower)
    rate = current.rate
    reasons: list[str] = []
    too_small = current.records_in < rules.min_records
    if too_small:
        reasons.append(f"batch too small to judge ({current.records_in} < {rules.min_records} records)")
        lower, upper = rules.band_low, rules.band_high  # not judged: only the fixed band is worth showing
    elif rate < lower:
        if m is not None and rate < m * rules.collapse_ratio:
            reasons.append(
                f"collapsed toward zero: {rate:.3f} is below {rules.collapse_ratio:g} x the trailing median {m:.3f} "
                "(a volatile field may have leaked into the hash)"
            )
        else:
            reasons.append(
                f"below the fixed band: {rate:.3f} < {rules.band_low:g}"
                + (
                    ""
                    if m is not None
                    else " (no history of this source yet to tell a first crawl from a leaked field)"
                )
            )
    elif rate > upper:
        if m is not None and upper < rules.band_high:
            reasons.append(f"jumped far above the trailing median {m:.3f}: {rate:.3f} > {upper:.3f}")
        else:
            reasons.append(f"above the fixed band: {rate:.3f} > {rules.band_high:g}")
    passed = not too_small and lower <= rate <= upper
    collapsed = m is not None and rate < m * rules.collapse_ratio  # the leak's signature: only history shows it
    return CollapseVerdict(
        batch_id=current.batch_id,
        rate=rate,
        records_in=current.records_in,
        lower_bound=lower,
        upper_bound=upper,
        history=tuple(usable),
        trailing_median=m,
        trailing_mad=mad,
        passed=passed,
        error=not passed and collapsed,
        reasons=reasons,
        judged=not too_small,
    )
