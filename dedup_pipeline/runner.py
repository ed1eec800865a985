"""Run the whole ladder over a landing folder on the configured Dagster instance and warehouse.

Shared by the command line and the end-to-end tests: every batch becomes a
partition and one in-process run of the `dedup_ladder` job, so the runs and
their metadata show in the Dagster UI afterwards.
"""

from __future__ import annotations

import atexit
import fcntl
import os
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path

import dagster as dg
from sqlalchemy import func, select

from dedup_pipeline.defs.alerts import error_summary
from dedup_pipeline.defs.partitions import crawl_batches_partitions
from dedup_pipeline.landing import LANDING_DIR_ENV, scan_landing
from dedup_pipeline.store.schema import records
from dedup_pipeline.store.warehouse import Warehouse

LOCAL_DAGSTER_HOME = ".dagster_home"
#: The token of the `dedup-pipeline` process that executes a run in process (see `release_runs_of_dead_processes`).
PROCESS_TAG = "dedup/process"
#: Beside the instance: one file per live `dedup-pipeline` process, locked for as long as it lives.
PROCESS_MARKS = ".dedup-processes"
# The command line prints its own summary; Dagster's step-by-step log stays in the UI.
_QUIET_RUN_CONFIG = {"loggers": {"console": {"config": {"log_level": "CRITICAL"}}}}


def ensure_dagster_home() -> Path:
    """Use $DAGSTER_HOME, else a git-ignored `.dagster_home` folder in the working directory.

    Never the repository's `dagster.yaml`: that one is for `dg dev` from the
    checkout; production instances live in deploy/.
    """
    home = os.environ.get("DAGSTER_HOME")
    if home:
        return Path(home)
    local = Path.cwd() / LOCAL_DAGSTER_HOME
    local.mkdir(parents=True, exist_ok=True)
    config = local / "dagster.yaml"
    if not config.exists():
        checkout_config = Path.cwd() / "dagster.yaml"
        config.write_text(checkout_config.read_text() if checkout_config.exists() else "telemetry:\n  enabled: false\n")
    os.environ["DAGSTER_HOME"] = str(local)
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


@dataclass
class LadderSummary:
    batches: list[BatchSummary] = field(default_factory=list)
    warehouse_records: int = 0
    failed: dict[str, str] = field(default_factory=dict)  # batch -> error: their runs failed, the others went on
    notices: list[str] = field(default_factory=list)  # landing files left alone, and why

    def as_dict(self) -> dict:
        return {
            "batches": [asdict(b) for b in self.batches], "warehouse_records": self.warehouse_records,
            "failed": [{"batch": batch, "error": error} for batch, error in self.failed.items()],
            "notices": self.notices,
        }


def _metadata(result: dg.ExecuteInProcessResult, asset_name: str) -> dict:
    materializations = result.asset_materializations_for_node(asset_name)
    if not materializations:
        return {}
    return {key: value.value for key, value in materializations[-1].metadata.items()}


