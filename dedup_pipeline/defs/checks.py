"""Asset checks, one per partition (crawl batch). Each is a few lines over `dedup_pipeline.quality`.

Which checks block (`blocking=True`: a failure fails the run and stops every
downstream asset) and which only report:

- `canonical_records` / `great_expectations_suite`: **blocks**. A broken
  canonicalisation (a malformed URL or digest, an unknown version, lost rows)
  must not reach the warehouse: records written with a broken key are
  duplicates nobody can find again.
- `deduplicated_records` / `warehouse_integrity`: **blocks**. A warehouse that
  breaks its own invariants must not feed the near-duplicate index.
- `canonical_records` / `quarantine_rate_under_bound`: warns over
  `max_quarantine_rate`: quarantined lines are kept aside with their reasons and
  the good records of the batch are fine. **Blocks** over
  `blocking_quarantine_rate` (any batch size): a batch that is mostly broken
  lines is a broken file or crawler, not a crawl to store.
- `deduplicated_records` / `collapse_rate_in_band`: reports (ERROR when the rate
  collapses, WARN when it jumps) without blocking: the rows are already stored
  correctly under the UNIQUE index, the rate judges the crawl or the hash rule,
  and the near-duplicate rung still links what a leaked volatile field split.
- `deduplicated_records` / `great_expectations_suite`: reports (ERROR) without
  blocking: it re-reads rows already committed; the invariants that matter for
  the next rung are the integrity check's.
- `deduplicated_records` / `seen_set_healthy`: warns. The seen-set is only a
  fast path: when it was down, or a Bloom filter is filling up, the batch is
  still right, but an operator should know before the next ones slow down.
- `near_duplicate_clusters` / `no_runaway_cluster`: **blocks**. One cluster
  holding more than `max_cluster_share` of a batch is the signature of a bug
  (a constant text, a broken normaliser) that once removed over 90% of a
  corpus; the links are kept, but the run fails so that nothing downstream
  (an export of representatives) acts on them.

Every check reads the warehouse, so it retries a transient error (a dropped
connection, a failover) the way the assets do (`WAREHOUSE_RETRY`), and fails at
once on any other (`retried_only_if_transient`).
"""

import functools
import warnings
from collections.abc import Callable

import dagster as dg
from dagster._core.storage.asset_check_execution_record import AssetCheckExecutionRecordStatus

from dedup_pipeline.defs.assets import (
    COLLAPSE_CHECK,
    WAREHOUSE_RETRY,
    canonical_records,
    checks_not_judged,
    deduplicated_records,
    near_duplicate_clusters,
    retried_only_if_transient,
)
from dedup_pipeline.defs.partitions import crawl_batches_partitions
from dedup_pipeline.defs.plots import rounded
from dedup_pipeline.defs.resources import ChecksResource, NearDupResource, WarehouseResource
from dedup_pipeline.ladder.near import runaway_clusters
from dedup_pipeline.quality import expectations, frames
from dedup_pipeline.quality.collapse import judge_collapse
from dedup_pipeline.quality.history import batch_rates
from dedup_pipeline.quality.integrity import check_batch_integrity
from dedup_pipeline.quality.quarantine import quarantine_report
from dedup_pipeline.quality.seen_set import seen_set_health
from dedup_pipeline.store.warehouse import active_hash_version

SEEN_SET_CHECK = "seen_set_healthy"
GE_CHECK = "great_expectations_suite"
INTEGRITY_CHECK = "warehouse_integrity"
QUARANTINE_CHECK = "quarantine_rate_under_bound"
RUNAWAY_CHECK = "no_runaway_cluster"
_ERROR, _WARN = dg.AssetCheckSeverity.ERROR, dg.AssetCheckSeverity.WARN
# A check on a partitioned asset needs `partitions_def=` (otherwise it loads every partition); Dagster 1.13 marks
# the parameter as preview and warns at every import, in every step process. We rely on it knowingly.
warnings.filterwarnings("ignore", message="Specifying a partitions_def on an AssetCheckSpec is currently in preview")


