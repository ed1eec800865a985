"""Run the whole ladder over a landing folder on the configured Dagster instance and warehouse.

Shared by the command line and the end-to-end tests: every batch becomes a
partition and one in-process run of the `dedup_ladder` job, so the runs and
their metadata show in the Dagster UI afterwards. Each run is created with the
origin of the workspace's code location, as a run launched from the UI is, so
the UI can re-execute a failed one.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path

import dagster as dg
from dagster._core.definitions.job_base import InMemoryJob
from dagster._core.execution.api import create_execution_plan, execute_run
from dagster._core.execution.execute_in_process import merge_run_tags
from dagster._core.execution.execution_result import ExecutionResult
from dagster._core.instance.ref import InstanceRef
from dagster._core.remote_origin import RemoteJobOrigin, RemoteRepositoryOrigin
from dagster._core.workspace.load import location_origin_from_module_name
from sqlalchemy import func, make_url, select

from dedup_pipeline import environment, heap
from dedup_pipeline.cli.lanes import DEFAULT_WORKERS, lane_workers, source_lanes
from dedup_pipeline.cli.liveness import PROCESS_TAG, process_token, release_runs_of_dead_processes
from dedup_pipeline.core.errors import ConfigurationError
from dedup_pipeline.core.parallel import available_cpus, ordered_map, start_preloading
from dedup_pipeline.defs.alerts import error_summary
from dedup_pipeline.defs.partitions import crawl_batches_partitions
from dedup_pipeline.defs.pools import ensure_pool_limits
from dedup_pipeline.landing import batch_source, scan_landing
from dedup_pipeline.store.schema import dedup_decisions, records
from dedup_pipeline.store.warehouse import Warehouse, default_database_url

LOCAL_DAGSTER_HOME = ".dagster_home"
# The command line prints its own summary; Dagster's step-by-step log stays in the UI.
_QUIET_RUN_CONFIG = {"loggers": {"console": {"config": {"log_level": "CRITICAL"}}}}
#: The code location of the repository's workspace.yaml (and of pyproject's [tool.dagster]), whose origin runs carry.
CODE_LOCATION = "dedup_pipeline"
DEFINITIONS_MODULE = "dedup_pipeline.definitions"


def ensure_dagster_home() -> Path:
    """Use $DAGSTER_HOME, else a git-ignored `.dagster_home` folder in the working directory.

    Never the checkout folder itself: a new `.dagster_home` starts from a copy of the checkout's `dagster.yaml`
    (else with telemetry off); production instances live in deploy/.
    """
    home = environment.dagster_home()
    if home:
        if not Path(home).is_dir():  # as Dagster says it, before the run would fail on a file inside it
            raise ConfigurationError(
                f"DAGSTER_HOME={home} is not a folder: create it (mkdir -p), "
                f"or unset DAGSTER_HOME to use ./{LOCAL_DAGSTER_HOME}"
            )
        return Path(home)
    local = Path.cwd() / LOCAL_DAGSTER_HOME
    local.mkdir(parents=True, exist_ok=True)
    config = local / "dagster.yaml"
    if not config.exists():
        checkout_config = Path.cwd() / "dagster.yaml"
        config.write_text(checkout_config.read_text() if checkout_config.exists() else "telemetry:\n  enabled: false\n")
    environment.use_dagster_home(local)
    return local


@dataclass
class BatchSummary:
    batch: str
    records_in: int
    quarantined: int
    exact_duplicates: int
    changed: int
    new: int
    stale: int
    near_duplicates: int
    change_ignored: int = 0  # the `keep_first` policy's changes left unstored
    erased: int = 0  # records of erased subjects, suppressed
    capped: int = 0  # records that met the near rung's `max_candidates`


@dataclass
class LadderSummary:
    batches: list[BatchSummary] = field(default_factory=list)
    warehouse_records: int = 0
    failed: dict[str, str] = field(default_factory=dict)  # batch -> error: their runs failed, the others went on
    notices: list[str] = field(default_factory=list)  # landing files left alone, and why
    stored_before_failing: dict[str, BatchSummary] = field(default_factory=dict)  # failed batch -> what it stored
    held: dict[str, str] = field(default_factory=dict)  # batch -> why it was not run (an earlier one failed)
    order: list[str] = field(default_factory=list)  # every batch tried, held or not, in run order

    def add(self, other: LadderSummary) -> None:
        """Take in a lane's batches, failures, held batches and notices."""
        self.batches += other.batches
        self.failed.update(other.failed)
        self.stored_before_failing.update(other.stored_before_failing)
        self.held.update(other.held)
        self.order += other.order
        self.notices += [notice for notice in other.notices if notice not in self.notices]

    def as_dict(self) -> dict:
        return {
            "batches": [asdict(b) for b in self.batches],
            "warehouse_records": self.warehouse_records,
            "failed": [
                {"batch": batch, "error": error, "stored": asdict(self.stored_before_failing[batch])}
                if batch in self.stored_before_failing
                else {"batch": batch, "error": error}
                for batch, error in self.failed.items()
            ],
            "held": [{"batch": batch, "reason": reason} for batch, reason in self.held.items()],
            "notices": self.notices,
        }

    def rows(self) -> list[tuple[str, BatchSummary]]:
        """(status, figures) of every batch in run order: `ok`, `FAILED` (what it stored before failing) or
        `held` (nothing: not run)."""
        done = {b.batch: b for b in self.batches}
        rows = []
        for key in self.order or list(done):
            if key in done:
                rows.append(("ok", done[key]))
            elif key in self.failed:
                rows.append(("FAILED", self.stored_before_failing.get(key) or BatchSummary(key, *[0] * 7)))
            elif key in self.held:
                rows.append(("held", BatchSummary(key, *[0] * 7)))
        return rows


