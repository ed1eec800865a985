"""The four assets of the dedup ladder, cheapest rung first. Each is a few lines over `dedup_pipeline.ladder`."""

from contextlib import contextmanager
from typing import Iterator

import dagster as dg
from sqlalchemy.exc import InterfaceError, OperationalError

from dedup_pipeline.defs.partitions import crawl_batches_partitions
from dedup_pipeline.defs.plots import ladder_figures
from dedup_pipeline.defs.resources import (
    LadderResource, LandingResource, NearDupResource, SeenSetResource, WarehouseResource,
)
from dedup_pipeline.ladder.canonical import canonicalise_batch
from dedup_pipeline.ladder.exact import deduplicate_batch
from dedup_pipeline.ladder.near import cluster_batch
from dedup_pipeline.ladder.raw import ingest_raw_batch
from dedup_pipeline.landing import find_batch

GROUP = "dedup_ladder"
#: The collapse-rate check on deduplicated_records (defined with the other checks in defs/checks.py).
COLLAPSE_CHECK = "collapse_rate_in_band"
#: Every rung writes the warehouse and is idempotent, so a step that hit a transient database error
#: (a dropped connection, a failover, a lock timeout) is simply run again (see `retried_only_if_transient`).
WAREHOUSE_RETRY = dg.RetryPolicy(max_retries=2, delay=2, backoff=dg.Backoff.EXPONENTIAL, jitter=dg.Jitter.PLUS_MINUS)
#: What a second try may not meet: the warehouse or a server gone for a moment, a lock or statement timeout.
TRANSIENT_ERRORS = (OperationalError, InterfaceError, ConnectionError, TimeoutError)


@contextmanager
def retried_only_if_transient() -> Iterator[None]:
    """Let `WAREHOUSE_RETRY` retry a transient error; any other (a corrupt file, a wrong setting, a bug) fails the
    step at once, with the error itself, instead of after two more tries that meet it again."""
    try:
        yield
    except (*TRANSIENT_ERRORS, dg.Failure):
        raise
    except Exception as exc:  # noqa: BLE001 - re-raised as a failure that bypasses the retry policy
        raise dg.Failure(description=f"{type(exc).__name__}: {exc}", allow_retries=False) from exc
#: The writing rungs claim a slot of this pool, so the instance bounds concurrent warehouse writers across
#: runs and workers (`concurrency: pools:` in dagster.yaml and deploy/dagster.yaml).
WAREHOUSE_POOL = "warehouse"


@dg.asset(partitions_def=crawl_batches_partitions, group_name=GROUP, kinds={"python", "sql"}, retry_policy=WAREHOUSE_RETRY)
def raw_crawl_batches(
    context: dg.AssetExecutionContext, warehouse: WarehouseResource, landing: LandingResource
) -> dg.MaterializeResult:
    """A crawl batch as it landed: one partition per JSON Lines file (optionally gzipped) in the landing folder.

    Registers the file (size, SHA-256, line count) and sends every line that is
    not a JSON object to the `quarantine` table with its reason and line number.
    Read `lines` (records in the file), `parsed` (lines that go on to be
    canonicalised) and `quarantined` (lines stopped here). The Plots tab
    charts each figure over the batches; a spike in `quarantined` means a
    crawler started writing broken lines.
    """
    with retried_only_if_transient():
        report = ingest_raw_batch(warehouse.get(), find_batch(landing.path(), context.partition_key))
    return dg.MaterializeResult(metadata={**report.as_metadata(), "dagster/row_count": report.parsed})


