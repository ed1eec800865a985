"""The rehash migration in Dagster: a sharded backfill per version pair, its comparison, and the switch and retire jobs.

`rehash_migration(source, target)` builds everything one migration needs;
`content/2` today is one line, `content/3` later another. The Dagster layer
stays thin: every body is a call into `dedup_pipeline.ladder.rehash`.

Every run of these jobs carries the `dedup/migration` tag, which the
instance's tag concurrency limit (dagster.yaml, limit 1) runs one at a time,
so a backfill of sixteen shards never floods the warehouse. A run of the
migration's assets launched from their own page carries no job tags; the
production instance's run coordinator gives it the tag (`migration_lane`).
"""

import time
import warnings
from dataclasses import dataclass

import dagster as dg
from pydantic import Field

from dedup_pipeline.core.hashing import hash_rule
from dedup_pipeline.core.url import URL_VERSION
from dedup_pipeline.defs.pools import WAREHOUSE_POOL
from dedup_pipeline.defs.resources import NearDupResource, WarehouseResource
from dedup_pipeline.ladder.rehash import DEFAULT_CHUNK_SIZE, Comparison, ShardReport, backfill_shard, compare_versions
from dedup_pipeline.ladder.rehash_switch import MigrationRefused, retire_hash_version, switch_hash_version
from dedup_pipeline.ladder.url_migration import migrate_url_version
from dedup_pipeline.store.rehash import SHARDS
from dedup_pipeline.store.rehash import progress as rehash_progress

#: The run tag of a migration's lane, `dedup/migration=<target version>` (`migration_lane` gives it for a run).
MIGRATION_TAG = "dedup/migration"
GROUP = "rehash_migration"
COMPARISON_CHECK = "collapse_change_in_band"
#: Sixteen shards: the first hex digit of a row's stored digest.
shard_partitions = dg.StaticPartitionsDefinition(list(SHARDS))


class RehashResource(dg.ConfigurableResource):
    """How the rehash migration runs and what the comparison expects (editable in the launchpad)."""

    chunk_size: int = Field(
        default=DEFAULT_CHUNK_SIZE, description="Rows read, hashed and written per page (one transaction)."
    )
    max_chunks_per_run: int = Field(
        default=0, description="Stop a shard run after this many pages (0: no limit); the next run resumes it."
    )
    min_collapse_change: float = Field(
        default=-0.01,
        description="The comparison check fails when the collapse-rate change (new minus old) is below this.",
    )
    max_collapse_change: float = Field(
        default=0.05,
        description="The comparison check fails above this: "
        "a 'small' rule change that merges many records is a red flag.",
    )
    examples: int = Field(
        default=10,
        description="Merge, split and unhashable examples kept in rehash_comparisons (keys and digests only).",
    )


def version_slug(version: str) -> str:
    """`content/2` -> `content_v2`, for job and asset names."""
    return version.replace("/", "_v")


# Examples name rows (natural keys, digests): they stay in the warehouse, where an erasure finds and redacts them,
# never in Dagster's event log, which nothing erases. The metadata says where to read them.
def _unhashable_rows_query(target: str) -> dg.MetadataValue:
    return dg.MetadataValue.md(
        "Rows that cannot be hashed are listed in the warehouse (not here: an erasure could not remove them from "
        "Dagster's event log):\n\n```sql\nSELECT r.natural_key, h.error FROM record_hashes h JOIN records r "
        f"ON r.record_id = h.record_id\nWHERE h.hash_version = '{target}' AND h.error IS NOT NULL;\n```"
    )


# Dagster 1.13 marks `backfill_policy` as beta and warns at every import, in every step process. We rely on it
# knowingly (a policy that changes costs runs, not correctness: every shard is resumable on its own).
warnings.filterwarnings("ignore", message="Parameter `backfill_policy` of function `asset` is currently in beta")
#: Shards one backfill run hashes in turn: 4 runs for the 16 shards, not 16 runs that each pay a run's start.
SHARDS_PER_RUN = 4
_SUMMED = ("rows_hashed", "rows_unhashable", "rows_already_hashed", "chunks", "shard_rows", "shard_rows_done")
_SUMMED += ("shard_rows_left", "shard_rows_unhashable")


