"""`make dev` as a user runs it: one Ctrl-C stops it, with a browser's connection open."""

from __future__ import annotations

import base64
import os
import signal
import socket
import subprocess
import time

import pytest

from dedup_pipeline_tests.e2e.dagster_dev import REPO, free_port, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def _up(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2):
            return True
    except OSError:
        return False


def _running(group: int) -> list[str]:
    """The processes of `group` still running (a zombie waiting to be reaped has stopped already)."""
    shown = subprocess.run(["ps", "-eo", "pgid=,stat=,args="], capture_output=True, text=True).stdout
    return [
        line for line in shown.splitlines() if line.split()[0] == str(group) and not line.split()[1].startswith("Z")
    ]


def test_one_ctrl_c_stops_make_dev_and_everything_it_started(tmp_path):
    """Ctrl-C sends SIGINT to the terminal's foreground process group: make, dg, the webserver, the daemon and
    the code server. Once is enough: everything exits, well within the 60 s Dagster gives a process that does
    not stop before it kills it, even with a browser's websocket open."""
    port = free_port()
    home = tmp_path / "home"
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "DEDUP_AUTOMATION")}
    env.update(DAGSTER_HOME=str(home), DEDUP_DATA_DIR=str(tmp_path / "data"), PYTHONWARNINGS="ignore")
    log = open(tmp_path / "make-dev.log", "w")
    make = subprocess.Popen(
        ["make", "-s", "dev", f"DEV_PORT={port}"],
        cwd=REPO,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its own group, as a terminal's foreground job is
    )
    try:
        wait_until("the UI", lambda: _up(port), timeout=300, every=1)
        browser = socket.create_connection(("127.0.0.1", port))  # the UI's GraphQL websocket, left open
        key = base64.b64encode(os.urandom(16)).decode()
        browser.sendall(
            f"GET /graphql HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
            "Sec-WebSocket-Protocol: graphql-ws\r\n\r\n".encode()
        )
        assert browser.recv(4096).startswith(b"HTTP/1.1 101")
        started = time.monotonic()
        os.killpg(make.pid, signal.SIGINT)  # Ctrl-C, once
        make.wait(timeout=45)
        # The code server may still be closing its socket as make returns: everything ends within the 45 s,
        # with no second signal.
        wait_until("every process of make dev to end", lambda: not _running(make.pid), timeout=45, every=0.5)
        assert time.monotonic() - started < 45, _running(make.pid)
        assert "Dagster services shut down." in (tmp_path / "make-dev.log").read_text()
    finally:
        if make.poll() is None:
            os.killpg(make.pid, signal.SIGKILL)
