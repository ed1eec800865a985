"""`dagster dev` on a temporary instance, for the end-to-end tests that talk to a real webserver and daemon."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
LOCATION = {"repositoryLocationName": "dedup_pipeline", "repositoryName": "__repository__"}
# How long one `dagster dev` may take to answer before it is replaced by a fresh one (seconds). Tens of
# seconds on an idle two-core machine; a few minutes when other tests load it.
BOOT_TIMEOUT = 300
# The server is on loopback: never go through a proxy that the environment may name (http_proxy and the like).
LOOPBACK = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_until(what: str, probe, timeout: float, every: float = 1.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def loopback_env(env: dict) -> dict:
    """`env` for a process that serves or calls loopback addresses: no proxy for them."""
    return {**env, "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost"}


class Server:
    """`dagster dev` in its own process group on a free port, over a temporary instance."""

    def __init__(self, env: dict, log: Path):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = open(log, "wb")
        self.proc = subprocess.Popen(
            [str(BIN / "dagster"), "dev", "-w", "workspace.yaml", "-h", "127.0.0.1", "-p", str(self.port)],
            cwd=REPO,
            env=loopback_env(env),
            stdout=self.log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )

    def up(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"dagster dev exited with {self.proc.returncode}:\n{self.log_tail()}")
        try:
            with LOOPBACK.open(self.url + "/server_info", timeout=5) as response:
                return response.status == 200
        except OSError:
            return False

    def log_tail(self, lines: int = 60) -> str:
        self.log.flush()
        return "\n".join(Path(self.log.name).read_text(errors="replace").splitlines()[-lines:])

    def graphql(self, query: str, variables: dict) -> dict:
        request = urllib.request.Request(
            self.url + "/graphql",
            data=json.dumps({"query": query, "variables": variables}).encode(),
            headers={"Content-Type": "application/json"},
        )
        with LOOPBACK.open(request, timeout=60) as response:
            body = json.loads(response.read())
        assert not body.get("errors"), body
        return body["data"]

    def stop(self) -> None:
        # The whole group (webserver, daemon, code servers). `dagster dev` does not always exit on SIGTERM or
        # SIGINT (it ignores SIGTERM when started in the background), so the group is killed after a grace period.
        for sig, grace in ((signal.SIGINT, 10), (signal.SIGKILL, 10)):
            try:
                os.killpg(self.proc.pid, sig)
                self.proc.wait(timeout=grace)
                break
            except ProcessLookupError:
                break
            except subprocess.TimeoutExpired:
                continue
        self.log.close()


def start_server(env: dict, log: Path, attempts: int = 2) -> Server:
    """A `dagster dev` that answers, or a failure that shows what each attempt's log ended with.

    A server that has not answered within BOOT_TIMEOUT is stopped and replaced once, with a warning that
    carries its log tail, so a slow boot on a loaded machine is told apart from a server that never comes up.
    """
    tails = []
    for attempt in range(1, attempts + 1):
        attempt_log = log if attempt == 1 else log.with_name(f"{log.stem}-{attempt}{log.suffix}")
        server = Server(env, attempt_log)
        try:
            wait_until("dagster dev to answer", server.up, timeout=BOOT_TIMEOUT, every=2)
            return server
        except AssertionError as exc:
            tails.append(f"attempt {attempt}: {exc}; its log ({attempt_log}) ends:\n{server.log_tail()}")
            server.stop()
            if attempt < attempts:
                warnings.warn(f"dagster dev did not answer; starting another. {tails[-1]}", stacklevel=2)
    raise AssertionError("\n\n".join(tails))
