"""The four assets of the dedup ladder, cheapest rung first. Each is a few lines over `dedup_pipeline.ladder`."""

from collections.abc import Collection, Iterator
from contextlib import contextmanager

import dagster as dg
from sqlalchemy.exc import InterfaceError, OperationalError

from dedup_pipeline.defs.partitions import crawl_batches_partitions
from dedup_pipeline.defs.plots import exact_metadata, ladder_figures
from dedup_pipeline.defs.pools import WAREHOUSE_POOL
from dedup_pipeline.defs.resources import (
    LadderResource,
    LandingResource,
    NearDupResource,
    SeenSetResource,
    WarehouseResource,
)
from dedup_pipeline.ladder.canonical import canonicalise_batch
from dedup_pipeline.ladder.exact import deduplicate_batch
from dedup_pipeline.ladder.near import cluster_batch
from dedup_pipeline.ladder.raw import ingest_raw_batch
from dedup_pipeline.landing import find_batch
from dedup_pipeline.quality.history import rate_of

GROUP = "dedup_ladder"
#: The collapse-rate check on deduplicated_records (defined with the other checks in defs/checks.py).
COLLAPSE_CHECK = "collapse_rate_in_band"
#: Every rung writes the warehouse and is idempotent, so a step that hit a transient database error
#: (a dropped connection, a failover, a lock timeout) is simply run again (see `retried_only_if_transient`).
WAREHOUSE_RETRY = dg.RetryPolicy(max_retries=2, delay=2, backoff=dg.Backoff.EXPONENTIAL, jitter=dg.Jitter.PLUS_MINUS)
#: What a second try may not meet: the warehouse or a server gone for a moment, a lock or statement timeout.
TRANSIENT_ERRORS = (OperationalError, InterfaceError, ConnectionError, TimeoutError)


@contextmanager
def retried_only_if_transient(context: dg.AssetExecutionContext | None = None) -> Iterator[None]:
    """Let `WAREHOUSE_RETRY` retry a transient error; any other (a corrupt file, a wrong setting, a bug) fails the
    step at once, with the error itself, instead of after two more tries that meet it again. With an asset's
    `context`, such a failure first records the checks the run has still to evaluate as not judged
    (`checks_not_judged`)."""
    try:
        yield
    except TRANSIENT_ERRORS:
        raise
    except dg.Failure as exc:
        if context is not None:
            checks_not_judged(context, f"its run failed before it: {exc.description}")
        raise
    except Exception as exc:  # noqa: BLE001 - re-raised as a failure that bypasses the retry policy
        description = f"{type(exc).__name__}: {exc}"
        if context is not None:
            checks_not_judged(context, f"its run failed before it: {description}")
        raise dg.Failure(description=description, allow_retries=False) from exc


@dg.asset(
    partitions_def=crawl_batches_partitions, group_name=GROUP, kinds={"python", "sql"}, retry_policy=WAREHOUSE_RETRY
)
def raw_crawl_batches(
    context: dg.AssetExecutionContext, warehouse: WarehouseResource, landing: LandingResource, ladder: LadderResource
) -> dg.MaterializeResult:
    """A crawl batch as it landed, one partition per JSON Lines file (optionally gzipped) in the landing folder:
    the file registered (size, SHA-256, line count), and every line that is not a JSON object sent to the
    `quarantine` table with its reason and line number (so is a line over `max_line_bytes`). Read `lines` ->
    `parsed` (on to the canonical rung) and `quarantined`, and `blank` for the empty lines passed over; a spike
    in `quarantined` means a crawler started writing broken lines.

    See docs/canonical.md.
    """
    with retried_only_if_transient(context):  # a missing, ambiguous or unreadable file fails it at once
        batch = find_batch(landing.path(), context.partition_key)
        report = ingest_raw_batch(warehouse.get(), batch, ladder.settings().max_line_bytes)
    if report.redelivery_warning:
        context.log.warning(report.redelivery_warning)
    return dg.MaterializeResult(metadata={**report.as_metadata(), "dagster/row_count": report.parsed})


def checks_not_judged(context, reason: str, skip: Collection[tuple[dg.AssetKey, str]] = ()) -> None:
    """Record every check this run planned on the batch and has not evaluated (nor `skip`: asset key and check
    name) as not judged, a warning that says why, before the run fails (an asset's step, or a blocking check).

    Dagster marks each check a failed run planned but never ran "execution failed", red on every asset of the
    ladder, as if each one had found a fault; the checks found nothing, and a warning naming the cause is
    what is true. Each warning is this run's own evaluation of a check it planned (logged by the failing step),
    so it is the partition's latest and a batch can fail any number of times: a run-less evaluation is stored
    once per check and partition (Dagster's unique index), and a second one failed the step with that index's
    IntegrityError in place of its own error.
    """

    def checks(event_type) -> list:
        records = context.instance.get_records_for_run(context.run.run_id, of_type=event_type).records
        return [record.event_log_entry.dagster_event.event_specific_data for record in records]

    done = {(c.asset_key, c.check_name) for c in checks(dg.DagsterEventType.ASSET_CHECK_EVALUATION)} | set(skip)
    for check in checks(dg.DagsterEventType.ASSET_CHECK_EVALUATION_PLANNED):
        if (check.asset_key, check.check_name) in done:
            continue
        context.op_execution_context.log_event(  # an asset's or a check's context
            dg.AssetCheckEvaluation(
                asset_key=check.asset_key,
                check_name=check.check_name,
                passed=False,
                severity=dg.AssetCheckSeverity.WARN,
                partition=context.partition_key,
                description=f"not judged: {reason}",
                metadata={"judged": False},
            )
        )