def _shard_metadata(reports: list[ShardReport]) -> dict:
    """The metadata of a run's shards: one shard's figures as they are; several shards' summed (`complete` only
    when every one is), the warehouse's figures as the last shard left them, and each shard's own in `shards`."""
    each = [report.as_metadata() for report in reports]
    meta = dict(each[-1])
    if len(each) > 1:
        seconds = sum(m["seconds"] for m in each)
        meta.update({key: sum(m[key] for m in each) for key in _SUMMED})
        meta.update(
            shard=f"{each[0]['shard']}-{each[-1]['shard']}",
            complete=all(m["complete"] for m in each),
            seconds=round(seconds, 3),
            rows_per_second=round((meta["rows_hashed"] + meta["rows_unhashable"]) / seconds, 1) if seconds else 0.0,
            shards=dg.MetadataValue.json({m["shard"]: m for m in each}),
        )
    return {**meta, "unhashable_rows": _unhashable_rows_query(reports[-1].target)}


def _comparison_metadata(result: Comparison) -> dict:
    f = result.figures
    scalars = {k: v for k, v in f.items() if isinstance(v, (int, float, str)) and not isinstance(v, bool)}
    return {
        **scalars,
        "passed": result.passed,
        "comparison_id": result.comparison_id,
        "examples": dg.MetadataValue.md(
            "The merge, split and unhashable examples (keys and digests) are in the warehouse, not here (an erasure "
            "redacts them there; it could not in Dagster's event log): `merge_examples`, `split_examples` and "
            f"`unhashable_examples` of `rehash_comparisons.figures` for comparison_id {result.comparison_id}, or "
            "`compare_versions(...).figures` in Python."
        ),
    }


@dataclass(frozen=True)
class RehashMigration:
    """Everything one migration from `source` to `target` puts in the code location."""

    source: str
    target: str
    hashes: dg.AssetsDefinition
    comparison: dg.AssetsDefinition
    backfill_job: object  # the job define_asset_job returns (resolved by Definitions)
    compare_job: object
    sensor: dg.SensorDefinition


