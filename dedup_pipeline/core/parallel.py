"""CPU-bound work spread over worker processes, results in input order, memory bounded.

`concurrent.futures`' own `Executor.map` submits every item at once (before
Python 3.14's `buffersize`), so a whole batch would sit in memory; `ordered_map`
keeps at most two items per worker submitted and yields results in input order.
"""

from __future__ import annotations

import math
import multiprocessing
import multiprocessing.forkserver
import os
import select
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from functools import partial
from pathlib import Path
from types import ModuleType
from typing import TypeVar

from dedup_pipeline import environment

Item = TypeVar("Item")
Result = TypeVar("Result")


#: Where Linux mounts the control groups, and where a process reads which ones it is in.
CGROUP_ROOT = Path("/sys/fs/cgroup")
CGROUP_MEMBERSHIP = Path("/proc/self/cgroup")


def available_cpus() -> int:
    """CPUs this process may use: those it may run on (its affinity mask), and no more than its control group's
    CPU quota, rounded up (a container's CPU limit: Kubernetes' `resources.limits.cpu`, `docker run --cpus`).

    A pod limited to 2 CPUs on a 64-CPU node sees 64 in its affinity mask; one worker per CPU means 2 there.
    """
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    quota = cpu_quota()
    return cpus if quota is None else max(1, min(cpus, math.ceil(quota)))


def cpu_quota(root: Path = CGROUP_ROOT, membership: Path = CGROUP_MEMBERSHIP) -> float | None:
    """The CPU time this process's control groups allow, in CPUs (1.5: a CPU and a half), or None without a quota.

    cgroup v2: `cpu.max` ("<quota> <period>", or "max <period>"); v1: the cpu controller's `cpu.cfs_quota_us` over
    `cpu.cfs_period_us` (-1: none). Read in the process's own group and each group above it (a parent's quota
    holds for its children; the smallest wins), else at the root of the mount: a container sees its own group
    there. None where the files are missing or unreadable (not Linux, no cpu controller).
    """
    try:
        lines = membership.read_text().splitlines()
    except OSError:
        return None
    quotas = []
    for line in lines:
        if line.count(":") < 2:
            continue
        _, controllers, path = line.split(":", 2)
        if controllers == "":  # the v2 hierarchy
            quotas += _quotas(root, Path(path), _v2_quota)
        elif "cpu" in controllers.split(","):
            for mount in (root / controllers, root / "cpu"):
                if mount.is_dir():
                    quotas += _quotas(mount, Path(path), _v1_quota)
                    break
    return min(quotas, default=None)


def _quotas(mount: Path, group: Path, read: Callable[[Path], float | None]) -> list[float]:
    """The quotas of `group` and its ancestors under `mount`, or of the mount's root when the group is not there."""
    own = mount / group.relative_to(group.anchor) if group.is_absolute() else mount / group
    folders = [own, *own.parents] if own.is_dir() else [mount]
    found = [read(folder) for folder in folders if folder == mount or mount in folder.parents]
    return [quota for quota in found if quota is not None]


def _v2_quota(folder: Path) -> float | None:
    try:
        quota, period = (folder / "cpu.max").read_text().split()
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        return None