@dg.asset(
    partitions_def=crawl_batches_partitions,
    group_name=GROUP,
    deps=[raw_crawl_batches],
    kinds={"python", "sql"},
    retry_policy=WAREHOUSE_RETRY,
    pool=WAREHOUSE_POOL,
)
def canonical_records(
    context: dg.AssetExecutionContext, warehouse: WarehouseResource, ladder: LadderResource
) -> dg.MaterializeResult:
    """Each parsable record in canonical form in the `canonical_records` table: URL in the warehouse's URL version
    (no userinfo), volatile fetch fields left out, text and numbers normalised, one digest per hash version beside
    its version; what has no usable URL or key, or that the active version cannot hash, goes to quarantine. Read
    `records_in` -> `canonical`, `quarantined`, `unhashable[content/N]` and `workers`. Checks:
    `great_expectations_suite` (blocks the warehouse write) and `quarantine_rate_under_bound` (warns; blocks a
    mostly quarantined batch).

    See docs/canonical.md.
    """
    with retried_only_if_transient(context):
        report = canonicalise_batch(warehouse.get(), context.partition_key, ladder.settings(), context.log.info)
    return dg.MaterializeResult(metadata={**report.as_metadata(), "dagster/row_count": report.canonical})


@dg.asset(
    partitions_def=crawl_batches_partitions,
    group_name=GROUP,
    deps=[canonical_records],
    kinds={"python", "sql"},
    retry_policy=WAREHOUSE_RETRY,
    pool=WAREHOUSE_POOL,
)
def deduplicated_records(
    context: dg.AssetExecutionContext, warehouse: WarehouseResource, ladder: LadderResource, seen_set: SeenSetResource
) -> dg.MaterializeResult:
    """The warehouse table `records`: one current row per natural key and per content, the UNIQUE index on
    (hash_version, content_hash) the authority. Each record of the batch is `new`, `changed` (its old content kept in
    `record_history`) or an `exact_duplicate` (rarer: `change_ignored`, `stale`, `erased`), every decision in
    `dedup_decisions`. Read `records_in` -> `survivors`, one count per decision, `collapse_rate` (the batch's first
    run, as the collapse check judges it), and in `figures` `collapse_rate/this_run` (a replay shows 1.0 but for its
    lines a later batch made `stale`). Checks: `collapse_rate_in_band`, `warehouse_integrity` (blocks the near
    rung), `great_expectations_suite`, `seen_set_healthy`.

    See docs/exact.md.
    """
    with retried_only_if_transient(context):
        report = deduplicate_batch(
            warehouse.get(),
            context.partition_key,
            context.run.run_id,
            ladder.settings(),
            seen_set.get(),
            context.log.info,
        )
    for warning in report.seen_set_warnings:
        context.log.warning(warning)
    first_run = report.first_decisions
    first = rate_of(context.partition_key, first_run)
    # The batch's rate is its first decisions' (as the collapse check judges it); a replay's own is beside it.
    figures = {**report.as_metadata(), "collapse_rate": first.rate, "collapse_rate/this_run": report.collapse_rate}
    return dg.MaterializeResult(
        metadata={**exact_metadata(figures, first_run, first.rate), "dagster/row_count": report.survivors}
    )


@dg.asset(
    partitions_def=crawl_batches_partitions,
    group_name=GROUP,
    deps=[deduplicated_records],
    kinds={"python", "sql"},
    retry_policy=WAREHOUSE_RETRY,
    pool=WAREHOUSE_POOL,
)
def near_duplicate_clusters(
    context: dg.AssetExecutionContext, warehouse: WarehouseResource, near_dup: NearDupResource
) -> dg.MaterializeResult:
    """Near-duplicate clusters over the title and description of the batch's survivors, MinHash + LSH (or SimHash)
    against every earlier batch: pairs in `near_duplicate_links`, clusters in `near_duplicate_clusters`, the
    records all kept. Read `sketched`, `candidate_pairs` -> `pairs`, `near_duplicates`, `largest_cluster`,
    `capped_records`, the `largest_clusters` preview and the `funnel` of the whole ladder. Check:
    `no_runaway_cluster` (blocks).

    See docs/near.md.
    """
    with retried_only_if_transient(context):
        report = cluster_batch(
            warehouse.get(), context.partition_key, near_dup.settings(), context.run.run_id, context.log.info
        )
    if report.already_indexed and not report.sketched:
        context.log.info(
            f"nothing to index: the batch's {report.already_indexed} records were indexed and linked by an earlier "
            "run; a new threshold or link setting applies to records linked from now on (rebuild-near-index "
            "links every record again)"
        )
    if report.capped:
        context.log.warning(
            f"{len(report.capped)} record(s) met more than {near_dup.max_candidates} records sharing a band with them "
            "(boilerplate?): they met only the first stored"
        )
    if report.threshold_warning:
        context.log.warning(report.threshold_warning)
    figures = ladder_figures(warehouse.get(), context.partition_key, report.clusters)
    seeds = {"scraper_near_duplicates_flagged_total": len(report.near_duplicates)}  # as Prometheus names it
    return dg.MaterializeResult(metadata={**report.as_metadata(), **seeds, **figures})


ladder_assets = [raw_crawl_batches, canonical_records, deduplicated_records, near_duplicate_clusters]
