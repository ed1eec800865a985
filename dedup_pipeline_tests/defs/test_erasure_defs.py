"""The erasure and retention jobs in the code location, the schedule, and the command line."""

from __future__ import annotations

import io
import json
import os
import secrets
from datetime import timedelta
from pathlib import Path

import dagster as dg
import pytest
from sqlalchemy import create_engine, func, select, text

from dedup_pipeline.cli import main
from dedup_pipeline.core.erasure import key_id
from dedup_pipeline.core.keys import MAKE_A_KEY
from dedup_pipeline.definitions import defs
from dedup_pipeline.defs.erasure import ERASE_JOB, delete_old_erasure_runs, erase_subject_job, prune_retention_daily
from dedup_pipeline.defs.resources import default_resources
from dedup_pipeline.defs.sensors import automation_status
from dedup_pipeline.environment import TOMBSTONE_KEY_ENV
from dedup_pipeline.store.schema import erasure_requests, erasure_tombstones
from dedup_pipeline.store.tombstones import key_file_path
from dedup_pipeline.store.warehouse import Warehouse, utcnow

SECRET = "QQV-secret-seller"


@pytest.fixture
def sqlite_env(tmp_path, monkeypatch):
    return instance_env(tmp_path, monkeypatch, f"sqlite:///{tmp_path / 'w.sqlite'}")


