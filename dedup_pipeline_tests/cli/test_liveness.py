"""Liveness of `dedup-pipeline` processes (dedup_pipeline.cli.liveness): marks, and the release of dead runs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import dagster as dg

REPO = Path(__file__).resolve().parents[2]


def test_a_process_mark_tells_a_live_process_from_a_killed_one(tmp_path):
    """The mark behind the release of dead runs: a file locked by its process, whatever its PID (a container's
    PID 1, a PID reused or in another namespace), so a live run is never released and a dead one always is."""
    from dedup_pipeline.cli.liveness import process_alive

    code = (
        "import sys, time; from pathlib import Path; from dedup_pipeline.cli.liveness import ProcessMark; "
        "mark = ProcessMark(Path(sys.argv[1])); print(mark.token, flush=True); time.sleep(120)"
    )
    process = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        token = process.stdout.readline().strip()
        assert process_alive(tmp_path, token) is True
        assert process_alive(tmp_path, token) is True  # asking does not take the mark away
    finally:
        process.kill()
        process.wait()
    assert process_alive(tmp_path, token) is False
    assert not (tmp_path / f"{token}.lock").exists()  # a dead process's mark is removed once seen
    assert process_alive(tmp_path, "not-a-process-of-this-instance") is None


def test_a_re_execution_inherits_the_process_mark_but_is_never_released_as_a_dead_run(tmp_path):
    """Breaks: the UI's re-execution (and the daemon's retry) of a command-line run copies the parent's tags,
    its process mark among them, while that process lies dead (killed; its mark not yet seen by a later run).

    Must hold: the next `dedup-pipeline run` releases the dead process's own run and leaves the re-execution,
    which a run worker of its own executes, running.
    """
    from dagster._core.storage.dagster_run import DagsterRun
    from dagster._core.storage.tags import PARENT_RUN_ID_TAG, ROOT_RUN_ID_TAG

    from dedup_pipeline.cli.liveness import PROCESS_MARKS, PROCESS_TAG, release_runs_of_dead_processes

    with dg.instance_for_test(temp_dir=str(tmp_path)) as instance:
        (tmp_path / PROCESS_MARKS).mkdir()
        (tmp_path / PROCESS_MARKS / "dead.lock").touch()  # a mark nobody holds locked: its process is gone
        own = DagsterRun(job_name="dedup_ladder", status=dg.DagsterRunStatus.STARTED, tags={PROCESS_TAG: "dead"})
        child = DagsterRun(
            job_name="dedup_ladder",
            status=dg.DagsterRunStatus.STARTED,
            parent_run_id=own.run_id,
            root_run_id=own.run_id,
            tags={PROCESS_TAG: "dead", PARENT_RUN_ID_TAG: own.run_id, ROOT_RUN_ID_TAG: own.run_id},
        )
        for run in (own, child):
            instance.add_run(run)
        assert release_runs_of_dead_processes(instance) == [own.run_id]
        assert instance.get_run_by_id(own.run_id).status == dg.DagsterRunStatus.FAILURE
        assert instance.get_run_by_id(child.run_id).status == dg.DagsterRunStatus.STARTED
