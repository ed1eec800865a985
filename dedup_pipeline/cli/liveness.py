"""Liveness of `dedup-pipeline` processes: a lock each holds while it lives, so that runs it died with are released.

A run executed in process never says it ended when its process is killed. Each
process holds a file locked while it lives (its mark), beside the Dagster
instance, and tags its runs with the mark's token.
"""

from __future__ import annotations

import atexit
import fcntl
import os
import uuid
from pathlib import Path

import dagster as dg
from dagster._core.storage.tags import PARENT_RUN_ID_TAG

#: The token of the `dedup-pipeline` process that executes a run in process (see `release_runs_of_dead_processes`).
PROCESS_TAG = "dedup/process"
#: Beside the instance: one file per live `dedup-pipeline` process, locked for as long as it lives.
PROCESS_MARKS = ".dedup-processes"


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


def process_token(instance: dg.DagsterInstance) -> str:
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
    beside this instance (another host's), is left alone, and so is a re-execution (from the UI, or the daemon's
    retry): it inherits its parent's tags, the mark among them, but runs in a run worker of its own.
    """
    folder = _marks_folder(instance)
    storage = instance.event_log_storage
    holding = storage.get_concurrency_run_ids() if storage.supports_global_concurrency_limits else set()
    started = instance.get_run_records(
        dg.RunsFilter(statuses=[dg.DagsterRunStatus.STARTED, dg.DagsterRunStatus.STARTING])
    )
    holders = instance.get_run_records(dg.RunsFilter(run_ids=list(holding))) if holding else []
    released = []
    for record in {r.dagster_run.run_id: r for r in [*started, *holders]}.values():
        run = record.dagster_run
        token = run.tags.get(PROCESS_TAG)
        if not token or PARENT_RUN_ID_TAG in run.tags or process_alive(folder, token) is not False:
            continue
        if not run.is_finished:
            instance.report_run_failed(run, message="its dedup-pipeline process is gone: it was killed")
        if storage.supports_global_concurrency_limits:
            storage.free_concurrency_slots_for_run(run.run_id)
        released.append(run.run_id)
    return released