def rehash_migration(source: str, target: str) -> RehashMigration:
    """The sharded backfill asset and job, the comparison asset, its check, job and sensor for one version pair."""
    hash_rule(source), hash_rule(target)
    name = version_slug(target)
    tags = {MIGRATION_TAG: target}

    @dg.asset(
        name=f"{name}_hashes",
        partitions_def=shard_partitions,
        group_name=GROUP,
        kinds={"python", "sql"},
        pool=WAREHOUSE_POOL,
        # Several shards per run: a run's start costs seconds, a small shard's rows far less. Each shard still
        # commits page by page, so a run killed in its third shard resumes there, the first two done.
        backfill_policy=dg.BackfillPolicy.multi_run(max_partitions_per_run=SHARDS_PER_RUN),
        description=(
            f"`{target}` digests beside the stored ones, one partition per shard (first hex digit of the row's "
            f"stored digest), written page by page so a killed shard resumes where it stopped and a second "
            f"backfill writes nothing; a row the `{target}` rule cannot hash gets the reason instead. An asset "
            f"backfill runs {SHARDS_PER_RUN} shards per run, their figures summed, each shard's under `shards` "
            f"(`dagster job backfill` runs one per run). Read `rows_hashed`, `shard_rows_left` and "
            f"`warehouse_rows_left`.\n\nSee docs/rehash.md."
        ),
    )
    def hashes(
        context: dg.AssetExecutionContext, warehouse: WarehouseResource, rehash: RehashResource
    ) -> dg.MaterializeResult:
        last = [time.monotonic()]

        def log_progress(report: ShardReport) -> None:
            if time.monotonic() - last[0] >= 5:
                last[0] = time.monotonic()
                context.log.info(
                    f"shard {report.shard}: {report.hashed + report.unhashable} rows hashed in {report.chunks} pages "
                    f"({report.rows_per_second:.0f} rows/s)"
                )

        reports = []
        for shard in context.partition_keys:  # a backfill run's range of shards, each resumable on its own
            report = backfill_shard(
                warehouse.get(),
                target,
                shard,
                rehash.chunk_size,
                rehash.max_chunks_per_run or None,
                on_chunk=log_progress,
                examples=rehash.examples,
            )
            context.log.info(
                f"shard {report.shard}: {report.hashed} hashed, {report.unhashable} unhashable this run; "
                f"{report.shard_progress.left} left in the shard, {report.warehouse_progress.left} in the warehouse"
            )
            reports.append(report)
        return dg.MaterializeResult(metadata=_shard_metadata(reports))

    @dg.asset(
        name=f"rehash_comparison_{name}",
        deps=[hashes],
        group_name=GROUP,
        kinds={"python", "sql"},
        check_specs=[
            dg.AssetCheckSpec(
                COMPARISON_CHECK,
                asset=f"rehash_comparison_{name}",
                description="The collapse-rate change from the old rule to the new one is inside the configured band.",
            )
        ],
        description=(
            f"`{source}` against `{target}` over every stored row hashed under both, kept in `rehash_comparisons`: "
            f"read `collapse_rate_source`, `collapse_rate_target` and their change (checked against the band), "
            f"`rows_merged_away` and `split_groups`. `switch_hash_version` refuses while the latest one failed."
            f"\n\nSee docs/rehash.md."
        ),
    )
    def comparison(warehouse: WarehouseResource, rehash: RehashResource) -> dg.MaterializeResult:
        result = compare_versions(
            warehouse.get(), source, target, rehash.min_collapse_change, rehash.max_collapse_change, rehash.examples
        )
        f = result.figures
        # Nothing compared (no stored row hashed under both, e.g. after the old version was retired), or a part
        # only (the backfill has rows left): not judged, a warning rather than a green check.
        if not f["rows_compared"]:
            not_judged = f"nothing compared: no stored row is hashed under both {source} and {target}"
        elif f["rows_left"]:
            not_judged = (
                f"not judged: {f['rows_left']} of {f['warehouse_rows']} rows have no {target} digest yet, so only "
                f"{f['rows_compared']} were compared; finish the backfill and compare again"
            )
        else:
            not_judged = ""
        check = dg.AssetCheckResult(
            check_name=COMPARISON_CHECK,
            passed=result.passed and not not_judged,
            severity=dg.AssetCheckSeverity.WARN if not_judged else dg.AssetCheckSeverity.ERROR,
            description=(
                not_judged
                or f"collapse rate {f['collapse_rate_source']:.4f} under {source}, {f['collapse_rate_target']:.4f} "
                f"under {target}: change {f['collapse_rate_change']:+.4f}, band [{f['band_low']}, {f['band_high']}]"
            ),
            metadata={
                "collapse_rate_change": f["collapse_rate_change"],
                "band_low": f["band_low"],
                "band_high": f["band_high"],
                "rows_merged_away": f["rows_merged_away"],
                "split_groups": f["split_groups"],
                "rows_left": f["rows_left"],
                "comparison_id": result.comparison_id,
            },
        )
        return dg.MaterializeResult(metadata=_comparison_metadata(result), check_results=[check])

    # One step per run: the in-process executor saves each shard run a second Python process.
    backfill_job = dg.define_asset_job(
        f"rehash_{name}",
        selection=[hashes],
        tags=tags,
        executor_def=dg.in_process_executor,
        description=(
            f"Backfill `{target}` digests for every stored row, one shard per partition. Launch it as a backfill "
            f"(Partitions -> Launch backfill..., or `dagster job backfill -j rehash_{name} --all`); the comparison "
            f"runs once every shard is done."
        ),
    )
    compare_job = dg.define_asset_job(
        f"compare_{name}",
        selection=[comparison],
        tags=tags,
        executor_def=dg.in_process_executor,
        description=f"Compare `{source}` and `{target}` over the migrated rows and check the collapse-rate change.",
    )

    @dg.sensor(
        name=f"compare_after_rehash_{name}",
        job=compare_job,
        minimum_interval_seconds=15,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description=f"Runs the `{source}` -> `{target}` comparison once every shard is materialised and complete, "
        f"no run of this migration (`dedup/migration={target}`) is queued or running, and no row of the warehouse "
        f"lacks a `{target}` digest.",
    )
    def sensor(context: dg.SensorEvaluationContext, warehouse: WarehouseResource):
        return comparison_request(context, hashes.key, target, name, warehouse)

    return RehashMigration(source, target, hashes, comparison, backfill_job, compare_job, sensor)