def batch_check(**spec) -> Callable[[Callable[..., dg.AssetCheckResult]], dg.AssetChecksDefinition]:
    """`dg.asset_check` on a crawl batch partition, with the assets' transient-only retry; a pass carries the
    severity of the check's standing failures on other batches (`passing_severity`)."""

    def decorate(check: Callable[..., dg.AssetCheckResult]) -> dg.AssetChecksDefinition:
        @functools.wraps(check)
        def run(context: dg.AssetCheckExecutionContext, *args, **kwargs) -> dg.AssetCheckResult:
            with retried_only_if_transient():
                result = check(context, *args, **kwargs)
                if result.passed:
                    result = result._replace(severity=passing_severity(context))
                elif spec.get("blocking") and result.severity == _ERROR:  # the checks after it will not run
                    this = (spec["asset"].key, spec["name"])
                    checks_not_judged(context, f"{spec['name']} blocked the run: {result.description}", skip=[this])
                return result

        return dg.asset_check(partitions_def=crawl_batches_partitions, retry_policy=WAREHOUSE_RETRY, **spec)(run)

    return decorate


def passing_severity(context: dg.AssetCheckExecutionContext) -> dg.AssetCheckSeverity:
    """The severity a pass carries: ERROR while another batch's latest result of the check is an error (a failure
    of ERROR severity, or the check never ran in a run that ended), else WARN.

    A pass's severity changes nothing Dagster does (only a failed ERROR blocks) nor the pass's own green. It is
    what the UI colours the check's summary over partitions with (the asset graph, the Checks list): whenever
    any batch's latest result is a failure, the summary takes the *newest* evaluation's severity. A pass of the
    default ERROR made a blocking check whose only failure was a "not judged" warning red; a pass of WARN alone
    would make a standing judged failure yellow. See docs/operating.md, "A check that could not judge".
    """
    storage, key = context.instance.event_log_storage, context.check_specs[0].key
    failed: set[str] = set()
    for info in storage.get_asset_check_partition_info([key]):
        if info.partition_key == context.partition_key:
            continue  # this batch's standing is the result being made
        if info.latest_execution_status == AssetCheckExecutionRecordStatus.FAILED:
            failed.add(info.partition_key)
        elif info.latest_execution_status == AssetCheckExecutionRecordStatus.PLANNED:
            planned_run = context.instance.get_run_by_id(info.latest_planned_run_id)
            if planned_run is None or planned_run.is_finished:  # Dagster's "execution failed": red
                return _ERROR
    cursor = None
    while failed:  # each failed batch's newest failure is its latest result; newest first
        page = storage.get_asset_check_execution_history(
            key, limit=200, cursor=cursor, status={AssetCheckExecutionRecordStatus.FAILED}
        )
        for record in page:
            if record.partition in failed:
                failed.discard(record.partition)
                if record.evaluation is None or record.evaluation.severity == _ERROR:
                    return _ERROR
        if len(page) < 200:
            break
        cursor = page[-1].id
    return _WARN


def not_judged(reason: str, metadata: dict) -> dg.AssetCheckResult:
    """The result of a check that could not judge the batch (too small, nothing to look at): a warning whose first
    line says "not judged", with `judged: false` in its metadata, never a pass that reads as a verdict."""
    return dg.AssetCheckResult(
        passed=False, severity=_WARN, metadata={**metadata, "judged": False}, description=f"not judged: {reason}"
    )


@batch_check(
    asset=deduplicated_records,
    name=COLLAPSE_CHECK,
    description="Collapse rate (exact duplicates / records in) against a fixed band and the trailing median of "
    "earlier batches: error when it collapses toward zero (a volatile field leaked into the hash), warning "
    "when it jumps far above. History: the first-decision counts each earlier batch of the same source recorded "
    "when its exact rung finished (`exact_rung_runs`; the decision log for a batch that recorded none).",
)
def collapse_rate_in_band(
    context: dg.AssetCheckExecutionContext, warehouse: WarehouseResource, checks: ChecksResource
) -> dg.AssetCheckResult:
    rules = checks.collapse_rules()
    with warehouse.get().engine.connect() as conn:
        current, history = batch_rates(conn, context.partition_key, rules.window, rules.min_records)
    verdict = judge_collapse(current, history, rules)
    metadata = {
        "collapse_rate": rounded(verdict.rate),  # as deduplicated_records shows it
        "lower_bound": rounded(verdict.lower_bound),
        "upper_bound": rounded(verdict.upper_bound),
        "records_in": verdict.records_in,
        "history_batches": len(verdict.history),
        "fixed_band": f"[{rules.band_low:g}, {rules.band_high:g}]",
        "note": verdict.note,
    }
    if verdict.trailing_median is not None:
        metadata.update(trailing_median=rounded(verdict.trailing_median), trailing_mad=rounded(verdict.trailing_mad))
    if not verdict.judged:
        return not_judged(f"{verdict.note}; collapse rate {verdict.rate:.3f}, no band applied", metadata)
    return dg.AssetCheckResult(
        passed=verdict.passed,
        severity=_ERROR if verdict.error else _WARN,
        metadata=metadata,
        description=f"collapse rate {verdict.rate:.3f} "
        f"{'in' if verdict.lower_bound <= verdict.rate <= verdict.upper_bound else 'outside'} "
        f"[{verdict.lower_bound:.3f}, {verdict.upper_bound:.3f}]: " + verdict.note,
    )