def _v1_quota(folder: Path) -> float | None:
    try:
        quota = int((folder / "cpu.cfs_quota_us").read_text())
        period = int((folder / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return quota / period if quota > 0 and period > 0 else None


def can_start_processes() -> bool:
    """False inside a daemonic process (a Celery prefork worker, for one), which may not have children."""
    return not multiprocessing.current_process().daemon


def _exit_with_parent(parent: int) -> None:
    """A worker's initializer: end the worker once `parent`, the process that started the pool, is gone.

    A parent killed outright (SIGKILL, out of memory) never tells its workers,
    and they would wait for work forever: each holds the task queue's pipe open
    itself, so it never sees end-of-file. A spawned worker sees its parent
    change; a worker forked from a fork server has the server as its parent,
    which its own workers keep running, so it watches the pool's process itself.
    """
    if os.getppid() == parent:

        def gone() -> None:
            while os.getppid() == parent:
                time.sleep(0.5)

    else:

        def gone() -> None:
            try:
                handle = os.pidfd_open(parent)  # readable once the process has ended (the worker ends with it)
            except (AttributeError, OSError):  # no pidfd (not Linux 5.3+): ask the process table
                while _exists(parent):
                    time.sleep(0.5)
            else:
                select.select([handle], [], [])

    def watch() -> None:
        gone()
        os._exit(1)

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _preloading(preload: Sequence[str]) -> multiprocessing.context.BaseContext | None:
    """The "forkserver" context, importing `preload` once, where the platform has one and `preload` is given."""
    if not preload or "forkserver" not in multiprocessing.get_all_start_methods():
        return None
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload([*preload, *(name for name in main_script_imports() if name not in preload)])
    return context


def main_script_imports() -> list[str]:
    """The modules this process's main script names at its top level (`import x`, `from x import f`).

    A worker, spawned or forked from a fork server, runs the main script again before its first item, as
    multiprocessing prepares every worker; the fork server imports these too, so the worker finds them imported.
    Run as `dedup-pipeline`, that script imports the command line (about 0.3 s of CPU a worker otherwise).
    """
    main = sys.modules.get("__main__")
    names: list[str] = []
    for value in list(vars(main).values()) if main is not None else ():
        try:
            name = value.__name__ if isinstance(value, ModuleType) else getattr(value, "__module__", None)
        except Exception:  # noqa: BLE001 - an object whose attributes cannot be read names no module
            continue
        if isinstance(name, str) and name in sys.modules and name not in ("__main__", "builtins", *names):
            names.append(name)
    return names


def start_preloading(preload: Sequence[str]) -> None:
    """Start the fork server of ``ordered_map(..., preload=preload)`` now: it imports `preload` in the background
    while this process goes on, and workers started later find them imported."""
    if _preloading(preload) is not None:
        multiprocessing.forkserver.ensure_running()


def _in_environment(environ: dict[str, str], cwd: str, function: Callable[[Item], Result], item: Item) -> Result:
    """`function(item)` in the environment and folder of the process that submitted it, as a spawned worker has:
    a worker forked from a fork server has the server's, as they were when it started."""
    environment.adopt(environ)
    os.chdir(cwd)
    return function(item)


def ordered_map(
    function: Callable[[Item], Result], items: Iterable[Item], workers: int, preload: Sequence[str] = ()
) -> Iterator[Result]:
    """``map(function, items)`` on `workers` processes (inline when 1), in input order.

    At most two items per worker are submitted ahead of the one being yielded,
    so memory is bounded by a few items whatever the input's length. `function`
    must be importable by name (a module-level function or a `functools.partial`
    of one): workers are started with "spawn", never forked from a process that
    may hold threads, open connections or locks. With `preload` (module names),
    they are forked from a fork server that imported those modules once (a
    clean process, see `start_preloading`), and the modules the main script
    imports (`main_script_imports`), and run `function` in this process's
    environment variables and folder. The fork server is one per
    process, with the modules of the first `preload` it was started with (a
    later one's are imported by each worker as it needs them). An exception in a worker is
    raised here when its result is reached; closing the generator early cancels
    what is still queued. Workers end by themselves if this process is killed.
    Where processes cannot be started (`can_start_processes`), it runs inline.
    """
    if workers <= 1 or not can_start_processes():
        yield from map(function, items)
        return
    pending: deque[Future] = deque()
    context = _preloading(preload)
    if context is None:
        context = multiprocessing.get_context("spawn")
    else:
        function = partial(_in_environment, environment.snapshot(), os.getcwd(), function)
    pool = ProcessPoolExecutor(workers, mp_context=context, initializer=_exit_with_parent, initargs=(os.getpid(),))
    try:
        # Every worker is started before the first item: a worker lost while the executor was still starting
        # others (it starts them one per submit) left its shutdown waiting forever in our tests (Python 3.11).
        for started in [pool.submit(os.getpid) for _ in range(workers)]:
            started.result()
        for item in items:
            pending.append(pool.submit(function, item))
            if len(pending) > 2 * workers:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


__all__ = ["available_cpus", "can_start_processes", "cpu_quota", "ordered_map", "start_preloading"]
