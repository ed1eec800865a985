"""A production-shaped deployment on this machine, for end-to-end tests.

`Deployment` boots what deploy/README.md describes, against the real services:
a Dagster instance from deploy/dagster.yaml (dagster-postgres storage in a
fresh PostgreSQL database, queued run coordinator), the code location as a gRPC
code server, the daemon, and optionally celery workers on a RabbitMQ queue of
its own. Every process runs in its own session and is killed by process group
at the end. Nothing is mocked.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import dagster as dg

from dedup_pipeline_tests.helpers import PG_ADMIN_URL, database_url, fresh_database  # noqa: F401 - re-exported to the e2e tests

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
BROKER_BASE = os.environ.get("DEDUP_TEST_BROKER_URL", "pyamqp://guest:guest@127.0.0.1:5672//")
REDIS_URL = os.environ.get("DEDUP_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")

T = TypeVar("T")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_until(condition: Callable[[], T], timeout: float, what: str, every: float = 1.0) -> T:
    """Poll `condition` until it returns something truthy; fail with `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(every)


class Deployment:
    """DAGSTER_HOME with deploy/dagster.yaml, a code server, the daemon and celery workers."""

    def __init__(self, root: Path, instance_db: str, warehouse_url: str, landing: Path):
        self.root = root
        self.home = root / "dagster_home"
        self.home.mkdir(parents=True)
        shutil.copy(REPO / "deploy" / "dagster.yaml", self.home / "dagster.yaml")
        self.port = free_port()
        self.queue = f"dedup-test-{uuid.uuid4().hex[:10]}"
        self.redis_prefix = f"dedup-test:{uuid.uuid4().hex[:10]}"
        base = {k: v for k, v in os.environ.items() if not k.startswith(("DEDUP_", "DAGSTER_"))}
        self.env = {
            **base,
            "DAGSTER_HOME": str(self.home),
            "DAGSTER_PG_HOST": "127.0.0.1",
            "DAGSTER_PG_PORT": "5432",
            "DAGSTER_PG_USER": "postgres",
            "DAGSTER_PG_PASSWORD": "unused-with-trust-auth",
            "DAGSTER_PG_DB": instance_db,
            "DEDUP_CODE_SERVER_HOST": "127.0.0.1",
            "DEDUP_CODE_SERVER_PORT": str(self.port),
            "DEDUP_DATABASE_URL": warehouse_url,
            "DEDUP_LANDING_DIR": str(landing),
            "DEDUP_DATA_DIR": str(root / "data"),
            "DEDUP_REDIS_URL": REDIS_URL,
            "DEDUP_REDIS_PREFIX": self.redis_prefix,
            "DEDUP_CELERY_BROKER_URL": BROKER_BASE,
            "DEDUP_CELERY_QUEUE": self.queue,
        }
        self.processes: dict[str, tuple[subprocess.Popen, Path]] = {}
        self.workers: list[str] = []
        self._instance: dg.DagsterInstance | None = None

    # -- processes -------------------------------------------------------------------------------

    def _start(self, name: str, args: list[str]) -> subprocess.Popen:
        log = self.root / f"{name}.log"
        process = subprocess.Popen(
            args, cwd=REPO, env=self.env, stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True
        )
        self.processes[name] = (process, log)
        return process

    def log(self, name: str) -> str:
        return self.processes[name][1].read_text(errors="replace")

    def start_code_server(self) -> None:
        self._start(
            "code_server",
            [
                str(BIN / "dagster"),
                "code-server",
                "start",
                "-h",
                "127.0.0.1",
                "-p",
                str(self.port),
                "-m",
                "dedup_pipeline.definitions",
                "--location-name",
                "dedup_pipeline",
            ],
        )

    def wait_for_code_server(self, timeout: float = 120) -> None:
        from dagster._grpc.client import DagsterGrpcClient

        client = DagsterGrpcClient(port=self.port, host="127.0.0.1")

        def answers() -> bool:
            self._check_alive("code_server")
            try:
                client.ping("ok")
                return True
            except Exception:  # noqa: BLE001 - not up yet
                return False

        wait_until(answers, timeout, "the code server", every=0.5)

    def start_daemon(self) -> None:
        self._start("daemon", [str(BIN / "dagster-daemon"), "run", "-w", str(REPO / "deploy" / "workspace.yaml")])

    def start_celery_worker(self, name: str) -> None:
        self.workers.append(name)
        self._start(
            name,
            [
                str(BIN / "celery"),
                "-A",
                "dedup_pipeline.defs.celery_worker",
                "worker",
                "-Q",
                self.queue,
                "-c",
                "1",
                "--prefetch-multiplier=1",
                "-n",
                f"{name}@%h",
                "-l",
                "INFO",
                "--without-mingle",
                "--without-gossip",
            ],
        )

    def wait_for_workers(self, names: list[str], timeout: float = 120) -> None:
        for name in names:
            wait_until(
                lambda name=name: self._check_alive(name) or " ready." in self.log(name),
                timeout,
                f"celery worker {name}",
                0.5,
            )

    def _check_alive(self, name: str) -> bool:
        process, _ = self.processes[name]
        if process.poll() is not None:
            raise RuntimeError(f"{name} exited with {process.returncode}:\n{self.log(name)[-4000:]}")
        return False

    def stop(self) -> None:
        for process, _ in self.processes.values():
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        deadline = time.monotonic() + 20
        for process, _ in self.processes.values():
            try:
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            try:  # the group may hold children (run workers, the code server's gRPC process)
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            process.wait()
        if self._instance is not None:
            self._instance.dispose()
        self._cleanup_redis()
        if self.workers:
            self._delete_queue()

    def _delete_queue(self) -> None:
        """The test's own RabbitMQ queue is durable: delete it so test runs leave nothing behind."""
        from kombu import Connection

        try:
            with Connection(BROKER_BASE, connect_timeout=5) as connection:
                connection.default_channel.queue_delete(self.queue)
        except Exception:  # noqa: BLE001 - best effort cleanup
            pass

    def _cleanup_redis(self) -> None:
        import redis

        try:
            client = redis.Redis.from_url(REDIS_URL)
            keys = list(client.scan_iter(match=f"{self.redis_prefix}*", count=1000))
            for start in range(0, len(keys), 1000):
                client.delete(*keys[start : start + 1000])
        except redis.RedisError:
            pass

    # -- the instance and runs -------------------------------------------------------------------

    def instance(self) -> dg.DagsterInstance:
        """The production instance, as loaded from deploy/dagster.yaml with this deployment's environment."""
        if self._instance is None:
            saved = {k: os.environ.get(k) for k in self.env if k.startswith("DAGSTER_")}
            os.environ.update({k: v for k, v in self.env.items() if k.startswith("DAGSTER_")})
            try:
                self._instance = dg.DagsterInstance.from_config(str(self.home))
            finally:
                for key, value in saved.items():
                    if value is None:
                        os.environ.pop(key, None)
                    else:
                        os.environ[key] = value
        return self._instance

    def launch_all(self, job: str, runs: dict[str, dict], run_config: dict | None = None) -> None:
        """`dagster job launch` against deploy/workspace.yaml for each partition -> tags, side by side.

        The runs go to the queue; the daemon starts them within the instance's limits.
        """
        commands = []
        for partition, tags in runs.items():
            args = [
                str(BIN / "dagster"),
                "job",
                "launch",
                "-w",
                str(REPO / "deploy" / "workspace.yaml"),
                "-j",
                job,
                "--tags",
                json.dumps({"dagster/partition": partition, **tags}),
            ]
            if run_config:
                args += ["--config-json", json.dumps(run_config)]
            commands.append(
                subprocess.Popen(args, cwd=REPO, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            )
        for command in commands:
            output, _ = command.communicate(timeout=240)
            assert command.returncode == 0, output.decode(errors="replace")

    def runs_done(self, count: int) -> list[dg.RunRecord] | None:
        """The run records once `count` runs have finished (raises if one failed), else None."""
        records = self.instance().get_run_records()
        finished = [r for r in records if r.dagster_run.is_finished]
        failed = [r for r in finished if r.dagster_run.status != dg.DagsterRunStatus.SUCCESS]
        if failed:
            raise AssertionError(
                f"run(s) did not succeed: {[(r.dagster_run.run_id, r.dagster_run.status) for r in failed]}\n"
                + self._tails()
            )
        return finished if len(finished) >= count else None

    def _tails(self) -> str:
        return "\n".join(f"--- {name} ---\n{self.log(name)[-3000:]}" for name in self.processes)

    def event_types(self, run_id: str) -> list[str]:
        return [e.dagster_event.event_type_value for e in self.instance().all_logs(run_id) if e.dagster_event]


def assert_no_overlap(records: list[dg.RunRecord]) -> None:
    """Runs that never ran at the same time (start/end from the run storage)."""
    spans = sorted((r.start_time, r.end_time) for r in records)
    assert all(s is not None and e is not None for s, e in spans), spans
    for (_, end), (start, _) in zip(spans, spans[1:]):
        assert start >= end, f"runs overlapped: {spans}"
