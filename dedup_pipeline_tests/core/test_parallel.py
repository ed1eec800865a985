"""ordered_map: worker processes, results in input order, bounded look-ahead, errors and early exits."""

from __future__ import annotations

import multiprocessing
import operator
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dedup_pipeline.core import parallel
from dedup_pipeline.core.parallel import CGROUP_ROOT, cpu_quota, ordered_map

REPO = Path(__file__).resolve().parents[2]


def test_results_come_back_in_input_order_from_worker_processes():
    items = list(range(-50, 50))
    assert list(ordered_map(operator.neg, items, workers=2)) == [-i for i in items]
    assert not multiprocessing.active_children()  # the pool is shut down once the input is used up


def test_one_worker_runs_inline_without_a_pool():
    assert list(ordered_map(operator.neg, [1, 2, 3], workers=1)) == [-1, -2, -3]
    assert not multiprocessing.active_children()


def test_a_workers_exception_is_raised_where_its_result_is_reached():
    results = ordered_map(int, ["1", "2", "not a number", "4"], workers=2)
    assert next(results) == 1 and next(results) == 2
    with pytest.raises(ValueError, match="not a number"):
        next(results)
    assert not multiprocessing.active_children()


def test_the_input_is_read_only_a_few_items_ahead():
    pulled = []

    def items():
        for i in range(1000):
            pulled.append(i)
            yield i

    results = ordered_map(operator.neg, items(), workers=2)
    assert next(results) == 0
    assert len(pulled) <= 2 * 2 + 1  # memory bounded by the workers, not by the input
    results.close()  # leaving early cancels what is queued and stops the workers
    assert len(pulled) < 1000
    assert not multiprocessing.active_children()


def _in_a_daemon(queue) -> None:
    from dedup_pipeline.core.parallel import can_start_processes

    queue.put((can_start_processes(), list(ordered_map(operator.neg, range(5), workers=2))))


def test_a_daemonic_process_such_as_a_celery_worker_runs_inline():
    """Daemonic processes may not have children: the work runs in the process itself instead of failing."""
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    daemon = context.Process(target=_in_a_daemon, args=(queue,), daemon=True)
    daemon.start()
    allowed, results = queue.get(timeout=60)
    daemon.join(timeout=60)
    assert (allowed, results) == (False, [0, -1, -2, -3, -4])


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs CPU affinity (Linux)")
def test_available_cpus_follows_the_affinity_mask_not_the_machine():
    """A container or `taskset` limits the CPUs: one worker per CPU means per CPU this process may use."""
    probe = (
        "import os; from dedup_pipeline.core.parallel import available_cpus; "
        "os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}); print(available_cpus())"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=REPO, check=True)
    assert done.stdout.strip() == "1"


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _quota_of(tmp_path: Path, membership: str, files: dict[str, str]) -> float | None:
    """`cpu_quota` over a made-up /proc/self/cgroup and cgroup mount holding `files` (path under it -> content)."""
    _write(tmp_path / "self-cgroup", membership)
    for name, content in files.items():
        _write(tmp_path / "cgroup" / name, content)
    return cpu_quota(tmp_path / "cgroup", tmp_path / "self-cgroup")


def test_cpu_quota_reads_cgroup_v2_in_the_process_group_and_above(tmp_path):
    """A parent's quota holds for its children: the smallest on the way up wins; "max" is no quota."""
    own, parent, grandparent = "kubepods/pod1/ctr/cpu.max", "kubepods/pod1/cpu.max", "kubepods/cpu.max"
    membership = "0::/kubepods/pod1/ctr\n"
    unlimited = "max 100000\n"
    assert _quota_of(tmp_path, membership, {own: unlimited, parent: "200000 100000", grandparent: unlimited}) == 2.0
    assert _quota_of(tmp_path, membership, {own: "150000 100000"}) == 1.5
    assert _quota_of(tmp_path, membership, {own: unlimited, parent: unlimited, grandparent: unlimited}) is None