@batch_check(
    asset=deduplicated_records,
    name=INTEGRITY_CHECK,
    blocking=True,
    description="The rows this batch wrote keep the warehouse invariants: unique (hash_version, content_hash), "
    "one current row per natural key, 32-byte digests, every hash version known to HASH_RULES. Blocks "
    "near_duplicate_clusters when it fails.",
)
def warehouse_integrity(context: dg.AssetCheckExecutionContext, warehouse: WarehouseResource) -> dg.AssetCheckResult:
    with warehouse.get().engine.connect() as conn:
        report = check_batch_integrity(conn, context.partition_key)
    return dg.AssetCheckResult(
        passed=report.passed,
        severity=_ERROR,
        metadata=report.as_metadata(),
        description="; ".join(report.problems) or f"{report.rows_checked} rows keep every invariant",
    )


@batch_check(
    asset=canonical_records,
    name=QUARANTINE_CHECK,
    blocking=True,
    description="Share of the batch's lines sent to quarantine (raw and canonical rungs) stays under "
    "`max_quarantine_rate` of the `checks` resource (a warning: quarantined lines are kept with their reasons). "
    "Over `blocking_quarantine_rate` it is an error that blocks the warehouse write: the batch is mostly broken.",
)
def quarantine_rate_under_bound(
    context: dg.AssetCheckExecutionContext, warehouse: WarehouseResource, checks: ChecksResource
) -> dg.AssetCheckResult:
    with warehouse.get().engine.connect() as conn:
        report = quarantine_report(conn, context.partition_key)
    too_small = report.lines < checks.min_lines_for_quarantine_check
    mostly_quarantined = report.rate > checks.blocking_quarantine_rate
    passed = not mostly_quarantined and (too_small or report.rate <= checks.max_quarantine_rate)
    reasons = "\n".join(
        ["| rung | reason | lines |", "|---|---|---:|"]
        + [f"| {rung} | {reason} | {n} |" for rung, reason, n in report.top_reasons]
    )
    metadata = {
        "quarantine_rate": report.rate,
        "quarantined": report.quarantined,
        "lines": report.lines,
        "bound": checks.max_quarantine_rate,
        "blocking_bound": checks.blocking_quarantine_rate,
        "top_reasons": dg.MetadataValue.md(reasons),
        **{f"quarantined/{rung}": n for rung, n in sorted(report.by_rung.items())},
    }
    summary = f"{report.quarantined} of {report.lines} lines quarantined ({report.rate:.1%}, bound "
    if not report.lines:  # nothing to judge, and a crawl that wrote nothing is worth a look
        return not_judged("the batch has no lines (its file is empty, or blank lines only): an empty crawl?", metadata)
    if too_small and not mostly_quarantined and report.rate > checks.max_quarantine_rate:
        return not_judged(
            f"batch too small ({report.lines} < {checks.min_lines_for_quarantine_check} lines); "
            + summary
            + f"{checks.max_quarantine_rate:.1%})",
            metadata,
        )
    if mostly_quarantined:
        note = (
            f"mostly quarantined (over {checks.blocking_quarantine_rate:.0%}, the checks resource's "
            "blocking_quarantine_rate): the warehouse write is blocked, its good lines stay staged and undecided"
        )
    else:
        note = "under the bound" if passed else "over the bound"
    return dg.AssetCheckResult(
        passed=passed,
        severity=_ERROR if mostly_quarantined else _WARN,
        metadata=metadata,
        description=summary + f"{checks.max_quarantine_rate:.1%}): {note}",
    )