@dg.asset(
    partitions_def=crawl_batches_partitions, group_name=GROUP, deps=[raw_crawl_batches], kinds={"python", "sql"},
    retry_policy=WAREHOUSE_RETRY, pool=WAREHOUSE_POOL,
)
def canonical_records(
    context: dg.AssetExecutionContext, warehouse: WarehouseResource, ladder: LadderResource
) -> dg.MaterializeResult:
    """Each parsable record in canonical form, in the `canonical_records` table.

    Canonical URL (`url/1`: tracking parameters stripped, scheme and host
    lowercased, default port dropped, query sorted, fragment dropped, path case
    kept), volatile fetch fields (scraped_at, crawl_id, proxy_ip, ...) left out
    of the identity, text NFC with whitespace collapsed, exact decimal numbers,
    and one SHA-256 per hash version (`content/1`, `content/2`) beside its
    version. Records without a usable URL or natural key, or that the active
    hash version cannot hash, go to quarantine. `unhashable[content/N]` counts
    records a non-active version could not hash (the rehash job reports them).

    Figures: `records_in` (= `parsed` of the raw rung) -> `canonical`, plus
    `quarantined` here; `workers`: processes that canonicalised the batch (a
    batch of 20,000 lines or more is spread over them, `canonical_workers` in
    the ladder resource). Checks: `great_expectations_suite` (key columns not
    null, URL and digest formats, known versions, no row lost; it BLOCKS the
    warehouse write when it fails) and `quarantine_rate_under_bound` (warns
    when too many lines of the batch were quarantined; the reasons are listed).
    """
    with retried_only_if_transient():
        report = canonicalise_batch(warehouse.get(), context.partition_key, ladder.settings())
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
    """The warehouse table `records`: one current row per natural key, one row per content.

    Each canonical record of the batch, in file order, is one of: `exact_duplicate`
    (its active-version digest is already stored: skipped), `changed` (its
    natural key is stored with other content: the row is updated and the old
    content kept in `record_history`), or `new` (inserted). A UNIQUE index on
    (hash_version, content_hash) is the authority. Every decision is in the
    `dedup_decisions` log (keys and digests only). `collapse_rate` is exact
    duplicates / records in; `survivors` go on to the near-duplicate rung.
    Re-materialising a partition changes nothing.

    Figures: `records_in` -> `survivors` (new + changed), one count per
    decision, `collapse_rate`. A replayed batch shows every record as an
    exact duplicate (collapse rate 1.0): that is the replay, not the crawl;
    the checks read the batch's first decisions from the decision log.
    Checks: `collapse_rate_in_band` (against a fixed band and the trailing
    median of earlier batches: error when it collapses toward zero, the sign
    of a volatile field leaking into the hash; warning when it jumps far
    above), `warehouse_integrity` (unique keys and digests, 32-byte digests,
    known versions; BLOCKS the near-duplicate rung) and
    `great_expectations_suite` (formats and uniqueness of the rows written).
    """
    with retried_only_if_transient():
        report = deduplicate_batch(
            warehouse.get(), context.partition_key, context.run.run_id, ladder.settings(), seen_set.get()
        )
    for warning in report.seen_set_warnings:
        context.log.warning(warning)
    return dg.MaterializeResult(
        metadata={**report.as_metadata(), "dagster/row_count": report.survivors},
    )


@dg.asset(
    partitions_def=crawl_batches_partitions, group_name=GROUP, deps=[deduplicated_records], kinds={"python", "sql"},
    retry_policy=WAREHOUSE_RETRY, pool=WAREHOUSE_POOL,
)
def near_duplicate_clusters(
    context: dg.AssetExecutionContext, warehouse: WarehouseResource, near_dup: NearDupResource
) -> dg.MaterializeResult:
    """Near-duplicate clusters: MinHash + LSH over the title and description of the batch's survivors.

    Each new or changed record is sketched, its LSH buckets are stored in the
    warehouse, and candidates from every earlier batch are verified by
    estimated Jaccard similarity (or, with `verify: exact`, the exact Jaccard of
    the shingles). Near duplicates are kept (another source may
    matter) and linked: `near_duplicate_links` holds each pair with its
    similarity, `near_duplicate_clusters` each clustered record with its
    cluster id (the smallest record id in the cluster, stable across runs).

    Figures: `sketched` (records of the batch indexed), `candidate_pairs`
    (LSH bucket matches) -> `pairs` (verified links), `near_duplicates`
    (records of the batch linked), `clusters_touched`, `largest_cluster`,
    `cluster_sizes` (size -> clusters this batch touched), `capped_buckets`
    (LSH buckets over `max_bucket_size`, whose candidates were capped);
    `largest_clusters` previews the biggest clusters this batch touched (ids,
    sizes, similarity range; look the ids up in `near_duplicate_clusters`).
    `funnel` pictures the whole ladder for the batch: lines in the file ->
    parsed -> canonical -> new or changed -> no near duplicate, and the
    `funnel/...` numbers are the same stages, plotted over time.
    """
    with retried_only_if_transient():
        report = cluster_batch(warehouse.get(), context.partition_key, near_dup.settings(), context.run.run_id)
    if report.capped_buckets:
        context.log.warning(
            f"{len(report.capped_buckets)} LSH bucket(s) held more than {near_dup.max_bucket_size} records "
            "(boilerplate?): their records met only the oldest members of those buckets"
        )
    figures = ladder_figures(warehouse.get(), context.partition_key, report.clusters)
    return dg.MaterializeResult(metadata={**report.as_metadata(), **figures})


ladder_assets = [raw_crawl_batches, canonical_records, deduplicated_records, near_duplicate_clusters]
