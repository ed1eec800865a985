"""The runs `dedup-pipeline run` executes in process, as the Dagster UI sees them afterwards."""

from __future__ import annotations

import gzip
import json
import time
from pathlib import Path

import dagster as dg
import pytest
from dagster._core.instance.ref import InstanceRef
from sqlalchemy import func, select

from dedup_pipeline.cli.runner import run_landing_folder
from dedup_pipeline.environment import LANDING_DIR_ENV
from dedup_pipeline.store.schema import records
from dedup_pipeline.store.warehouse import Warehouse
from dedup_pipeline_tests.helpers import listing, write_batch

REPO = Path(__file__).resolve().parents[2]
# The mutation the UI's "Re-execute from failure" sends (the parent run's tags are kept, as the UI leaves them).
REEXECUTE = """
mutation ($params: ReexecutionParams) {
  launchPipelineReexecution(reexecutionParams: $params) {
    __typename
    ... on LaunchRunSuccess { run { runId } }
    ... on PythonError { message stack }
    ... on InvalidSubsetError { message }
  }
}
"""


def _wait_finished(instance: dg.DagsterInstance, run_id: str, timeout: float = 240) -> dg.DagsterRun:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        run = instance.get_run_by_id(run_id)
        if run is not None and run.is_finished:
            return run
        time.sleep(0.5)
    raise AssertionError(f"run {run_id} did not finish within {timeout:.0f} s")


def _corrupt_gzip(path: Path, lines: list) -> None:
    data = bytearray(gzip.compress(b"".join(json.dumps(line).encode() + b"\n" for line in lines)))
    data[len(data) // 2] ^= 0x10
    path.write_bytes(bytes(data))


@pytest.mark.slow  # loads the workspace (a code server process) and launches the re-execution in a run worker
def test_a_run_the_command_line_failed_is_re_executed_from_failure_in_the_workspace(tmp_path, monkeypatch):
    """Breaks: a batch whose run `run_landing_folder` (what `dedup-pipeline run` calls) failed on a corrupt file.

    Must hold: the failed run names the code location of workspace.yaml (`dedup_pipeline`, its one repository)
    as its origin, so that once the file is fixed the UI's "Re-execute from failure" (the same GraphQL mutation,
    through the workspace the webserver loads) re-runs the failed steps, and they succeed (once, a run of the
    command line had no origin and could not be re-executed at all).
    """
    from dagster._core.workspace.context import WorkspaceProcessContext
    from dagster._core.workspace.load import location_origins_from_yaml_paths
    from dagster._core.workspace.load_target import WorkspaceFileTarget
    from dagster_graphql.test.utils import execute_dagster_graphql

    home = tmp_path / "dagster_home"
    home.mkdir()
    # Submitted runs launch at once (no daemon to dequeue them), each in a run worker of the code location.
    (home / "dagster.yaml").write_text(
        "telemetry:\n  enabled: false\n"
        "run_coordinator:\n  module: dagster._core.run_coordinator\n  class: DefaultRunCoordinator\n"
    )
    landing = tmp_path / "landing"
    url = f"sqlite:///{tmp_path / 'warehouse.sqlite'}"
    monkeypatch.delenv(LANDING_DIR_ENV, raising=False)  # the folder reaches the runs through their run config alone
    for name, value in (("DAGSTER_HOME", home), ("DEDUP_DATABASE_URL", url)):
        monkeypatch.setenv(name, str(value))  # the run worker of the re-execution inherits them
    write_batch(landing, "2026-11-01-a", [listing(n) for n in range(3)], landed=1e9)
    good = [listing(n) for n in range(10, 40)]
    _corrupt_gzip(landing / "2026-11-02-b.jsonl.gz", good)

    with dg.DagsterInstance.from_ref(InstanceRef.from_dir(str(home))) as instance:
        summary = run_landing_folder(landing, instance=instance)
        assert list(summary.failed) == ["2026-11-02-b"] and [b.batch for b in summary.batches] == ["2026-11-01-a"]
        (failed,) = instance.get_runs(dg.RunsFilter(statuses=[dg.DagsterRunStatus.FAILURE]))
        origin = failed.remote_job_origin
        assert origin is not None and origin.job_name == "dedup_ladder"
        (workspace_location,) = location_origins_from_yaml_paths([str(REPO / "workspace.yaml")])
        assert origin.repository_origin.code_location_origin == workspace_location
        assert origin.location_name == "dedup_pipeline" and origin.repository_origin.repository_name == "__repository__"

        write_batch(
            landing, "2026-11-02-b", good, landed=1e9 + 60, gz=True
        )  # the cause fixed: the file delivered again
        # The UI's webserver knows no landing folder of its own (the default, where this batch is not): the
        # re-execution must read the folder the command line was given, from its parent's run config.
        monkeypatch.chdir(tmp_path)
        with WorkspaceProcessContext(instance, WorkspaceFileTarget([str(REPO / "workspace.yaml")])) as workspace:
            answer = execute_dagster_graphql(
                workspace.create_request_context(),
                REEXECUTE,
                {"params": {"parentRunId": failed.run_id, "strategy": "FROM_FAILURE"}},
            )
            launched = answer.data["launchPipelineReexecution"]
            assert launched["__typename"] == "LaunchRunSuccess", launched
            child = _wait_finished(instance, launched["run"]["runId"])
        assert child.status == dg.DagsterRunStatus.SUCCESS
        assert child.parent_run_id == failed.run_id and child.tags["dagster/partition"] == "2026-11-02-b"
        assert child.step_keys_to_execute  # from failure: the failed step and those after it
    warehouse = Warehouse(url)
    with warehouse.engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(records)).scalar_one() == 33
    warehouse.dispose()


