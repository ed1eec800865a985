"""`dedup-pipeline run`'s progress display: live on a terminal, plain lines otherwise."""

from __future__ import annotations

import io

from dedup_pipeline.cli.progress import LiveProgress, PlainProgress, progress_for


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _drive(progress) -> None:
    progress.start(2)
    progress.batch_started("2026-11-01-shop")
    progress.batch_done("2026-11-01-shop", "ok", 1.25)
    progress.batch_done("2026-11-02-shop", "held", 0.0)
    progress.finish()


def test_a_terminal_gets_the_live_display_and_json_or_a_pipe_plain_lines():
    terminal = Terminal()
    assert isinstance(progress_for(terminal, as_json=False), LiveProgress)
    assert isinstance(progress_for(terminal, as_json=True), PlainProgress)
    assert isinstance(progress_for(io.StringIO(), as_json=False), PlainProgress)
    live = progress_for(terminal, as_json=False)
    _drive(live)
    assert "2026-11-01-shop: ok in 1.2 s" in terminal.getvalue() and "2026-11-02-shop: held" in terminal.getvalue()
    pipe = io.StringIO()
    _drive(progress_for(pipe, as_json=False))
    assert pipe.getvalue().splitlines() == [
        "dedup-pipeline run: batch 1/2 2026-11-01-shop: ok in 1.2 s",
        "dedup-pipeline run: batch 2/2 2026-11-02-shop: held (not run)",
    ]