@batch_check(
    asset=deduplicated_records,
    name=SEEN_SET_CHECK,
    description="The exact rung's seen-set answered for every chunk of the batch (no fallback to the warehouse "
    "alone) and a Bloom filter holds at most `max_seen_set_fill` of its capacity (`checks` resource). Warns "
    "only: the seen-set is a fast path, and the warehouse decided every record either way.",
)
def seen_set_healthy(
    context: dg.AssetCheckExecutionContext, warehouse: WarehouseResource, checks: ChecksResource
) -> dg.AssetCheckResult:
    with warehouse.get().engine.connect() as conn:
        health = seen_set_health(conn, context.partition_key, context.run.run_id)
    problems = health.problems(checks.max_seen_set_fill)
    return dg.AssetCheckResult(
        passed=not problems,
        severity=_WARN,
        metadata={**health.figures, "max_seen_set_fill": checks.max_seen_set_fill},
        description="; ".join(problems)
        or (
            f"seen-set {health.figures.get('seen_set')}: answered every chunk, within its capacity"
            if health.run_id
            else "the exact rung has not run on this batch"
        ),
    )


def _suite_result(report: expectations.SuiteReport, severity: dg.AssetCheckSeverity) -> dg.AssetCheckResult:
    metadata: dict = {
        "suite": report.suite,
        "rows": report.rows,
        "evaluated": len(report.outcomes),
        "failed": len(report.failed),
        "results": dg.MetadataValue.md(report.markdown()),
    }
    for outcome in report.outcomes:
        if outcome.unexpected is not None:
            metadata[f"unexpected {outcome.label}"] = int(outcome.unexpected)
    failed = ", ".join(o.label for o in report.failed)
    return dg.AssetCheckResult(
        passed=report.success,
        severity=severity,
        metadata=metadata,
        description=f"Great Expectations suite {report.suite!r} over {report.rows} rows: "
        + (f"failed {failed}" if failed else f"all {len(report.outcomes)} expectations met"),
    )


@batch_check(
    asset=canonical_records,
    name=GE_CHECK,
    blocking=True,
    description="Great Expectations suite on the batch's canonical records: key columns not null, canonical URL "
    "and digest formats, known URL and hash versions, one row per line, no row lost. Blocks the warehouse write "
    "(deduplicated_records) when it fails.",
)
def canonical_records_suite(
    context: dg.AssetCheckExecutionContext, warehouse: WarehouseResource
) -> dg.AssetCheckResult:
    with warehouse.get().engine.connect() as conn:
        frame = frames.canonical_frame(conn, context.partition_key, active_hash_version(conn))
        expected = frames.expected_canonical_rows(conn, context.partition_key)
    report = expectations.validate(frame, "canonical_records", expectations.canonical_suite(expected))
    return _suite_result(report, _ERROR)


@batch_check(
    asset=deduplicated_records,
    name=GE_CHECK,
    description="Great Expectations suite on the warehouse rows this batch wrote: key columns not null, formats, "
    "known versions, one row per natural key and per (hash_version, content_hash). Reports without blocking.",
)
def deduplicated_records_suite(
    context: dg.AssetCheckExecutionContext, warehouse: WarehouseResource
) -> dg.AssetCheckResult:
    with warehouse.get().engine.connect() as conn:
        frame = frames.records_frame(conn, context.partition_key)
    report = expectations.validate(frame, "deduplicated_records", expectations.deduplicated_suite())
    return _suite_result(report, _ERROR)


@batch_check(
    asset=near_duplicate_clusters,
    name=RUNAWAY_CHECK,
    blocking=True,
    description="No near-duplicate cluster holds more than `max_cluster_share` of the batch's new or changed records "
    "(`near_dup` resource; batches under `min_records_for_cluster_check` are not judged: a warning). Metadata "
    "names the offending cluster ids and sizes (ids and counts only). Blocks: fails the run.",
)
def no_runaway_cluster(
    context: dg.AssetCheckExecutionContext, warehouse: WarehouseResource, near_dup: NearDupResource
) -> dg.AssetCheckResult:
    verdict = runaway_clusters(warehouse.get(), context.partition_key, near_dup.settings())
    metadata = verdict.as_metadata()
    metadata["largest_clusters"] = dg.MetadataValue.md(metadata["largest_clusters"])
    if verdict.batch_records < verdict.min_records:
        return not_judged(verdict.description(), metadata)
    return dg.AssetCheckResult(
        passed=verdict.passed, severity=_ERROR, metadata=metadata, description=verdict.description()
    )


ladder_checks = [
    canonical_records_suite,
    quarantine_rate_under_bound,
    collapse_rate_in_band,
    warehouse_integrity,
    deduplicated_records_suite,
    seen_set_healthy,
    no_runaway_cluster,
]