class Progress:
    """What `run_landing_folder` tells its caller while it works: one call before and one after each batch."""

    def start(self, total: int) -> None:
        """`total` batches are about to run."""

    def batch_started(self, key: str) -> None:
        """`key` starts."""

    def batch_done(self, key: str, status: str, seconds: float) -> None:
        """`key` ended `ok`, `FAILED` or `held` (not run), after `seconds`."""

    def finish(self) -> None:
        """Every batch is done."""


def remote_job_origin(job_name: str, repository_name: str) -> RemoteJobOrigin:
    """The origin of a job of the code location as workspace.yaml declares it (built by the function Dagster's
    workspace loader calls for its `python_module` entry).

    The UI re-executes a run (and the daemon retries one) in the code location its origin names.
    """
    location = location_origin_from_module_name(DEFINITIONS_MODULE, None, None, CODE_LOCATION)
    return RemoteJobOrigin(RemoteRepositoryOrigin(location, repository_name), job_name)


#: What the lanes' worker processes are forked with, imported once (`cli/lane_preload.py`).
LANE_PRELOAD = ("dedup_pipeline.cli.lane_preload",)


def run_config_for(landing: Path, canonical_workers: int | None = None) -> dict:
    """The run config of a command-line run: a quiet console, the landing folder it read and, for a lane of
    several, the canonical rung's share of the CPUs.

    The folder is in the run's config, not only in this process's environment, so that a re-execution from the
    UI (which copies its parent's run config, in a webserver that may know another folder) reads the same file.
    """
    resources = {"landing": {"config": {"folder": str(landing)}}}
    if canonical_workers is not None:
        # A resource's config in the run replaces the one it was defined with: its fields the environment sets
        # (DEDUP_ON_CHANGED) are named here again, or the lane's runs would take the field's default.
        from_env = {
            field.split(".")[1]: {"env": name}
            for field, name in environment.resource_variables().items()
            if field.startswith("ladder.")
        }
        resources["ladder"] = {"config": {**from_env, "canonical_workers": canonical_workers}}
    return {**_QUIET_RUN_CONFIG, "resources": resources}