def test_cpu_quota_in_a_container_is_read_at_the_root_of_the_mount(tmp_path):
    """Inside a container the process's group path names the host's hierarchy; its own group is the mount's root."""
    membership = "12:pids:/docker/abc\n4:cpu,cpuacct:/docker/abc\n1:name=systemd:/docker/abc\n0::/\n"
    period = {"cpu,cpuacct/cpu.cfs_period_us": "100000\n"}
    assert _quota_of(tmp_path, membership, {**period, "cpu,cpuacct/cpu.cfs_quota_us": "50000\n"}) == 0.5
    assert _quota_of(tmp_path, membership, {**period, "cpu,cpuacct/cpu.cfs_quota_us": "-1\n"}) is None  # no quota


def test_cpu_quota_is_none_without_control_groups(tmp_path):
    assert cpu_quota(tmp_path / "cgroup", tmp_path / "no-such-file") is None
    _write(tmp_path / "self-cgroup", "0::/\n")
    assert cpu_quota(tmp_path / "cgroup", tmp_path / "self-cgroup") is None  # no cpu controller mounted


@pytest.mark.parametrize(("quota", "expected"), [(None, None), (0.3, 1), (1.0, 1), (1.5, 2), (1000.0, None)])
def test_available_cpus_is_the_affinity_bounded_by_the_quota_rounded_up(monkeypatch, quota, expected):
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    monkeypatch.setattr(parallel, "cpu_quota", lambda: quota)
    assert parallel.available_cpus() == min(affinity, expected or affinity)


@pytest.fixture
def cpu_cgroup():
    """A cgroup v1 group with the cpu controller, made for the test and removed after it (skipped where the
    process may not make one)."""
    mount = CGROUP_ROOT / "cpu"
    group = mount / f"dedup-test-{os.getpid()}"
    if not (mount / "cpu.cfs_quota_us").exists():
        pytest.skip("needs the cgroup v1 cpu controller at /sys/fs/cgroup/cpu")
    try:
        group.mkdir()
    except OSError as exc:
        pytest.skip(f"cannot make a cgroup here: {exc}")
    try:
        yield group
    finally:
        deadline = time.monotonic() + 10
        while True:
            try:
                group.rmdir()
                break
            except OSError:  # its last process is still exiting
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)


def test_a_process_in_a_group_limited_to_one_cpu_uses_one(cpu_cgroup):
    """For real: a process that joins a group with a quota of one CPU counts one, whatever its affinity allows."""
    (cpu_cgroup / "cpu.cfs_period_us").write_text("100000")
    (cpu_cgroup / "cpu.cfs_quota_us").write_text("100000")
    probe = (
        "import os, sys; from pathlib import Path; "
        "Path(sys.argv[1], 'cgroup.procs').write_text(str(os.getpid())); "
        "from dedup_pipeline.core.parallel import available_cpus, cpu_quota; print(cpu_quota(), available_cpus())"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe, str(cpu_cgroup)], capture_output=True, text=True, cwd=REPO, check=True
    )
    assert done.stdout.split() == ["1.0", "1"]


