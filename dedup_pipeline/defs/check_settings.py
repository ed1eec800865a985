"""Settings of the asset checks (the `checks` resource, editable in the launchpad).

The collapse-rate band itself (`min_collapse_rate`, `max_collapse_rate`,
`min_records_for_check`) stays on the `ladder` resource, where it always was.
"""

from __future__ import annotations

import dagster as dg
from pydantic import Field

from dedup_pipeline.quality.collapse import CollapseRules


class ChecksResource(dg.ConfigurableResource):
    """How strict the asset checks are: collapse-rate history, the quarantine bound, the seen-set's fill."""

    history_window: int = Field(default=20, description="Earlier batches the collapse rate is compared against.")
    min_history: int = Field(default=3, description="Batches of history needed before the trailing median is used.")
    collapse_ratio: float = Field(
        default=0.25, description="Collapse-rate check fails (error) below this fraction of the trailing median."
    )
    jump_delta: float = Field(default=0.30, description="Warn when the rate is more than this above the trailing median...")
    jump_mads: float = Field(default=5.0, description="...and more than this many robust deviations (1.4826 x MAD) above it.")
    max_quarantine_rate: float = Field(default=0.05, description="Quarantine-rate check fails above this share of a batch's lines.")
    min_lines_for_quarantine_check: int = Field(default=20, description="Smaller batches pass the quarantine-rate check.")
    max_seen_set_fill: float = Field(
        default=0.9, description="Seen-set check warns when a Bloom filter holds more than this share of its capacity."
    )

    def collapse_rules(self, band_low: float, band_high: float, min_records: int) -> CollapseRules:
        return CollapseRules(
            band_low=band_low, band_high=band_high, min_records=min_records, window=self.history_window,
            min_history=self.min_history, collapse_ratio=self.collapse_ratio, jump_delta=self.jump_delta,
            jump_mads=self.jump_mads,
        )
