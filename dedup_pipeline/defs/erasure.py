"""Erasure and retention in the Dagster UI: the `erase_subject` and `prune_retention` jobs, and a daily schedule."""

from datetime import datetime, timedelta
from typing import Optional

import dagster as dg
from pydantic import Field

from dedup_pipeline import environment
from dedup_pipeline.core.erasure import Subject, SubjectError, SubjectKind
from dedup_pipeline.core.errors import ConfigurationError
from dedup_pipeline.defs.resources import NearDupResource, SeenSetResource, WarehouseResource
from dedup_pipeline.defs.sensors import automation_status
from dedup_pipeline.environment import DEFAULT_ERASURE_RUN_HOURS, ERASURE_RUN_RETENTION_ENV, RETENTION_DAYS_ENV
from dedup_pipeline.ladder.erasure import erase_subject as run_erasure
from dedup_pipeline.ladder.erasure import url_seen_set_from_env
from dedup_pipeline.ladder.retention import RetentionSettings
from dedup_pipeline.ladder.retention import prune_retention as run_retention
from dedup_pipeline.store.warehouse import utcnow

ERASE_JOB = "erase_subject"
RETENTION_CRON = "41 3 * * *"
_FINISHED = [dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED]


class EraseSubjectConfig(dg.Config):
    """Who to erase. The value is needed once, to find the rows; only keyed fingerprints of it are kept."""

    kind: str = Field(description=f"How the subject is named: one of {[k.value for k in SubjectKind]}.")
    value: str = Field(description="The natural key, URL (any variant), field value, or 64-hex content digest.")
    field: Optional[str] = Field(
        default=None, description="kind 'field': the field path, e.g. seller_id or author.email."
    )
    version: Optional[str] = Field(
        default=None, description="kind 'content_digest': the digest's hash version; empty means the active version."
    )
    request_id: str = Field(
        default="", description="Your reference for the request (a ticket id; never personal data)."
    )


@dg.op(name="erase_data_subject")
def erase_data_subject(
    context: dg.OpExecutionContext,
    config: EraseSubjectConfig,
    warehouse: WarehouseResource,
    near_dup: NearDupResource,
    seen_set: SeenSetResource,
) -> dg.Output:
    """Removes every copy of the subject in one transaction and leaves tombstones that no re-crawl gets past.
    Read `records_removed`, `removed[<table>]` and `tombstones_added` (counts, never values); the warehouse's
    `erasure_requests` keeps the audit, and `prune_retention` deletes the finished run, whose config names the
    subject, after DEDUP_ERASURE_RUN_RETENTION_HOURS.

    See docs/privacy.md.
    """
    wh = warehouse.get()
    version = config.version or (wh.active_hash_version() if config.kind == SubjectKind.CONTENT_DIGEST.value else None)
    try:
        subject = Subject.parse(config.kind, config.value, field=config.field, version=version)
    except SubjectError as exc:  # a launchpad mistake: what to change, never the value, and no traceback
        raise dg.Failure(description=f"the subject cannot be erased as given: {exc}") from None
    try:
        report = run_erasure(
            wh, subject, config.request_id, seen_set.get(), near_dup.representative, url_seen_set_from_env()
        )
    except ConfigurationError as exc:  # a setting to fix (the tombstone key, say): what to do, no traceback
        raise dg.Failure(description=f"{type(exc).__name__}: {exc}") from None
    context.log.info(f"erasure {report.erasure_id}: {report.removed.get('records', 0)} current record(s) removed")
    for error in report.seen_set_errors:
        context.log.warning(f"erasure {report.erasure_id}: {error}")
    return dg.Output(report.removed, metadata=report.as_metadata())


@dg.job(
    name=ERASE_JOB,
    tags={"dedup/kind": "erasure"},
    description="Erase a data subject (run config: kind, value, field, version, request_id). "
    "Launch from the launchpad.",
)
def erase_subject_job():
    erase_data_subject()


def _days(what: str, setting: str) -> str:
    """A retention field's description: what it keeps, its variable and its default."""
    return f"{what} ({RETENTION_DAYS_ENV[setting]}, {getattr(RetentionSettings, setting)})."