def execute_partition(
    job: dg.JobDefinition,
    partition_key: str,
    instance: dg.DagsterInstance,
    origin: RemoteJobOrigin,
    tags: dict,
    run_config: dict,
) -> ExecutionResult:
    """Execute `job` for one partition in this process, as `job.execute_in_process` does (the same executor,
    tags and run config), in a run created with `origin`."""
    in_process = job.as_ephemeral_job(resource_defs={}, input_values={})  # what execute_in_process runs
    tags = merge_run_tags(job, partition_key, tags, None, instance, run_config)
    ref = instance.get_ref() if instance.is_persistent else None
    plan = create_execution_plan(in_process, run_config, instance_ref=ref, tags=tags)
    run = instance.create_run_for_job(
        in_process, execution_plan=plan, run_config=run_config, tags=tags, remote_job_origin=origin
    )
    return execute_run(InMemoryJob(in_process), run, instance)


def _metadata(result: ExecutionResult, asset_name: str) -> dict:
    materializations = result.asset_materializations_for_node(asset_name)
    if not materializations:
        return {}
    return {key: value.value for key, value in materializations[-1].metadata.items()}


@contextmanager
def interrupt_watch() -> Iterator[Callable[[], bool]]:
    """A function telling whether a Ctrl-C (SIGINT) reached this process since the watch began, whoever handled it.

    A Dagster run swallows a SIGINT that lands outside a step, and one that lands in a query becomes a cancelled
    query, which the step's retry runs again: the batch then ends `ok` and the next one would start. The wakeup
    fd of `signal` hears every signal whatever handler is installed, so it is read between batches. Off the main
    thread (where no handler runs), it hears nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        yield lambda: False
        return
    read, write = os.pipe()
    os.set_blocking(read, False)
    os.set_blocking(write, False)
    previous = signal.set_wakeup_fd(write)
    heard = []

    def interrupted() -> bool:
        with contextlib.suppress(BlockingIOError):
            heard.extend(os.read(read, 4096))
        return signal.SIGINT in heard

    try:
        yield interrupted
    finally:
        signal.set_wakeup_fd(previous)
        os.close(read)
        os.close(write)


#: The failure reason of a batch whose run Ctrl-C (SIGINT) stopped.
INTERRUPTED = "interrupted (Ctrl-C): its run stopped and is marked failed; the next run does it again"


def _interrupted(result: ExecutionResult) -> bool:
    """Whether the run ended because the process was interrupted (Dagster turns SIGINT into a failure)."""
    names = {"DagsterExecutionInterruptedError", "KeyboardInterrupt"}
    for event in result.get_step_failure_events():
        error = event.step_failure_data.error
        while error is not None:
            if error.cls_name in names:
                return True
            error = error.cause
    failure = result.get_run_failure_event()
    return failure is not None and "interrupted" in (failure.message or "")


def _retries(key: str, result: ExecutionResult) -> list[str]:
    """A line per step of the run that met a transient error and was tried again (each try waits seconds, and a
    warehouse that keeps timing out is worth a look), with the error."""
    retried = result.filter_events(lambda event: event.event_type == dg.DagsterEventType.STEP_UP_FOR_RETRY)
    return [
        f"batch {key}: {event.step_key} was tried again after: "
        + (error_summary(event.step_retry_data.error) if event.step_retry_data.error else "a transient error")
        for event in retried
    ]


def _failure_reason(result: ExecutionResult) -> str:
    """What failed the run, on one line: the blocking check that failed, with what it found; else the step and its
    innermost error, as the failure alert says it."""
    for evaluation in result.get_asset_check_evaluations():
        if not evaluation.passed and evaluation.severity == dg.AssetCheckSeverity.ERROR and evaluation.description:
            found = " ".join(evaluation.description.split("\n")[0].split())
            return f"{evaluation.asset_key.to_user_string()} / {evaluation.check_name} blocked the run: {found}"
    for event in result.get_step_failure_events():
        if event.step_failure_data.error is not None:
            return f"{event.step_key}: {error_summary(event.step_failure_data.error)}"
    failure = result.get_run_failure_event()
    return failure.message if failure is not None else "the run failed"


@contextmanager
def one_run_per_landing_folder(home: Path, landing: Path) -> Iterator[None]:
    """Hold, for the command's life, a lock per landing folder in the Dagster home `home`: a second `run` over the
    same folder (a cron entry overlapping the last one) is refused, instead of running the source's batches beside
    the first's, out of landing order, and counting every one twice."""
    name = hashlib.sha256(str(landing.resolve()).encode()).hexdigest()[:16]
    with open(home / f".dedup-run-{name}.lock", "a+") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.seek(0)
            holder = lock.read().strip() or "?"
            raise ConfigurationError(
                f"another `dedup-pipeline run` (pid {holder}) is running over {landing.resolve()}: it runs every "
                "batch of the folder; let it end"
            ) from None
        lock.truncate(0)
        lock.write(str(os.getpid()))
        lock.flush()
        yield


