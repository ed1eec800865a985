"""`dedup-pipeline run`'s progress: a live display per batch on a terminal (rich), plain lines otherwise.

The lines go to stderr, so `--json` output (and a table piped elsewhere) stays what it was. Not a terminal,
or `--json`: one line per batch as it ends, which a log file or a CI job keeps.
"""

from __future__ import annotations

import time
from typing import TextIO

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from dedup_pipeline.cli.runner import Progress as RunProgress


class PlainProgress(RunProgress):
    """`dedup-pipeline run: batch 2/5 2026-11-02-shop: ok in 3.1 s`, one line per batch as it ends."""

    def __init__(self, stream: TextIO):
        self.stream, self.total, self.done = stream, 0, 0

    def start(self, total: int) -> None:
        self.total = total

    def batch_started(self, key: str) -> None:
        pass

    def batch_done(self, key: str, status: str, seconds: float) -> None:
        self.done += 1
        took = f" in {seconds:.1f} s" if status != "held" else " (not run)"
        print(f"dedup-pipeline run: batch {self.done}/{self.total} {key}: {status}{took}", file=self.stream, flush=True)


class LiveProgress(RunProgress):
    """A rich progress bar over the batches: which one is running, how many are done, the time so far."""

    def __init__(self, stream: TextIO):
        self.console = Console(file=stream)
        self.bar = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=self.console,
            transient=True,
        )
        self.task = None
        self.started = 0.0

    def start(self, total: int) -> None:
        self.bar.start()
        self.task = self.bar.add_task("batches", total=total)
        self.started = time.monotonic()

    def batch_started(self, key: str) -> None:
        self.bar.update(self.task, description=f"running {key}")

    def batch_done(self, key: str, status: str, seconds: float) -> None:
        took = f" in {seconds:.1f} s" if status != "held" else " (not run)"
        self.console.print(f"{key}: {status}{took}", markup=False, highlight=False)
        self.bar.advance(self.task)

    def finish(self) -> None:
        self.bar.stop()


def progress_for(stream: TextIO, as_json: bool) -> RunProgress:
    """The live display on a terminal, else plain lines (`--json` always plain: a program reads it)."""
    return LiveProgress(stream) if stream.isatty() and not as_json else PlainProgress(stream)
