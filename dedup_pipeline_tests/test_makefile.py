"""What `make dev` and `make check` print: no warning that is not true."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _recipe(target: str, needle: str) -> str:
    """The line of `target`'s recipe that runs `needle`, as make would run it (`make -n`)."""
    shown = subprocess.run(
        ["make", "-n", "-s", "--no-print-directory", target], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout
    return next(line for line in shown.splitlines() if needle in line)


def test_dg_is_told_it_runs_the_project_venv_so_it_does_not_warn_it_does_not(tmp_path):
    """Breaks: `make dev` printed "The active virtual environment does not match …" twice, though dg ran the
    project's .venv: none was activated. `make check`'s `dg check defs` prints the same warning the same way."""
    check = _recipe("check", "dg check defs")
    dev = _recipe("dev", "dg dev")
    assert dev.split(" dev ")[0] == check.split(" check ")[0]  # one way of running dg
    env = {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"}
    env["DAGSTER_HOME"] = str(tmp_path)
    (tmp_path / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    ran = subprocess.run(check, shell=True, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert ran.returncode == 0, ran.stderr
    assert "does not match the virtual environment" not in ran.stdout + ran.stderr