_ACTIVE_RUN_STATUSES = [
    dg.DagsterRunStatus.QUEUED,
    dg.DagsterRunStatus.NOT_STARTED,
    dg.DagsterRunStatus.STARTING,
    dg.DagsterRunStatus.STARTED,
]


def _unfinished_shards(instance: dg.DagsterInstance, hashes_key: dg.AssetKey) -> list[str]:
    """Shards whose latest run stopped at `max_chunks_per_run` with rows left (materialised, but not complete)."""
    unfinished = []
    for shard in SHARDS:
        latest = instance.fetch_materializations(dg.AssetRecordsFilter(hashes_key, asset_partitions=[shard]), limit=1)
        materialization = latest.records[0].asset_materialization if latest.records else None
        complete = materialization.metadata.get("complete") if materialization else None
        if complete is not None and not complete.value:
            unfinished.append(shard)
    return unfinished


def comparison_request(
    context: dg.SensorEvaluationContext,
    hashes_key: dg.AssetKey,
    target: str,
    name: str,
    warehouse: WarehouseResource,
):
    """A comparison run after the latest shard materialisation, once every shard is complete, no migration run is
    active and, in the `warehouse` (last, as the one query), no row lacks the target: a shard's latest run may
    predate rows written since without it."""
    instance = context.instance
    missing = set(SHARDS) - instance.get_materialized_partitions(hashes_key)
    if missing:
        return dg.SkipReason(f"{len(missing)} shards not materialised yet")
    unfinished = _unfinished_shards(instance, hashes_key)
    if unfinished:
        return dg.SkipReason(
            f"shards {', '.join(unfinished)} stopped at max_chunks_per_run with rows left: materialise them again"
        )
    if instance.get_runs_count(dg.RunsFilter(tags={MIGRATION_TAG: target}, statuses=_ACTIVE_RUN_STATUSES)):
        return dg.SkipReason("a migration run is queued or running")
    latest = instance.fetch_materializations(hashes_key, limit=1).records[0].storage_id
    if context.cursor and int(context.cursor) >= latest:
        return dg.SkipReason("already compared after the latest shard")
    with warehouse.get().engine.connect() as conn:
        left = rehash_progress(conn, target).left
    if left:
        return dg.SkipReason(
            f"{left} rows have no {target} digest although every shard's latest run completed (rows written "
            "since without it): backfill the shards again"
        )
    return dg.SensorResult(run_requests=[dg.RunRequest(run_key=f"{name}-after-{latest}")], cursor=str(latest))


# ---------------------------------------------------------------- switch and retire


class SwitchConfig(dg.Config):
    target: str = Field(description="The hash version to make active, e.g. content/2.")
    force: bool = Field(default=False, description="Switch although rows lack the target or the comparison failed.")
    reason: str = Field(default="", description="Why (required with force); stored in hash_version_events.")
    overlap_hours: float = Field(
        default=24.0,
        description="Overlap window (one crawl cycle): retiring the old version is refused before it ends.",
    )


class RetireConfig(dg.Config):
    version: str = Field(description="The old hash version whose digests are dropped, e.g. content/1.")
    force: bool = Field(default=False, description="Retire before the overlap window is over.")
    reason: str = Field(default="", description="Why (required with force); stored in hash_version_events.")


def _refused(context: dg.OpExecutionContext, exc: MigrationRefused | ValueError) -> dg.Failure:
    """A refusal (not safe now) or a launchpad mistake (an unknown version, force without a reason) as a step
    failure that says what to change, not a traceback."""
    context.log.error(str(exc))
    problems = exc.problems if isinstance(exc, MigrationRefused) else [str(exc)]
    return dg.Failure(
        description=str(exc), metadata={"problems": dg.MetadataValue.md("\n".join(f"- {p}" for p in problems))}
    )


@dg.op(
    description="Make the target hash version active "
    "(refused while rows lack it or the comparison failed, unless forced)."
)
def switch_active_hash_version(
    context: dg.OpExecutionContext, config: SwitchConfig, warehouse: WarehouseResource
) -> dg.Output:
    try:
        report = switch_hash_version(
            warehouse.get(),
            config.target,
            force=config.force,
            reason=config.reason,
            run_id=context.run_id,
            overlap_hours=config.overlap_hours,
        )
    except (MigrationRefused, ValueError) as exc:
        raise _refused(context, exc) from None
    if report.forced:
        context.log.warning(
            f"FORCED switch {report.from_version} -> {report.to_version}: {report.reason} "
            f"({'; '.join(report.problems)})"
        )
    context.log.info(
        f"active hash version is now {report.to_version}: {report.promoted} rows rewritten, "
        f"{report.kept_merged} merged "
        f"and {report.kept_unhashable} unhashable rows keep {report.from_version} until it is retired "
        f"(not before {report.overlap_until.isoformat()})"
    )
    return dg.Output(None, metadata=report.as_metadata())


