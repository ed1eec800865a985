"""The `dedup-pipeline` command line: `main` and its commands.

The package holds what only the command line uses: the privacy commands (`erasure`), the in-process run of
the ladder over a landing folder (`runner`), the liveness lock of its processes (`liveness`) and the demo
crawl (`demo`). `python -m dedup_pipeline.cli` runs `main` too.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sqlite3
import sys
import warnings
from importlib.metadata import version
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy.exc import DBAPIError, OperationalError

from dedup_pipeline.cli.arguments import name, seconds, unknown_batch, whole_number
from dedup_pipeline.cli.erasure import add_commands as add_privacy_commands
from dedup_pipeline.cli.lanes import DEFAULT_WORKERS
from dedup_pipeline.cli.near import add_commands as add_near_commands
from dedup_pipeline.core.errors import ConfigurationError
from dedup_pipeline.landing import DEFAULT_SETTLE_SECONDS, BatchFileError

if TYPE_CHECKING:  # the runner imports Dagster: only the commands that run the ladder pay for it
    from dedup_pipeline.cli.runner import LadderSummary

_INSUFFICIENT_PRIVILEGE = "42501"  # PostgreSQL's SQLSTATE for "permission denied"
#: What SQLite says of a file that is not one of its databases, or is a damaged one.
_NOT_SQLITE = {"file is not a database", "database disk image is malformed"}
_COLUMNS = [
    ("batch", "batch"),
    ("records_in", "in"),
    ("quarantined", "quarantined"),
    ("exact_duplicates", "exact dup"),
    ("changed", "changed"),
    ("new", "new"),
    ("stale", "stale"),
    ("change_ignored", "change ignored"),
    ("erased", "erased"),
    ("near_duplicates", "near dup"),
]
#: Decisions most runs never make (the `keep_first` policy's, an erased subject's): a column only when a batch has one.
_RARE_COLUMNS = {"change_ignored", "erased"}


def format_summary(summary: LadderSummary) -> str:
    """A plain-text table of decision counts per batch, then the warehouse row count.

    Every line of a batch is counted once: quarantined, or in one decision column (near dup counts survivors).
    """
    batches = summary.rows()
    columns = [
        (name, header)
        for name, header in _COLUMNS
        if name not in _RARE_COLUMNS or any(getattr(b, name) for _, b in batches)
    ]
    # A failed batch shows what it stored before failing, a held one zeros: the status column tells them apart.
    with_status = any(status != "ok" for status, _ in batches)
    rows = [[header for _, header in columns] + (["status"] if with_status else [])]
    rows += [
        [str(getattr(b, name)) for name, _ in columns] + ([status] if with_status else []) for status, b in batches
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    last = len(columns) if with_status else -1  # the status column reads left to right, as the batch's
    lines = [
        "  ".join(
            cell.ljust(w) if i in (0, last) else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths))
        ).rstrip()
        for row in rows
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    lines.append(f"\nwarehouse records: {summary.warehouse_records}")
    return "\n".join(lines)


def _run(landing: Path, as_json: bool, settle_seconds: float, workers: int = DEFAULT_WORKERS) -> int:
    from dedup_pipeline import heap
    from dedup_pipeline.cli.progress import progress_for
    from dedup_pipeline.cli.runner import ensure_dagster_home, one_run_per_landing_folder, run_landing_folder

    heap.settle()  # what the imports left alive lives as long as this process
    home = ensure_dagster_home()
    try:
        with one_run_per_landing_folder(home, landing):
            summary = run_landing_folder(
                landing, settle_seconds=settle_seconds, workers=workers, progress=progress_for(sys.stderr, as_json)
            )
    except KeyboardInterrupt:
        print(
            "\ndedup-pipeline run: interrupted (Ctrl-C): no batch started after it; one in flight finished or is "
            "marked failed, as its line above says; run it again to finish",
            file=sys.stderr,
        )
        return 130
    for notice in summary.notices:
        print(f"dedup-pipeline run: {notice}", file=sys.stderr)
    for batch, error in summary.failed.items():
        print(f"dedup-pipeline run: batch {batch} failed: {error} (its run is in the Dagster UI)", file=sys.stderr)
    for batch, reason in summary.held.items():
        print(f"dedup-pipeline run: batch {batch} {reason}", file=sys.stderr)
    print(json.dumps(summary.as_dict()) if as_json else format_summary(summary))
    return 1 if summary.failed else 0


def cmd_run(args: argparse.Namespace) -> int:
    from dedup_pipeline.landing import landing_dir

    landing = Path(args.landing) if args.landing else landing_dir()
    return _run(landing, args.json, args.settle_seconds, args.workers)


def cmd_demo(args: argparse.Namespace) -> int:
    from dedup_pipeline.cli.demo import write_demo_crawl
    from dedup_pipeline.landing import landing_dir

    # The landing folder the UI and the sensor read, so a demo partition can be re-materialised from the UI.
    folder = landing_dir()
    paths = write_demo_crawl(folder)
    if not args.json:
        print(f"wrote {len(paths)} demo batches to {folder}; running the ladder...\n")
    return _run(folder, args.json, settle_seconds=0)


def cmd_decisions(args: argparse.Namespace) -> int:
    from dedup_pipeline.decision_log import iter_events, runs_named
    from dedup_pipeline.store.warehouse import Warehouse

    with Warehouse.existing().engine.connect() as conn:
        if unknown_batch(conn, "decisions", args.batch):
            return 2  # a wrong argument, as argparse's own errors
        run = args.run
        if run:
            runs = runs_named(conn, run)
            if len(runs) != 1:
                why = "names several runs: give more of it" if runs else "names no run of the decision log"
                print(f"dedup-pipeline decisions: error: --run {run!r} {why}", file=sys.stderr)
                return 2
            run = runs[0]
        for event in iter_events(conn, args.batch, run):
            print(json.dumps(event, ensure_ascii=False))
    return 0


def _listen_address(value: str) -> tuple[str, int]:
    """`PORT` or `HOST:PORT` (IPv6 hosts in brackets) -> (host, port); the host defaults to every interface."""
    host, _, port = value.rpartition(":")
    if not port.isdigit() or int(port) > 65535:
        raise argparse.ArgumentTypeError(f"expected PORT or HOST:PORT, got {value!r}")
    return host.strip("[]") or "0.0.0.0", int(port)


#: `metrics --serve`: scrapes are answered from a read of the warehouse at most this many seconds old.
MAX_AGE = 30.0


def _serve_metrics(warehouse, address: tuple[str, int], max_age: float) -> int:
    import signal
    import threading

    from dedup_pipeline.metrics import serve

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    server = serve(warehouse.engine, address[1], address[0], max_age)
    host = address[0] if ":" not in address[0] else f"[{address[0]}]"
    print(
        f"serving the dedup counters on http://{host}:{server.server_port}/metrics "
        f"(read from the warehouse at most every {max_age:g} s); Ctrl-C to stop",
        flush=True,
    )
    try:
        stop.wait()
    except KeyboardInterrupt:
        pass
    server.shutdown()
    return 0


def cmd_metrics(args: argparse.Namespace) -> int:
    from dedup_pipeline.metrics import prometheus_text, write_textfile
    from dedup_pipeline.store.warehouse import Warehouse

    if args.serve:
        return _serve_metrics(Warehouse.existing(), args.serve, MAX_AGE if args.max_age is None else args.max_age)
    if args.max_age is not None:
        print("dedup-pipeline metrics: error: --max-age goes with --serve", file=sys.stderr)
        return 2
    try:
        with Warehouse.existing().engine.connect() as conn:
            if args.textfile:
                write_textfile(conn, args.textfile)
            else:
                print(prometheus_text(conn), end="")
    except (OSError, DBAPIError, ConfigurationError):
        if args.textfile:  # node_exporter would go on serving the last counts as current: say the warehouse is down
            with contextlib.suppress(OSError):
                write_textfile(None, args.textfile)
        raise
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dedup-pipeline", description="Keep a warehouse of scraped records free of duplicates."
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {version('dedup_pipeline')}")
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser(
        "run", help="register every batch in the landing folder and run the whole ladder for each"
    )
    run.add_argument(
        "--landing",
        help="landing folder (default: $DEDUP_LANDING_DIR, else $DEDUP_DATA_DIR/landing, else .dedup/landing)",
    )
    run.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    run.add_argument(
        "--settle-seconds",
        type=seconds,
        default=DEFAULT_SETTLE_SECONDS,
        metavar="S",
        help="leave alone files modified in the last S seconds, still being written "
        f"(default {DEFAULT_SETTLE_SECONDS:g})",
    )
    run.add_argument(
        "--workers",
        type=whole_number("a whole number, 0 (one per CPU) or more"),
        default=DEFAULT_WORKERS,
        metavar="N",
        help="run up to N sources' batches side by side, each source's in landing order, in worker processes "
        "(default 0: one per CPU; 1: every batch in this process; an SQLite warehouse runs one at a time)",
    )
    run.set_defaults(func=cmd_run)
    demo = commands.add_parser(
        "demo", help="write a realistic sample crawl to the landing folder (as run finds it) and run it"
    )
    demo.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    demo.set_defaults(func=cmd_demo)
    add_privacy_commands(commands)  # erase, prune-retention, grant-roles, migrate-url
    add_near_commands(commands)
    decisions = commands.add_parser("decisions", help="print the decision log as JSON Lines (dedup_decision events)")
    decisions.add_argument("--batch", type=name, help="only this batch")
    decisions.add_argument("--run", type=name, help="only this Dagster run (its id, or the first characters of it)")
    decisions.set_defaults(func=cmd_decisions)
    metrics = commands.add_parser("metrics", help="print the dedup counters in the Prometheus text format")
    output = metrics.add_mutually_exclusive_group()
    output.add_argument("--textfile", help="write them to this file (node_exporter textfile collector) instead")
    output.add_argument(
        "--serve",
        metavar="[HOST:]PORT",
        type=_listen_address,
        help="serve them over HTTP for Prometheus to scrape, until stopped (port 0: any free port)",
    )
    metrics.add_argument(
        "--max-age",
        type=seconds,
        default=None,
        metavar="SECONDS",
        help=f"with --serve: answer scrapes from a read of the warehouse at most this old (default {MAX_AGE:g})",
    )
    metrics.set_defaults(func=cmd_metrics)
    return parser


def main(argv: list[str] | None = None) -> int:
    # Dagster flags preview/beta APIs it uses itself (partitioned asset checks); the UI shows them, the CLI need not.
    warnings.filterwarnings("ignore", message=r".*currently in (preview|beta).*")
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except BrokenPipeError:
        # The reader went away (`dedup-pipeline decisions | head`): stop without a traceback, as other Unix
        # tools do, and with a failure status (the output was cut short). stdout goes to /dev/null so that the
        # interpreter's own final flush does not fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except (OSError, DBAPIError, BatchFileError, ConfigurationError) as exc:
        if isinstance(exc, DBAPIError) and not _environmental(exc):
            raise  # a fault of the code, whose traceback is what a bug report needs
        # The environment, not the code: a path, a port, a setting, the warehouse or the login's rights.
        reason = exc.orig if isinstance(exc, DBAPIError) else exc
        if _not_sqlite(reason):
            from dedup_pipeline.store.warehouse import default_database_url

            reason = f"the warehouse {default_database_url()}: {reason}"
        print(f"dedup-pipeline {args.command}: error: {' '.join(str(reason).split())}", file=sys.stderr)
        return 1


def _environmental(exc: DBAPIError) -> bool:
    """A database error the operator fixes: the server unreachable, the login lacking a privilege, or a warehouse
    URL naming a file that is no SQLite database."""
    return (
        isinstance(exc, OperationalError)
        or getattr(exc.orig, "sqlstate", None) == _INSUFFICIENT_PRIVILEGE
        or _not_sqlite(exc.orig)
    )


def _not_sqlite(error: BaseException) -> bool:
    """Whether SQLite refused the warehouse file itself: not one of its databases, or a damaged one."""
    return isinstance(error, sqlite3.DatabaseError) and str(error) in _NOT_SQLITE
