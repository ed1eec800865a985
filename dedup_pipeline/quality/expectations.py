"""Great Expectations 1.x suites for `canonical_records` and `deduplicated_records`, and running them.

A suite is plain data here (`Expect` specs); Great Expectations is imported
only inside `validate` (the import takes seconds, and every Dagster step
process that merely loads the code location would pay it otherwise). Each run
uses its own ephemeral context with a pandas data source, analytics off and no
progress bars. dagster-ge cannot be used: it pins Great Expectations below 1.0.

What the suites expect of the key columns:
- not null: natural key, canonical URL, versions, digest under the active version;
- format: the canonical URL is `http(s)`, with a lower-case host, a path and no
  fragment or whitespace; digests are 64 lower-case hex digits (32 bytes);
- value sets: the URL version is one this code knows, the hash version is in
  `HASH_RULES`;
- uniqueness: one canonical row per line; one warehouse row per natural key
  and per `(hash_version, content_hash)`;
- completeness: canonical rows = lines the raw rung parsed - lines the canonical
  rung quarantined (nothing goes missing silently).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from dedup_pipeline import environment, heap
from dedup_pipeline.core.hashing import HASH_RULES
from dedup_pipeline.core.url import URL_VERSIONS

#: 32 bytes of SHA-256 as lower-case hex.
HEX_DIGEST = r"^[0-9a-f]{64}$"
#: A canonical URL (`url/1`, `url/2`): http(s), userinfo (url/1), lower-case host (IDNA punycode), a path, no fragment.
CANONICAL_URL = r"^https?://(?:[^\s/?#@]*@)?[^\s/?#@A-Z]+/[^\s#]*$"
KNOWN_URL_VERSIONS = URL_VERSIONS


@dataclass(frozen=True)
class Expect:
    """One expectation: the Great Expectations class name and its arguments."""

    kind: str
    kwargs: dict = field(default_factory=dict)

    @property
    def label(self) -> str:
        short = self.kind.removeprefix("Expect").removeprefix("ColumnValuesTo")
        target = self.kwargs.get("column") or ",".join(self.kwargs.get("column_list", ())) or "table"
        return f"{short}({target})"


def canonical_suite(expected_rows: int | None = None) -> list[Expect]:
    """Expectations on a batch's `canonical_records` rows (see `frames.canonical_frame`)."""
    suite = [
        Expect("ExpectColumnValuesToNotBeNull", {"column": c})
        for c in ("natural_key", "canonical_url", "url_version", "hash_version", "content_hash")
    ]
    suite += [
        Expect("ExpectColumnValuesToBeUnique", {"column": "line_no"}),
        Expect("ExpectColumnValuesToMatchRegex", {"column": "canonical_url", "regex": CANONICAL_URL}),
        Expect("ExpectColumnValuesToMatchRegex", {"column": "content_hash", "regex": HEX_DIGEST}),
        Expect("ExpectColumnValuesToBeInSet", {"column": "url_version", "value_set": list(KNOWN_URL_VERSIONS)}),
        Expect("ExpectColumnValuesToBeInSet", {"column": "hash_version", "value_set": sorted(HASH_RULES)}),
    ]
    if expected_rows is not None:
        suite.append(Expect("ExpectTableRowCountToEqual", {"value": expected_rows}))
    return suite


def deduplicated_suite() -> list[Expect]:
    """Expectations on the warehouse rows dated to a batch: stored or re-crawled unchanged by it.

    See `frames.records_frame`.
    """
    suite = [
        Expect("ExpectColumnValuesToNotBeNull", {"column": c})
        for c in ("natural_key", "canonical_url", "url_version", "hash_version", "content_hash")
    ]
    return suite + [
        Expect("ExpectColumnValuesToBeUnique", {"column": "natural_key"}),
        Expect("ExpectCompoundColumnsToBeUnique", {"column_list": ["hash_version", "content_hash"]}),
        Expect("ExpectColumnValuesToMatchRegex", {"column": "canonical_url", "regex": CANONICAL_URL}),
        Expect("ExpectColumnValuesToMatchRegex", {"column": "content_hash", "regex": HEX_DIGEST}),
        Expect("ExpectColumnValuesToBeInSet", {"column": "url_version", "value_set": list(KNOWN_URL_VERSIONS)}),
        Expect("ExpectColumnValuesToBeInSet", {"column": "hash_version", "value_set": sorted(HASH_RULES)}),
    ]