@dg.op(description="Drop an old hash version's digests after the overlap window; merged rows go to record_history.")
def retire_old_hash_version(
    context: dg.OpExecutionContext,
    config: RetireConfig,
    warehouse: WarehouseResource,
    near_dup: NearDupResource,
) -> dg.Output:
    try:
        report = retire_hash_version(
            warehouse.get(),
            config.version,
            force=config.force,
            reason=config.reason,
            run_id=context.run_id,
            representative=near_dup.representative,
        )
    except (MigrationRefused, ValueError) as exc:
        raise _refused(context, exc) from None
    if report.forced:
        context.log.warning(f"FORCED retire of {report.version}: {report.reason} ({'; '.join(report.problems)})")
    return dg.Output(None, metadata=report.as_metadata())


class UrlSwitchConfig(dg.Config):
    target: str = Field(default=URL_VERSION, description="The URL version the warehouse's keys move to.")


@dg.op(description="Move the warehouse's keys to a new URL version (url/2: no userinfo, RFC 5952 IPv6 hosts).")
def switch_active_url_version(
    context: dg.OpExecutionContext, config: UrlSwitchConfig, warehouse: WarehouseResource, near_dup: NearDupResource
) -> dg.Output:
    try:
        report = migrate_url_version(
            warehouse.get(), config.target, run_id=context.run_id, representative=near_dup.representative
        )
    except ValueError as exc:
        raise _refused(context, exc) from None
    context.log.info(
        f"URL version is now {report.to_version}: {report.rows_rewritten} rows rewritten, "
        f"{report.rows_filed} filed in record_history"
    )
    return dg.Output(None, metadata=report.as_metadata())


@dg.job(
    name="switch_url_version",
    tags={MIGRATION_TAG: "url"},
    description="Move an existing warehouse's keys to URL version url/2 (run config: target).",
)
def url_switch_job():
    switch_active_url_version()


@dg.job(
    name="switch_hash_version",
    tags={MIGRATION_TAG: "switch"},
    description="Switch the active hash version (run config: target, force, reason, overlap_hours).",
)
def switch_job():
    switch_active_hash_version()


@dg.job(
    name="retire_hash_version",
    tags={MIGRATION_TAG: "retire"},
    description="Retire an old hash version after the overlap window (run config: version, force, reason).",
)
def retire_job():
    retire_old_hash_version()


# ---------------------------------------------------------------- the registered migrations

#: Migrations offered in the UI. The next rule change is one more line: rehash_migration("content/2", "content/3").
MIGRATIONS = [rehash_migration("content/1", "content/2")]

#: The target version of each registered migration's assets: the value of their runs' `dedup/migration` tag.
MIGRATION_ASSETS: dict[dg.AssetKey, str] = {a.key: m.target for m in MIGRATIONS for a in (m.hashes, m.comparison)}


def migration_lane(run: dg.DagsterRun) -> str | None:
    """The target version of the migration whose assets (or their checks) `run` materialises, or None.

    From the run's asset and check selection alone: a run of a whole job has none, and its job's tags say.
    """
    keys = [*(run.asset_selection or ()), *(check.asset_key for check in run.asset_check_selection or ())]
    return next((MIGRATION_ASSETS[key] for key in keys if key in MIGRATION_ASSETS), None)


def rehash_definitions(migrations: list[RehashMigration] = MIGRATIONS) -> dg.Definitions:
    """The migrations' assets, jobs and sensors, the switch and retire jobs, and the `rehash` resource."""
    return dg.Definitions(
        assets=[asset for m in migrations for asset in (m.hashes, m.comparison)],
        jobs=[job for m in migrations for job in (m.backfill_job, m.compare_job)]
        + [switch_job, retire_job, url_switch_job],
        sensors=[m.sensor for m in migrations],
        resources={"rehash": RehashResource()},
    )