def instance_env(tmp_path, monkeypatch, url: str) -> str:
    """The command line's environment: warehouse `url`, a tombstone key, a Dagster instance in tmp_path/dagster_home."""
    monkeypatch.setenv("DEDUP_DATABASE_URL", url)
    monkeypatch.setenv("DEDUP_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv(TOMBSTONE_KEY_ENV, secrets.token_hex(32))
    monkeypatch.delenv("DEDUP_REDIS_URL", raising=False)
    (tmp_path / "dagster_home").mkdir()
    (tmp_path / "dagster_home" / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster_home"))
    return url


def erase_config(**config):
    return {"ops": {"erase_data_subject": {"config": config}}}


def files_holding(folder: Path, value: str) -> list[str]:
    return sorted(str(path) for path in folder.rglob("*") if path.is_file() and value.encode() in path.read_bytes())


def erase_in_process(instance: dg.DagsterInstance, **config) -> dg.ExecuteInProcessResult:
    """An erasure run of a code location loaded now, as `dg dev` loads it: its resources as the environment is."""
    job = dg.Definitions(jobs=[erase_subject_job], resources=default_resources()).resolve_job_def(ERASE_JOB)
    return job.execute_in_process(instance=instance, raise_on_error=False, run_config=erase_config(**config))


def tombstone_key_ids(url: str) -> set[str]:
    with Warehouse(url).engine.connect() as conn:
        return set(conn.execute(select(erasure_tombstones.c.key_id)).scalars())


def test_jobs_and_schedule_are_in_the_code_location():
    assert defs.resolve_job_def(ERASE_JOB) is not None and defs.resolve_job_def("prune_retention") is not None
    schedule = defs.resolve_schedule_def("prune_retention_daily")
    assert schedule.cron_schedule == "41 3 * * *" and schedule.job_name == "prune_retention"
    # Off unless DEDUP_AUTOMATION=on, like the landing sensor.
    assert prune_retention_daily.default_status.value == automation_status().value


def test_erasure_job_reports_counts_and_refuses_a_bad_subject_without_echoing_it(sqlite_env):
    instance = dg.DagsterInstance.ephemeral()
    job = defs.resolve_job_def(ERASE_JOB)
    ok = job.execute_in_process(
        instance=instance,
        run_config=erase_config(kind="canonical_url", value="https://x.example/p?utm_source=1", request_id="R-1"),
    )
    [materialization] = [e for e in ok.all_events if e.event_type_value == "STEP_OUTPUT"]
    meta = {k: v.value for k, v in materialization.step_output_data.metadata.items()}
    assert meta["request_id"] == "R-1" and meta["tombstones_added"] == 8 and meta["records_removed"] == 0
    bad = job.execute_in_process(
        instance=instance,
        raise_on_error=False,
        run_config=erase_config(kind="canonical_url", value="mailto:jane.secret@example.org"),
    )
    assert not bad.success
    [failure] = [e for e in bad.all_events if e.is_step_failure]
    assert "not a usable http" in failure.step_failure_data.user_failure_data.description  # a Failure: no traceback
    assert "jane.secret" not in dg.serialize_value(failure)
    no_field = job.execute_in_process(
        instance=instance, raise_on_error=False, run_config=erase_config(kind="field", value="seller-3")
    )
    assert "needs a field path" in no_field.failure_data_for_node("erase_data_subject").user_failure_data.description
    with Warehouse(sqlite_env).engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(erasure_requests)).scalar_one() == 1


@pytest.mark.parametrize("warehouse_url", ["sqlite", "postgresql"], indirect=True)
def test_an_erasure_run_keys_its_tombstones_with_the_resources_env_var(warehouse_url, tmp_path, monkeypatch):
    """Breaks: the store read $DEDUP_TOMBSTONE_KEY itself, so the resources never carried the key.

    Must hold: the `warehouse` resource takes it as `dg.EnvVar`, the run resolves it and gives it to the store
    (which is not asked to read the variable here), and the secret is in no run config, event or instance file.
    """
    instance_env(tmp_path, monkeypatch, warehouse_url)
    key = os.environ[TOMBSTONE_KEY_ENV]
    monkeypatch.setattr("dedup_pipeline.environment.tombstone_key", lambda: None)  # only Dagster's EnvVar reads it
    with dg.DagsterInstance.get() as instance:
        run = erase_in_process(instance, kind="natural_key", value="sku-1", request_id="R-3")
        stored = dg.serialize_value([instance.get_run_by_id(run.run_id), list(instance.all_logs(run.run_id))])
    assert run.success
    assert tombstone_key_ids(warehouse_url) == {key_id(key.encode())}
    assert key not in stored and files_holding(tmp_path / "dagster_home", key) == []


@pytest.mark.parametrize("warehouse_url", ["sqlite", "postgresql"], indirect=True)
def test_without_the_variable_sqlite_keeps_a_key_file_and_postgresql_refuses_saying_how_to_make_one(
    warehouse_url, tmp_path, monkeypatch
):
    """Unset, the resource's field stays empty: the embedded SQLite warehouse keys its tombstones with the file
    beside it; an erasure run on PostgreSQL fails naming the variable and how to make a key, erasing nothing."""
    instance_env(tmp_path, monkeypatch, warehouse_url)
    monkeypatch.delenv(TOMBSTONE_KEY_ENV)
    with dg.DagsterInstance.get() as instance:
        run = erase_in_process(instance, kind="natural_key", value="sku-1")
    if warehouse_url.startswith("sqlite"):
        assert run.success
        assert tombstone_key_ids(warehouse_url) == {key_id(key_file_path(warehouse_url).read_bytes().strip())}
        return
    assert not run.success
    message = run.failure_data_for_node("erase_data_subject").user_failure_data.description  # a Failure: no traceback
    assert message.startswith(f"TombstoneKeyError: {TOMBSTONE_KEY_ENV} is not set") and MAKE_A_KEY in message
    assert tombstone_key_ids(warehouse_url) == set()


def test_retention_deletes_finished_erasure_runs_only(sqlite_env):
    instance = dg.DagsterInstance.ephemeral()
    erased = defs.resolve_job_def(ERASE_JOB).execute_in_process(
        instance=instance, run_config=erase_config(kind="natural_key", value="sku-1")
    )
    pruned = defs.resolve_job_def("prune_retention").execute_in_process(instance=instance)
    assert pruned.success and instance.get_run_by_id(erased.run_id) is not None  # younger than 24 h
    assert delete_old_erasure_runs(instance, 24, now=utcnow() + timedelta(hours=25)) == 1
    assert instance.get_run_by_id(erased.run_id) is None
    assert instance.get_run_by_id(pruned.run_id) is not None  # other jobs' runs are not touched


def test_an_erasure_run_is_kept_for_the_hours_after_it_finished_not_after_it_was_created(sqlite_env):
    """Breaks: the age was counted from the run's creation, so a run that waited long in the queue (or ran
    long) was deleted as soon as it finished, whatever the retention said."""
    from dagster._core.storage.runs.schema import RunsTable

    instance = dg.DagsterInstance.ephemeral()
    erased = defs.resolve_job_def(ERASE_JOB).execute_in_process(
        instance=instance, run_config=erase_config(kind="natural_key", value="sku-1")
    )
    with instance.run_storage.connect() as conn:  # created 30 hours ago, finished just now
        conn.execute(
            RunsTable.update()
            .where(RunsTable.c.run_id == erased.run_id)
            .values(create_timestamp=utcnow().replace(tzinfo=None) - timedelta(hours=30))
        )
    assert delete_old_erasure_runs(instance, 24) == 0 and instance.get_run_by_id(erased.run_id) is not None
    assert delete_old_erasure_runs(instance, 24, now=utcnow() + timedelta(hours=25)) == 1


def test_the_command_line_prunes_erasure_runs_too(sqlite_env, capsys, monkeypatch):
    """`dedup-pipeline prune-retention` deletes the instance's finished erase_subject runs past their retention."""
    with dg.DagsterInstance.get() as instance:  # $DAGSTER_HOME, the instance the command line uses
        erased = defs.resolve_job_def(ERASE_JOB).execute_in_process(
            instance=instance, run_config=erase_config(kind="field", field="seller_id", value="jane@example.org")
        )
    assert main(["prune-retention", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["erasure_runs_deleted"] == 0  # younger than 24 h
    monkeypatch.setattr("dedup_pipeline.defs.erasure.utcnow", lambda: utcnow() + timedelta(hours=25))
    assert main(["prune-retention", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["erasure_runs_deleted"] == 1
    with dg.DagsterInstance.get() as instance:
        assert instance.get_run_by_id(erased.run_id) is None
    monkeypatch.setenv("DEDUP_ERASURE_RUN_RETENTION_HOURS", "a day")
    assert main(["prune-retention"]) == 1
    assert "DEDUP_ERASURE_RUN_RETENTION_HOURS must be a whole number of hours" in capsys.readouterr().err
    # A negative period is refused, not taken as "keep forever" (the runs name their subjects).
    monkeypatch.setenv("DEDUP_ERASURE_RUN_RETENTION_HOURS", "-1")
    assert main(["prune-retention"]) == 1
    assert "0 or more" in capsys.readouterr().err
    with pytest.raises(ValueError, match="erasure_run_hours must be 0"):
        with dg.DagsterInstance.get() as instance:
            delete_old_erasure_runs(instance, -5)


def test_command_line_erase_prune_and_grant(sqlite_env, capsys, monkeypatch):
    assert (
        main(["erase", "--kind", "field", "--field", "seller_id", "--value", "s-1", "--request-id", "R-2", "--json"])
        == 0
    )
    captured = capsys.readouterr()
    out = json.loads(captured.out)
    assert out["request_id"] == "R-2" and out["tombstones_added"] == 1 and out["removed"]["records"] == 0
    assert "nothing in the warehouse matched the subject" in captured.err  # not only a column of zeros
    monkeypatch.setattr("sys.stdin", io.StringIO("jane@example.org\n"))  # --value - keeps it out of shell history
    assert main(["erase", "--kind", "field", "--field", "author.email", "--value", "-"]) == 0
    assert "erasure 2: rows removed per table" in capsys.readouterr().out
    assert main(["erase", "--kind", "content_digest", "--value", "xyz"]) == 2
    assert "64 hex digits" in capsys.readouterr().err
    assert main(["erase", "--kind", "natural_key", "--field", "seller_email", "--value", "jane@example.org"]) == 2
    assert "field path goes with kind 'field'" in capsys.readouterr().err
    for option in ("--decision-days", "--erasure-run-hours"):  # exit 2, one line, as every wrong argument
        with pytest.raises(SystemExit) as stop:
            main(["prune-retention", option, "-1"])
        assert stop.value.code == 2 and "0 (keep forever) or a whole number" in capsys.readouterr().err
    assert main(["prune-retention", "--json", "--decision-days", "7"]) == 0
    assert set(json.loads(capsys.readouterr().out)["pruned"]) == {
        "dedup_decisions",
        "record_history",
        "canonical_records",
        "quarantine",
    }
    assert main(["grant-roles"]) == 2
    assert "PostgreSQL only" in capsys.readouterr().err
    with Warehouse(sqlite_env).engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(erasure_tombstones)).scalar_one() == 2


@pytest.mark.parametrize("warehouse_url", ["postgresql"], indirect=True)
def test_a_failed_erasure_run_leaves_the_subjects_value_in_no_error_event_or_log(
    warehouse_url, tmp_path, monkeypatch, capfd
):
    """Breaks: a statement of an erasure run fails (a lock timeout: another session holds `records` exclusively), and
    the database error comes with the statement's bound parameters, the subject's value among them.

    Must hold: the run fails with the database's error, and the value is in none of its events, its
    compute-log files or the console (its config, in the run storage, goes with retention).
    """
    url = f"{warehouse_url}?options=-c%20lock_timeout%3D300"
    instance_env(tmp_path, monkeypatch, url)
    Warehouse(url).create_schema().dispose()
    locker = create_engine(warehouse_url)
    with locker.connect() as conn, dg.DagsterInstance.get() as instance:
        conn.execute(text("LOCK TABLE records IN ACCESS EXCLUSIVE MODE"))
        failed = defs.resolve_job_def(ERASE_JOB).execute_in_process(
            instance=instance,
            raise_on_error=False,
            run_config=erase_config(kind="field", field="seller_id", value=SECRET),
        )
        conn.rollback()
        events = dg.serialize_value(list(instance.all_logs(failed.run_id)))
    locker.dispose()
    [failure] = [e for e in failed.all_events if e.is_step_failure]
    assert "lock timeout" in failure.step_failure_data.error.to_string()
    assert SECRET not in events
    assert files_holding(tmp_path / "dagster_home" / "storage", SECRET) == []
    assert SECRET not in "".join(capfd.readouterr())


def test_deleting_an_erasure_run_deletes_its_compute_logs(sqlite_env, tmp_path, monkeypatch):
    """Breaks: an erasure run's output names its subject (here its error does, as a driver's own message might), and
    retention deletes the run: Dagster's `delete_run` leaves the run's compute-log files.

    Must hold: afterwards no file of the instance's storage holds the value.
    """

    def failing(*args, **kwargs):
        raise RuntimeError(f"could not erase {SECRET}")

    monkeypatch.setattr("dedup_pipeline.defs.erasure.run_erasure", failing)
    storage = tmp_path / "dagster_home" / "storage"
    with dg.DagsterInstance.get() as instance:
        defs.resolve_job_def(ERASE_JOB).execute_in_process(
            instance=instance,
            raise_on_error=False,
            run_config=erase_config(kind="field", field="seller_id", value=SECRET),
        )
        assert files_holding(storage, SECRET)  # its compute logs
        assert delete_old_erasure_runs(instance, 24, now=utcnow() + timedelta(hours=25)) == 1
    assert files_holding(storage, SECRET) == []