def test_a_run_on_sqlite_is_refused_while_another_run_writes_the_warehouse(tmp_path, monkeypatch):
    """Breaks: `dedup-pipeline run` while a UI run was writing the SQLite warehouse waited on its lock for
    minutes, each step retried after a `database is locked` timeout, and said nothing of why.

    Must hold: it is refused at once, naming the run and what to do; once that run ends, it runs.
    """
    import uuid

    from dedup_pipeline.core.errors import ConfigurationError

    monkeypatch.setenv("DEDUP_DATABASE_URL", f"sqlite:///{tmp_path / 'w.sqlite'}")
    landing = tmp_path / "landing"
    write_batch(landing, "2026-11-01-a", [listing(n) for n in range(3)], landed=1e9)
    (tmp_path / "home").mkdir()
    with dg.instance_for_test(temp_dir=str(tmp_path / "home")) as instance:
        other = instance.add_run(
            dg.DagsterRun(job_name="dedup_ladder", run_id=str(uuid.uuid4()), status=dg.DagsterRunStatus.STARTED)
        )
        with pytest.raises(
            ConfigurationError, match=rf"run {other.run_id[:8]} of dedup_ladder \(started, from the UI"
        ) as refused:
            run_landing_folder(landing, instance=instance)
        assert "put the warehouse on PostgreSQL" in str(refused.value)
        instance.report_run_failed(other)
        assert [b.batch for b in run_landing_folder(landing, instance=instance).batches] == ["2026-11-01-a"]


def test_a_step_tried_again_after_a_transient_error_is_named_in_the_notices(tmp_path, monkeypatch):
    """Breaks: a step that met a transient error (a lock timeout, a dropped connection) and was tried again left no
    trace in the command's output: only the minutes it took, and a DEBUG event in the run.

    Must hold: the batch succeeds, and a notice names the batch, the step and the error.
    """
    import sqlite3

    from sqlalchemy.exc import OperationalError

    from dedup_pipeline.defs import assets

    real, calls = assets.ingest_raw_batch, []

    def locked_once(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise OperationalError("DELETE FROM quarantine", {}, sqlite3.OperationalError("database is locked"))
        return real(*args, **kwargs)

    monkeypatch.setattr(assets, "ingest_raw_batch", locked_once)
    monkeypatch.setenv("DEDUP_DATABASE_URL", f"sqlite:///{tmp_path / 'w.sqlite'}")
    landing = tmp_path / "landing"
    write_batch(landing, "2026-11-01-a", [listing(n) for n in range(3)], landed=1e9)
    (tmp_path / "home").mkdir()
    with dg.instance_for_test(temp_dir=str(tmp_path / "home")) as instance:
        summary = run_landing_folder(landing, instance=instance)
    assert [b.batch for b in summary.batches] == ["2026-11-01-a"] and len(calls) == 2
    (notice,) = [n for n in summary.notices if "tried again" in n]
    assert notice.startswith("batch 2026-11-01-a: raw_crawl_batches was tried again after: ")
    assert "database is locked" in notice