class ProcessMark:
    """This process as the runs it executes name it: a token, and a file it holds locked while it lives.

    The kernel drops the lock when the process dies however it dies (SIGKILL, out of memory, a container
    restart), whatever its PID and PID namespace: unlike a PID, the mark can be neither reused nor mistaken.
    """

    def __init__(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.token = uuid.uuid4().hex
        self.path = folder / f"{self.token}.lock"
        creating = folder / f".{self.token}.tmp"
        self._handle = open(creating, "w")
        fcntl.flock(self._handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.rename(creating, self.path)  # visible only once locked: a checker never sees it unlocked while alive
        atexit.register(self.close)

    def close(self) -> None:
        self.path.unlink(missing_ok=True)
        self._handle.close()


def process_alive(folder: Path, token: str) -> bool | None:
    """Whether the process of `token` lives: True, False (its mark is then removed), or None (no mark here)."""
    path = folder / f"{token}.lock"
    try:
        handle = open(path, "r+")  # never creates it
    except FileNotFoundError:
        return None
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        path.unlink(missing_ok=True)
        return False


_mark: ProcessMark | None = None


def _marks_folder(instance: dg.DagsterInstance) -> Path:
    return Path(instance.root_directory) / PROCESS_MARKS


def _process_token(instance: dg.DagsterInstance) -> str:
    """The token of this process's mark beside `instance` (made on first use)."""
    global _mark
    if _mark is None or _mark.path.parent != _marks_folder(instance):
        _mark = ProcessMark(_marks_folder(instance))
    return _mark.token


def release_runs_of_dead_processes(instance: dg.DagsterInstance) -> list[str]:
    """Mark failed, and free the pool slots of, runs that a `dedup-pipeline` process executed in process and
    that died with it (killed, out of memory); returns their ids.

    A run executed in process never says it ended when its process is killed: it stays STARTED and keeps the
    slots its steps claimed in the `warehouse` pool, and with no daemon to notice, every later run would wait
    for those slots for ever. A run whose process still holds its mark (`ProcessMark`), or whose mark is not
    beside this instance (another host's), is left alone.
    """
    folder = _marks_folder(instance)
    storage = instance.event_log_storage
    holding = storage.get_concurrency_run_ids() if storage.supports_global_concurrency_limits else set()
    started = instance.get_run_records(dg.RunsFilter(statuses=[dg.DagsterRunStatus.STARTED, dg.DagsterRunStatus.STARTING]))
    holders = instance.get_run_records(dg.RunsFilter(run_ids=list(holding))) if holding else []
    released = []
    for record in {r.dagster_run.run_id: r for r in [*started, *holders]}.values():
        run = record.dagster_run
        token = run.tags.get(PROCESS_TAG)
        if not token or process_alive(folder, token) is not False:
            continue
        if not run.is_finished:
            instance.report_run_failed(run, message="its dedup-pipeline process is gone: it was killed")
        if storage.supports_global_concurrency_limits:
            storage.free_concurrency_slots_for_run(run.run_id)
        released.append(run.run_id)
    return released


def _failure_reason(result: dg.ExecuteInProcessResult) -> str:
    """What failed the run, on one line: the step and its innermost error, as the failure alert says it."""
    for event in result.get_step_failure_events():
        if event.step_failure_data.error is not None:
            return f"{event.step_key}: {error_summary(event.step_failure_data.error)}"
    failure = result.get_run_failure_event()
    return failure.message if failure is not None else "the run failed"


def _local_instance() -> dg.DagsterInstance:
    """The instance of $DAGSTER_HOME; processes starting on a new one at once create its storage one at a time."""
    with open(Path(os.environ["DAGSTER_HOME"]) / ".dedup-instance.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # Dagster's SQLite storage creation is not safe against a twin
        return dg.DagsterInstance.get()


def run_landing_folder(
    landing: Path, instance: dg.DagsterInstance | None = None, settle_seconds: float = 0.0
) -> LadderSummary:
    """Register every settled batch file in `landing` and materialise the ladder for each, in name order.

    A batch whose run fails is reported in `failed` and the next one runs all
    the same (the policy orders batches by landing time, so a batch run later
    than a newer one is judged as the older one it is). Files modified in the
    last `settle_seconds`, and files that are not batches, are left alone and
    named in `notices`.
    """
    from dedup_pipeline.definitions import defs

    landing = landing.resolve()
    os.environ[LANDING_DIR_ENV] = str(landing)
    instance = instance or _local_instance()
    scan = scan_landing(landing, settle_seconds)
    batches = scan.batches
    warehouse = Warehouse().create_schema()  # unreachable: one clear error now, not a failed run per batch
    known = set(instance.get_dynamic_partitions(crawl_batches_partitions.name))
    missing = [b.key for b in batches if b.key not in known]
    if missing:
        instance.add_dynamic_partitions(crawl_batches_partitions.name, missing)
    job = defs.resolve_job_def("dedup_ladder")
    summary = LadderSummary(notices=scan.notices(settle_seconds))
    for run_id in release_runs_of_dead_processes(instance):
        summary.notices.append(f"run {run_id} died with its process: marked failed, its warehouse pool slots freed")
    for batch in batches:
        result = job.execute_in_process(
            partition_key=batch.key, instance=instance, raise_on_error=False, run_config=_QUIET_RUN_CONFIG,
            tags={PROCESS_TAG: _process_token(instance)},
        )
        if not result.success:
            summary.failed[batch.key] = _failure_reason(result)
            continue
        raw = _metadata(result, "raw_crawl_batches")
        canonical = _metadata(result, "canonical_records")
        exact = _metadata(result, "deduplicated_records")
        near = _metadata(result, "near_duplicate_clusters")
        summary.batches.append(
            BatchSummary(
                batch=batch.key,
                records_in=int(raw.get("lines", 0)),
                quarantined=int(raw.get("quarantined", 0)) + int(canonical.get("quarantined", 0)),
                exact_duplicates=int(exact.get("exact_duplicate", 0)),
                changed=int(exact.get("changed", 0)),
                new=int(exact.get("new", 0)),
                stale=int(exact.get("stale", 0)),
                near_duplicates=int(near.get("near_duplicates", 0)),
            )
        )
    with warehouse.engine.connect() as conn:
        summary.warehouse_records = conn.execute(select(func.count()).select_from(records)).scalar_one()
    return summary