def _local_instance() -> dg.DagsterInstance:
    """The instance of $DAGSTER_HOME; processes starting on a new one at once create its storage one at a time."""
    with open(Path(environment.dagster_home()) / ".dedup-instance.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # Dagster's SQLite storage creation is not safe against a twin
        return dg.DagsterInstance.get()


def refuse_beside_other_writers(instance: dg.DagsterInstance, url: str) -> None:
    """ConfigurationError when a run of the instance is running (the UI's, a sensor's): on an SQLite warehouse it
    writes, and SQLite takes one writer at a time, so this command's steps would wait on it for minutes, retried
    after each lock timeout, with no word of why. (A run of a killed `dedup-pipeline` is released before.)"""
    running = [dg.DagsterRunStatus.STARTING, dg.DagsterRunStatus.STARTED, dg.DagsterRunStatus.CANCELING]
    active = instance.get_runs(dg.RunsFilter(statuses=running), limit=1)
    if active:
        run = active[0]
        raise ConfigurationError(
            f"run {run.run_id[:8]} of {run.job_name} ({run.status.value.lower()}, from the UI, a sensor or a "
            f"schedule) is writing the SQLite warehouse {url}, which takes one writer at a time: wait until it "
            "ends (the UI's Runs page; one whose process was killed stays there as started: terminate it), or put "
            "the warehouse on PostgreSQL (DEDUP_DATABASE_URL)"
        )


def _summary_of(key: str, result: ExecutionResult, warehouse: Warehouse) -> BatchSummary:
    """A batch's figures from its run's materialisations; for a rung that did not finish (a failed run), the
    decisions it committed before failing, from the warehouse's decision log."""
    raw = _metadata(result, "raw_crawl_batches")
    canonical = _metadata(result, "canonical_records")
    exact = _metadata(result, "deduplicated_records")
    exact.update(exact.pop("figures", {}))  # the figures the UI does not plot
    near = _metadata(result, "near_duplicate_clusters")
    if not exact and raw:
        d = dedup_decisions.c
        committed = select(d.decision, func.count()).where(d.batch_id == key, d.run_id == result.run_id)
        with warehouse.engine.connect() as conn:
            exact = dict(conn.execute(committed.group_by(d.decision)).all())
    return BatchSummary(
        batch=key,
        records_in=int(raw.get("lines", 0)),
        quarantined=int(raw.get("quarantined", 0)) + int(canonical.get("quarantined", 0)),
        exact_duplicates=int(exact.get("exact_duplicate", 0)),
        changed=int(exact.get("changed", 0)),
        new=int(exact.get("new", 0)),
        stale=int(exact.get("stale", 0)),
        near_duplicates=int(near.get("near_duplicates", 0)),
        change_ignored=int(exact.get("change_ignored", 0)),
        erased=int(exact.get("erased", 0)),
        capped=int(near.get("capped_records", 0)),
    )


def run_landing_folder(
    landing: Path,
    instance: dg.DagsterInstance | None = None,
    settle_seconds: float = 0.0,
    workers: int = DEFAULT_WORKERS,
    progress: Progress | None = None,
) -> LadderSummary:
    """Register every settled batch file in `landing` and materialise the ladder for each.

    A source's batches run one after the other in landing (name) order; on a
    PostgreSQL warehouse, the sources' lanes run side by side in `workers`
    worker processes (`cli/lanes.py`; 0, the default: one per CPU, at most one
    per source; 1: all in this process). A batch whose run fails is reported in `failed`, with
    what it stored before failing, and the batches of other sources run all
    the same; the later batches of its source are `held`, not run, as the
    production lanes hold them: a source's batches are stored in landing order,
    so one that failed on a transient error is run again (with those after it)
    by the next `run`. Files modified in the last `settle_seconds`, and files
    that are not batches, are left alone and named in `notices`. `progress`
    hears of each batch as it starts and ends.
    """
    progress = progress or Progress()
    landing = landing.resolve()
    scan = scan_landing(landing, settle_seconds)
    keys = [batch.key for batch in scan.batches]
    lanes = source_lanes(keys)
    url = default_database_url()
    dialect = make_url(url).get_backend_name()
    if lane_workers(workers, len(lanes), dialect, instance is None or instance.is_persistent) > 1:
        # The lanes' imports, once, while this process opens the instance and the warehouse and prepares the runs.
        start_preloading(LANE_PRELOAD)
    instance = instance or _local_instance()
    warehouse = Warehouse(url)
    workers = lane_workers(workers, len(lanes), dialect, instance.is_persistent)
    warehouse.create_schema()  # unreachable: one clear error now, not a failed run per batch
    ensure_pool_limits(instance)  # here, once: the lanes' first steps setting it at once would fail on PostgreSQL
    known = set(instance.get_dynamic_partitions(crawl_batches_partitions.name))
    missing = [key for key in keys if key not in known]
    if missing:
        instance.add_dynamic_partitions(crawl_batches_partitions.name, missing)
    summary = LadderSummary(notices=scan.notices(settle_seconds))
    for run_id in release_runs_of_dead_processes(instance):
        summary.notices.append(f"run {run_id} died with its process: marked failed, its warehouse pool slots freed")
    if dialect == "sqlite":
        refuse_beside_other_writers(instance, url)
    progress.start(len(keys))
    if workers > 1:
        with forwarded(progress) as events:
            # The lanes share the CPUs: a lane's canonical rung takes its share, not one worker per CPU of its own.
            share = max(1, available_cpus() // workers)
            lane_runs = partial(_run_lane, landing, instance.get_ref(), events, share)
            for lane in ordered_map(lane_runs, lanes, workers, preload=LANE_PRELOAD):
                summary.add(lane)
        summary.order.sort(key=keys.index)
        summary.batches.sort(key=lambda b: keys.index(b.batch))
        if capped := sum(b.capped for b in summary.batches):
            summary.notices.append(
                f"{capped} record(s) met the near rung's max_candidates: which candidates such a record meets "
                "depends on what the other lanes had indexed, so the links around them may differ from a "
                "--workers 1 run's (see docs/near.md, Boilerplate and large clusters)"
            )
    else:
        summary.add(run_batches(landing, keys, instance, warehouse, progress))
    progress.finish()
    with warehouse.engine.connect() as conn:
        summary.warehouse_records = conn.execute(select(func.count()).select_from(records)).scalar_one()
    return summary


class _ForwardedProgress(Progress):
    """A worker process's progress: each event onto the queue the parent's `forwarded` drains."""

    def __init__(self, events) -> None:
        self.events = events

    def batch_started(self, key: str) -> None:
        self.events.put(("batch_started", (key,)))

    def batch_done(self, key: str, status: str, seconds: float) -> None:
        self.events.put(("batch_done", (key, status, seconds)))


@contextmanager
def forwarded(progress: Progress) -> Iterator[object]:
    """A queue worker processes can put progress events on; a thread here hands them to `progress`."""
    manager = multiprocessing.get_context("spawn").Manager()
    events = manager.Queue()

    def drain() -> None:
        while (event := events.get()) is not None:
            getattr(progress, event[0])(*event[1])

    thread = threading.Thread(target=drain, name="lane-progress", daemon=True)
    thread.start()
    try:
        yield events
    finally:
        events.put(None)
        thread.join()
        manager.shutdown()


def _run_lane(landing: Path, ref: InstanceRef, events, canonical_workers: int, keys: list[str]) -> LadderSummary:
    """A worker process's lane: its batches in order, on the instance `ref` names, each canonical rung on
    `canonical_workers` processes."""
    with dg.DagsterInstance.from_ref(ref) as instance:
        warehouse = Warehouse()
        try:
            return run_batches(landing, keys, instance, warehouse, _ForwardedProgress(events), canonical_workers)
        finally:
            warehouse.dispose()


def run_batches(
    landing: Path,
    keys: list[str],
    instance: dg.DagsterInstance,
    warehouse: Warehouse,
    progress: Progress,
    canonical_workers: int | None = None,
) -> LadderSummary:
    """One run of the ladder per batch, in the order given, in this process; after a batch fails, the later
    batches of its source are held (not run), the others run all the same. `canonical_workers`, if given, is
    the canonical rung's processes (in the runs' config); else the resource's own setting."""
    from dedup_pipeline.definitions import defs

    job = defs.resolve_job_def("dedup_ladder")
    origin = remote_job_origin(job.name, defs.get_repository_def().name)
    summary = LadderSummary()
    failed_sources: dict[str, str] = {}  # source -> its batch that failed
    with interrupt_watch() as interrupted:
        for key in keys:
            summary.order.append(key)
            source = batch_source(key)
            if source in failed_sources:
                summary.held[key] = (
                    f"held: batch {failed_sources[source]} of source {source!r} failed before it; a source's batches "
                    "are stored in landing order, so it runs once that one succeeds"
                )
                progress.batch_done(key, "held", 0.0)
                continue
            progress.batch_started(key)
            started = time.monotonic()
            ok = _run_batch(job, key, instance, origin, warehouse, run_config_for(landing, canonical_workers), summary)
            if not ok:
                failed_sources[source] = key
            progress.batch_done(key, "ok" if ok else "FAILED", time.monotonic() - started)
            if interrupted() or summary.failed.get(key) == INTERRUPTED:  # Ctrl-C: no batch after this one starts
                raise KeyboardInterrupt
            # What the batch imported on first use (the MinHash kernels, redis, matplotlib) and cached lives on.
            heap.settle()
    return summary


def _run_batch(
    job: dg.JobDefinition,
    key: str,
    instance: dg.DagsterInstance,
    origin: RemoteJobOrigin,
    warehouse: Warehouse,
    run_config: dict,
    summary: LadderSummary,
) -> bool:
    """Run the ladder for batch `key` and add its figures (or its failure) to `summary`; whether it succeeded.

    Its own function, so that nothing of the run (its result, its events) is still alive when the caller
    settles the heap after it."""
    result = execute_partition(job, key, instance, origin, {PROCESS_TAG: process_token(instance)}, run_config)
    warning = _metadata(result, "near_duplicate_clusters").get("threshold_warning")
    if warning and f"near rung: {warning}" not in summary.notices:  # the index cannot serve the threshold
        summary.notices.append(f"near rung: {warning}")
    summary.notices += _retries(key, result)
    if result.success:
        summary.batches.append(_summary_of(key, result, warehouse))
    else:
        summary.failed[key] = INTERRUPTED if _interrupted(result) else _failure_reason(result)
        summary.stored_before_failing[key] = _summary_of(key, result, warehouse)
    return result.success