@dataclass
class Outcome:
    """One expectation's result, without record values (keys and URLs can be personal data)."""

    label: str
    success: bool
    unexpected: int | None = None
    unexpected_percent: float | None = None
    observed: Any = None
    examples: list = field(default_factory=list)  # only for value-set expectations: the unknown versions
    error: str | None = None


@dataclass
class SuiteReport:
    suite: str
    rows: int
    outcomes: list[Outcome]

    @property
    def success(self) -> bool:
        return all(o.success for o in self.outcomes)

    @property
    def failed(self) -> list[Outcome]:
        return [o for o in self.outcomes if not o.success]

    def markdown(self) -> str:
        lines = ["| expectation | result | unexpected | observed |", "|---|---|---:|---|"]
        for o in self.outcomes:
            result = "passed" if o.success else ("error: " + o.error if o.error else "FAILED")
            observed = (
                ", ".join(map(str, o.examples)) if o.examples else ("" if o.observed is None else str(o.observed))
            )
            lines.append(f"| `{o.label}` | {result} | {'' if o.unexpected is None else o.unexpected} | {observed} |")
        return "\n".join(lines)


def _context():
    environment.quiet_great_expectations()
    first_import = "great_expectations" not in sys.modules
    import great_expectations as gx
    from great_expectations.data_context.types.base import (
        DataContextConfig,
        InMemoryStoreBackendDefaults,
        ProgressBarsConfig,
    )

    config = DataContextConfig(
        analytics_enabled=False,
        progress_bars=ProgressBarsConfig(globally=False),
        store_backend_defaults=InMemoryStoreBackendDefaults(),
    )
    if first_import:  # the largest import of a run's process: its objects live as long as the process
        heap.settle()
    return gx, gx.get_context(mode="ephemeral", project_config=config)


def _outcome(spec: Expect, result) -> Outcome:
    info = result.exception_info or {}
    if info.get("raised_exception"):
        return Outcome(spec.label, False, error=str(info.get("exception_message"))[:200])
    details = result.result or {}
    examples = []
    if spec.kind == "ExpectColumnValuesToBeInSet" and not result.success:
        examples = sorted({str(v) for v in details.get("partial_unexpected_list") or []})[:5]
    observed = details.get("observed_value")
    return Outcome(
        spec.label,
        bool(result.success),
        details.get("unexpected_count"),
        details.get("unexpected_percent"),
        observed if isinstance(observed, (int, float, str)) else None,
        examples,
    )


def validate(frame: pd.DataFrame, suite_name: str, specs: Sequence[Expect]) -> SuiteReport:
    """Run the suite over the frame in an ephemeral Great Expectations context."""
    gx, context = _context()
    import great_expectations.expectations as gxe

    batch = (
        context.data_sources.add_pandas(f"{suite_name}_source")
        .add_dataframe_asset(suite_name)
        .add_batch_definition_whole_dataframe("batch")
        .get_batch(batch_parameters={"dataframe": frame})
    )
    expectations = [getattr(gxe, spec.kind)(**spec.kwargs, meta={"spec": i}) for i, spec in enumerate(specs)]
    result = batch.validate(gx.ExpectationSuite(name=suite_name, expectations=expectations), result_format="SUMMARY")
    by_spec = {r.expectation_config.meta["spec"]: r for r in result.results}
    outcomes = [_outcome(spec, by_spec[i]) for i, spec in enumerate(specs)]
    return SuiteReport(suite_name, len(frame), outcomes)