class RetentionConfig(dg.Config):
    """Empty fields take the environment's value, else the documented default."""

    decision_days: Optional[int] = Field(
        default=None, description=_days("Decision-log rows", "decision_days") + " 0 keeps forever."
    )
    history_days: Optional[int] = Field(default=None, description=_days("Superseded content", "history_days"))
    staging_days: Optional[int] = Field(
        default=None, description=_days("Staged canonical rows of old batches", "staging_days")
    )
    quarantine_days: Optional[int] = Field(default=None, description=_days("Quarantined raw lines", "quarantine_days"))
    erasure_run_hours: Optional[int] = Field(
        default=None,
        description="Finished erase_subject runs, whose config names the subject "
        f"({ERASURE_RUN_RETENTION_ENV}, {DEFAULT_ERASURE_RUN_HOURS}).",
    )


def erasure_run_hours(override: int | None = None) -> int:
    """Hours finished erasure runs are kept: `override`, else $DEDUP_ERASURE_RUN_RETENTION_HOURS, else 24."""
    if override is not None:
        return override
    return environment.erasure_run_hours()


def delete_old_erasure_runs(instance: dg.DagsterInstance, hours: int, now: datetime | None = None) -> int:
    """Delete erasure runs (their config holds the subject's value) that finished more than `hours` ago; 0 keeps
    them.

    Each goes with its compute logs (its stdout and stderr, which `delete_run` leaves behind): Dagster keys
    a run's captured logs `[run_id, "compute_logs", ...]`, so one prefix holds them all, in whichever
    compute log manager the instance uses. The logs go first: a failure there leaves the run to be found
    and deleted by the next retention run.
    """
    if hours < 0:
        raise ValueError(f"erasure_run_hours must be 0 (keep forever) or a number of hours, got {hours}")
    if hours == 0:
        return 0
    cutoff = (now or utcnow()) - timedelta(hours=hours)
    # A finished run is last updated when it ends.
    runs = instance.get_run_records(dg.RunsFilter(job_name=ERASE_JOB, statuses=_FINISHED, updated_before=cutoff))
    for record in runs:
        run_id = record.dagster_run.run_id
        instance.compute_log_manager.delete_logs(prefix=[run_id])
        instance.delete_run(run_id)
    return len(runs)


@dg.op(name="prune_expired_rows")
def prune_expired_rows(
    context: dg.OpExecutionContext, config: RetentionConfig, warehouse: WarehouseResource
) -> dg.Output:
    """Deletes decision-log rows, history, staged canonical rows and quarantined lines past their retention,
    clears the key and digest of `erased` decision rows, and deletes finished `erase_subject` runs. Read
    `rows_pruned`, `pruned[<table>]`, `erasure_runs_deleted` and the `retention_days[...]` applied.

    See docs/privacy.md.
    """
    settings = RetentionSettings.from_env(
        decision_days=config.decision_days,
        history_days=config.history_days,
        staging_days=config.staging_days,
        quarantine_days=config.quarantine_days,
    )
    report = run_retention(warehouse.get(), settings)
    meta = report.as_metadata()
    meta["erasure_runs_deleted"] = delete_old_erasure_runs(
        context.instance, erasure_run_hours(config.erasure_run_hours)
    )
    meta.update(
        {
            f"retention_days[{name}]": getattr(settings, name)
            for name in ("decision_days", "history_days", "staging_days", "quarantine_days")
        }
    )
    return dg.Output(report.pruned, metadata=meta)


@dg.job(name="prune_retention", description="Delete identifiers and copies past their retention (see docs/privacy.md).")
def prune_retention_job():
    prune_expired_rows()


prune_retention_daily = dg.ScheduleDefinition(
    name="prune_retention_daily",
    job=prune_retention_job,
    cron_schedule=RETENTION_CRON,
    default_status=dg.DefaultScheduleStatus(automation_status().value),
    description="Daily retention: decision log, history, staged rows, quarantine, finished erasure runs.",
)

erasure_jobs = [erase_subject_job, prune_retention_job]
erasure_schedules = [prune_retention_daily]
