"""Argument types the subcommands share: argparse's own `int` and `float` take negatives, and `float` nan and inf."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable


def whole_number(what: str) -> Callable[[str], int]:
    """An argparse type for a whole number, 0 or more; `what` says what is wanted ("a whole number, 0 (one per CPU)
    or more"), in the one-line refusal."""

    def parse(text: str) -> int:
        if not text.strip().isdecimal():
            raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}")
        return int(text)

    return parse


def seconds(text: str) -> float:
    """A time in seconds: a finite number, 0 or more."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a number of seconds, 0 or more, got {text!r}")
    return value


def name(text: str) -> str:
    """A batch key, run id or the like: any text but an empty one (an unset shell variable), which would
    otherwise filter nothing and answer for everything."""
    if not text.strip():
        raise argparse.ArgumentTypeError(f"must not be empty, got {text!r}")
    return text


def unknown_batch(conn, command: str, batch: str | None) -> bool:
    """Whether `--batch` names a batch the warehouse never registered, said on stderr as a wrong argument is (the
    caller exits 2): a typo would otherwise print nothing and exit 0, as if the batch were empty."""
    from dedup_pipeline.store.warehouse import batch_registered

    if not batch or batch_registered(conn, batch):
        return False
    print(
        f"dedup-pipeline {command}: error: no batch {batch!r} in the warehouse (a batch is known once its raw rung "
        "ran; see `dedup-pipeline run`)",
        file=sys.stderr,
    )
    return True
