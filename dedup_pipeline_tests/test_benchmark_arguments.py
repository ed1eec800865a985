"""The benchmarks' command lines: a count of 0 is refused up front, not a crash after minutes of setup."""

from __future__ import annotations

import argparse
import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.common import at_least_one

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


@pytest.mark.parametrize("text", ["1", "12", " 3 "])
def test_a_count_of_one_or_more_is_read(text):
    assert at_least_one(text) == int(text)


@pytest.mark.parametrize("text", ["0", "-1", "1.5", "", "x", "+2"])
def test_a_count_of_zero_or_not_a_whole_number_is_refused(text):
    with pytest.raises(argparse.ArgumentTypeError, match=re.escape(f"must be a whole number, 1 or more, got {text!r}")):
        at_least_one(text)


def test_no_benchmark_reads_a_count_as_a_bare_int():
    """Breaks: `--rounds 0` (or `--repeat 0`) was accepted and the benchmark crashed taking a median of nothing.

    Must hold: every integer option but a random seed is read by `at_least_one`.
    """
    bare = []
    for path in sorted(BENCHMARKS.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument":
                kinds = {k.arg: k.value for k in node.keywords}
                name = node.args[0].value if node.args and isinstance(node.args[0], ast.Constant) else "?"
                if isinstance(kinds.get("type"), ast.Name) and kinds["type"].id == "int" and name != "--seed":
                    bare.append(f"{path.name} {name}")
    assert not bare, bare


def test_a_benchmark_refuses_zero_rounds_before_it_starts():
    result = subprocess.run(
        [sys.executable, str(BENCHMARKS / "bench_heap.py"), "--rounds", "0"], capture_output=True, text=True
    )
    assert result.returncode == 2
    assert "argument --rounds: must be a whole number, 1 or more, got '0'" in result.stderr
