"""Processes killed with SIGKILL in the middle of their work: a ladder partition, the command line, a rehash shard.

The test polls the warehouse (the decision log, the sketches, the target
digests) until some chunks have committed, kills the process group, and then
re-runs: the tables must equal one clean run.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sqlalchemy import func, select

from dedup_pipeline.ladder.rehash import backfill
from dedup_pipeline.ladder.settings import LadderSettings
from dedup_pipeline.metrics import totals
from dedup_pipeline.quality.history import first_decision_counts
from dedup_pipeline.store.schema import dedup_decisions, near_index, record_hashes, records
from dedup_pipeline.store.warehouse import Warehouse
from dedup_pipeline_tests.helpers import description, listing, snapshot, write_batch
from dedup_pipeline_tests.reliability.ladder_run import assert_one_row_per_key_and_content, clean_run, count, run_ladder

REPO = Path(__file__).resolve().parents[2]
CHUNK = 50


def crawl_lines(n: int) -> list:
    """`n` listings, near-duplicate copies of every tenth on a mirror host, a few broken lines."""
    lines: list = [listing(i) for i in range(n)]
    for i in range(0, n, 10):
        lines.append(listing(i, url=f"https://mirror.example.net/{i}", description=description(i) + " shipped today"))
    for i in range(0, len(lines), 997):
        lines.insert(i, "{broken")
    return lines


def kill_when(command: list[str], ready, env: dict | None = None, timeout: float = 240) -> float:
    """Start `command` in its own process group; SIGKILL the group as soon as `ready()` is true.

    Returns how long it ran. Fails if the process ends on its own first (it was not killed mid-work).
    """
    started = time.monotonic()
    process = subprocess.Popen(
        command,
        cwd=REPO,
        env={**os.environ, **(env or {})},
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        while time.monotonic() - started < timeout:
            if process.poll() is not None:
                pytest.fail(
                    f"the process finished before it could be killed:\n{process.stdout.read().decode()[-3000:]}"
                )
            if ready():
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=30)
                assert process.returncode == -signal.SIGKILL
                return time.monotonic() - started
            time.sleep(0.005)
        pytest.fail("the process never reached the point where it should be killed")
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def wait_for_the_killed_backends(engine, timeout: float = 30) -> None:
    """Wait until no other session of the warehouse's PostgreSQL database is working: a COMMIT the killed process
    sent just before its SIGKILL still completes on the server, a moment after the process is gone, and a count
    read before it would miss that last page."""
    from sqlalchemy import text

    query = text(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid() "
        "AND state <> 'idle'"
    )
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with engine.connect() as conn:
            if not conn.execute(query).scalar_one():
                return
        time.sleep(0.01)
    pytest.fail("a session of the killed process was still working on the server")


def worker(*args: str) -> list[str]:
    return [sys.executable, "-m", "dedup_pipeline_tests.reliability.worker", *args]


@pytest.mark.parametrize(
    "warehouse_url, during",
    [("sqlite", "exact"), ("postgresql", "exact"), ("postgresql", "near")],
    indirect=["warehouse_url"],
)
def test_a_ladder_process_killed_mid_partition(warehouse, warehouse_url, tmp_path, during):
    """Breaks: the process running a partition's ladder is SIGKILLed after some chunks of the exact rung
    (or of the near-duplicate rung) have committed.

    Must hold: only whole chunks are in the warehouse (every stored row has
    its decision); re-running the partition gives one clean run's tables, and
    the batch's first decisions and the counters equal the clean run's (once,
    the re-run counted the killed run's records again, as exact duplicates).
    """
    folder = tmp_path / "landing"
    write_batch(folder, "big", crawl_lines(1200), landed=1e9)
    engine = warehouse.engine

    if during == "exact":

        def ready():
            return count(engine, dedup_decisions) >= 2 * CHUNK
    else:

        def ready():
            return count(engine, near_index) >= 2 * CHUNK

    kill_when(worker("ladder", warehouse_url, str(folder), "big", "--chunk", str(CHUNK), "--run-id", "killed"), ready)

    logged = count(engine, dedup_decisions)
    if during == "exact":
        assert logged % CHUNK == 0 and 0 < logged < 1320  # whole chunks, not all of them
    else:
        assert logged == 1320  # the exact rung had finished
    assert count(engine, records) == count(engine, dedup_decisions, dedup_decisions.c.decision.in_(["new", "changed"]))
    if during == "near":
        assert 0 < count(engine, near_index) < count(engine, records)

    run_ladder(warehouse, folder, "big", LadderSettings(chunk_size=CHUNK), run_id="rerun")
    assert snapshot(engine) == clean_run(tmp_path, folder, ["big"], LadderSettings(chunk_size=CHUNK))
    assert_one_row_per_key_and_content(engine)
    clean = Warehouse(f"sqlite:///{tmp_path / 'clean.sqlite'}")
    with engine.connect() as conn, clean.engine.connect() as clean_conn:
        assert first_decision_counts(conn, ["big"]) == first_decision_counts(clean_conn, ["big"])
        counted, clean_counted = totals(conn), totals(clean_conn)
    clean.dispose()
    assert counted["near_duplicates_flagged"] == clean_counted["near_duplicates_flagged"]
    if during == "exact":  # else the killed run's exact rung had finished: the re-run counts the batch again
        assert (counted["decisions"], counted["quarantined"]) == (
            clean_counted["decisions"],
            clean_counted["quarantined"],
        )


@pytest.mark.slow
@pytest.mark.parametrize("warehouse_url", ["postgresql"], indirect=True)
def test_dedup_pipeline_run_killed_mid_partition(warehouse, warehouse_url, tmp_path):
    """Breaks: `dedup-pipeline run` (a Dagster run of the ladder job) is SIGKILLed once the exact rung of its
    batch has committed a chunk, twice (each killed run held a slot of the local instance's two-slot
    `warehouse` pool, which no daemon frees).

    Must hold: running the same command again succeeds (once, it waited for the dead runs' slots for ever),
    the dead runs are marked failed, and the tables, the batch's figures and the counters equal one clean run's
    (once, the killed runs' records were reported and counted again, as exact duplicates).
    """
    folder = tmp_path / "landing"
    write_batch(folder, "cli", crawl_lines(3700), landed=1e9)  # 4,075 lines: three chunks of the default 2,000
    env = {
        "DEDUP_DATABASE_URL": warehouse_url,
        "DAGSTER_HOME": str(tmp_path / "dagster_home"),
        "DEDUP_DATA_DIR": str(tmp_path / "data"),
    }
    os.makedirs(env["DAGSTER_HOME"])
    (Path(env["DAGSTER_HOME"]) / "dagster.yaml").write_text((REPO / "dagster.yaml").read_text())  # its pool limits
    command = [str(Path(sys.executable).parent / "dedup-pipeline"), "run", "--landing", str(folder), "--json"]
    kill_when(command, lambda: count(warehouse.engine, dedup_decisions) > 0, env=env)
    first = count(warehouse.engine, dedup_decisions)
    assert 0 < first < 4070
    kill_when(command, lambda: count(warehouse.engine, dedup_decisions) > first, env=env)

    done = subprocess.run(command, cwd=REPO, env={**os.environ, **env}, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout)
    assert summary["warehouse_records"] == count(warehouse.engine, records)
    # The second run released the first killed run; this one, the second.
    assert sum("died with its process" in notice for notice in summary["notices"]) == 1
    import dagster as dg
    from dagster._core.instance.ref import InstanceRef

    with dg.DagsterInstance.from_ref(InstanceRef.from_dir(env["DAGSTER_HOME"])) as instance:
        statuses = sorted(r.dagster_run.status.value for r in instance.get_run_records())
        assert not instance.event_log_storage.get_concurrency_run_ids()  # no slot held by a dead run
    assert statuses == ["FAILURE", "FAILURE", "SUCCESS"]
    assert snapshot(warehouse.engine) == clean_run(tmp_path, folder, ["cli"], LadderSettings(chunk_size=500))
    clean = Warehouse(f"sqlite:///{tmp_path / 'clean.sqlite'}")
    with warehouse.engine.connect() as conn, clean.engine.connect() as clean_conn:
        counted, clean_counted = totals(conn), totals(clean_conn)
        clean_figures = first_decision_counts(clean_conn, ["cli"])["cli"]
    clean.dispose()
    assert (counted["decisions"], counted["quarantined"]) == (clean_counted["decisions"], clean_counted["quarantined"])
    (batch,) = summary["batches"]
    assert (batch["new"], batch["exact_duplicates"]) == (clean_figures["new"], clean_figures.get("exact_duplicate", 0))


def _digests(engine, version: str) -> list[tuple]:
    with engine.connect() as conn:
        return sorted(
            conn.execute(
                select(records.c.natural_key, record_hashes.c.content_hash, record_hashes.c.error)
                .join(record_hashes, record_hashes.c.record_id == records.c.record_id)
                .where(record_hashes.c.hash_version == version)
            ).all()
        )


@pytest.mark.parametrize("warehouse_url", ["postgresql"], indirect=True)
def test_a_rehash_backfill_killed_mid_shard(warehouse, warehouse_url, tmp_path):
    """Breaks: a rehash backfill process (content/1 -> content/2) is SIGKILLed after some of its pages committed.

    Must hold: the interrupted shard holds only whole pages; running the
    backfill again completes it, writes every missing digest once, and the
    digests (and the reasons of rows `content/2` cannot hash) equal one clean backfill's.
    """
    folder = tmp_path / "landing"
    lines = [
        listing(n, price=None if n % 50 == 0 else f"{n}.99") for n in range(1500)
    ]  # some cannot be hashed by content/2
    write_batch(folder, "legacy", lines, landed=1e9)
    legacy = LadderSettings(chunk_size=500, hash_versions=("content/1",))  # a warehouse from before content/2
    run_ladder(warehouse, folder, "legacy", legacy)
    assert not _digests(warehouse.engine, "content/2")

    def target_rows():
        with warehouse.engine.connect() as conn:
            return conn.execute(
                select(func.count()).select_from(record_hashes).where(record_hashes.c.hash_version == "content/2")
            ).scalar_one()

    kill_when(worker("rehash", warehouse_url, "content/2", "all", "--chunk", "20"), lambda: target_rows() >= 40)
    wait_for_the_killed_backends(warehouse.engine)
    interrupted = target_rows()
    assert 0 < interrupted < 1500

    reports = backfill(warehouse, "content/2", chunk_size=20)
    assert sum(r.hashed + r.unhashable for r in reports) == 1500 - interrupted
    assert sum(r.already_hashed for r in reports) == 0
    assert target_rows() == 1500

    clean = Warehouse(f"sqlite:///{tmp_path / 'clean-rehash.sqlite'}").create_schema()
    run_ladder(clean, folder, "legacy", legacy)
    backfill(clean, "content/2", chunk_size=20)
    assert _digests(warehouse.engine, "content/2") == _digests(clean.engine, "content/2")
    assert _digests(warehouse.engine, "content/1") == _digests(clean.engine, "content/1")
    clean.dispose()