_PARENT = """
import multiprocessing, sys, threading, time
from dedup_pipeline.core import parallel
from dedup_pipeline.core.parallel import CGROUP_ROOT, cpu_quota, ordered_map

if __name__ == "__main__":
    def report():
        while len(multiprocessing.active_children()) < 2:
            time.sleep(0.01)
        print(" ".join(str(p.pid) for p in multiprocessing.active_children()), flush=True)

    threading.Thread(target=report, daemon=True).start()
    next(ordered_map(time.sleep, [600] * 4, workers=2, preload=sys.argv[1:]))
"""


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has ended
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="reads process states from /proc")
@pytest.mark.parametrize("preload", [[], ["json"]], ids=["spawned", "from-a-fork-server"])
def test_workers_end_when_their_parent_is_killed(tmp_path, preload):
    """A step process killed outright (SIGKILL, out of memory) leaves no worker behind, nor a fork server."""
    script = tmp_path / "parent.py"
    script.write_text(_PARENT)
    parent = subprocess.Popen([sys.executable, str(script), *preload], stdout=subprocess.PIPE, text=True, cwd=REPO)
    try:
        workers = [int(pid) for pid in parent.stdout.readline().split()]
        assert len(workers) == 2 and all(map(_running, workers))
    finally:
        parent.kill()
        parent.wait()
    deadline = time.monotonic() + 15
    while any(map(_running, workers)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(map(_running, workers)), "a worker outlived its killed parent"


_PRELOADED = """
import gc, multiprocessing, os, sys
from functools import partial
from dedup_pipeline.core.parallel import ordered_map, start_preloading

def state(name, _item):
    preloaded = "dedup_pipeline.cli.lane_preload" in sys.modules
    return preloaded, gc.get_freeze_count() > 0, os.environ.get(name), os.getcwd(), os.getpid()

if __name__ == "__main__":
    preload = tuple(sys.argv[2:])
    start_preloading(preload)
    os.environ["DEDUP_TEST_PRELOAD"] = "set after the server started"
    os.chdir(sys.argv[1])
    states = ordered_map(partial(state, "DEDUP_TEST_PRELOAD"), range(4), workers=2, preload=preload)
    for state in sorted({(*state[:4], state[4] == os.getpid()) for state in states}):  # one line whichever worker
        print(*state, sep="|", flush=True)
    print("children left:", len(multiprocessing.active_children()), flush=True)
"""


@pytest.mark.skipif("forkserver" not in multiprocessing.get_all_start_methods(), reason="needs a fork server")
@pytest.mark.parametrize("preload", [[], ["dedup_pipeline.cli.lane_preload"]], ids=["spawned", "from-a-fork-server"])
def test_preloaded_workers_start_with_the_modules_imported_in_this_processs_environment(tmp_path, preload):
    """Breaks: workers forked from a fork server that imported `preload` once; the server started before this
    process changed its environment variables and folder.

    Must hold: each worker finds the module imported without importing it itself (a spawned worker does not
    have it), and what it left alive settled out of the garbage collector's full collections (`heap.settle`),
    yet runs in the environment and folder this process has when it submits the work, as a spawned worker
    would. In a process of its own: the fork server is one per process, started by the first `preload`
    given."""
    script = tmp_path / "parent.py"
    script.write_text(_PRELOADED)
    folder = tmp_path / "elsewhere"
    folder.mkdir()
    done = subprocess.run(
        [sys.executable, str(script), str(folder), *preload], capture_output=True, text=True, cwd=REPO, check=True
    )
    assert done.stdout.splitlines() == [
        f"{bool(preload)}|{bool(preload)}|set after the server started|{folder}|False",
        "children left: 0",
    ]


_MARKER = """
import os, sys
with open(os.environ["DEDUP_TEST_MARKER_LOG"], "a") as log:
    print(os.getpid(), file=log)
"""

_MAIN_IMPORTS = """
import operator, os, sys
import marker_of_the_main_script
from dedup_pipeline.core import parallel
from dedup_pipeline.core.parallel import CGROUP_ROOT, cpu_quota, ordered_map

if __name__ == "__main__":
    for _ in range(2):
        assert list(ordered_map(operator.neg, range(6), workers=2, preload=sys.argv[1:])) == [-i for i in range(6)]
    print(os.getpid(), flush=True)
"""


@pytest.mark.skipif("forkserver" not in multiprocessing.get_all_start_methods(), reason="needs a fork server")
@pytest.mark.parametrize(("preload", "importers"), [([], 5), (["json"], 2)], ids=["spawned", "from-a-fork-server"])
def test_workers_forked_from_the_server_find_the_main_scripts_imports_done(tmp_path, preload, importers):
    """Breaks: each worker runs the main script again (multiprocessing's preparation), importing what it imports.

    Must hold: forked from a fork server, no worker imports a module the main script imports: the server did, once
    (the process and the server import it, not the four workers of two pools); spawned, each worker imports it."""
    (tmp_path / "marker_of_the_main_script.py").write_text(_MARKER)
    script = tmp_path / "parent.py"
    script.write_text(_MAIN_IMPORTS)
    log = tmp_path / "imported-by.txt"
    env = {**os.environ, "DEDUP_TEST_MARKER_LOG": str(log), "PYTHONPATH": f"{tmp_path}{os.pathsep}{REPO}"}
    done = subprocess.run(
        [sys.executable, str(script), *preload], capture_output=True, text=True, cwd=REPO, env=env, check=True
    )
    importers_seen = log.read_text().split()
    assert len(importers_seen) == len(set(importers_seen)) == importers
    assert done.stdout.split() == importers_seen[:1]  # the process itself imported it first
