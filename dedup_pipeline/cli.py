"""The `dedup-pipeline` command line."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from dedup_pipeline.runner import LadderSummary, ensure_dagster_home

_COLUMNS = [("batch", "batch"), ("records_in", "in"), ("quarantined", "quarantined"),
            ("exact_duplicates", "exact dup"), ("changed", "changed"), ("new", "new"),
            ("stale", "stale"), ("near_duplicates", "near dup")]


def format_summary(summary: LadderSummary) -> str:
    """A plain-text table of decision counts per batch, then the warehouse row count."""
    rows = [[header for _, header in _COLUMNS]]
    rows += [[str(getattr(b, name)) for name, _ in _COLUMNS] for b in summary.batches]
    widths = [max(len(row[i]) for row in rows) for i in range(len(_COLUMNS))]
    lines = ["  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths))) for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    lines.append(f"\nwarehouse records: {summary.warehouse_records}")
    return "\n".join(lines)


def _run(landing: Path, as_json: bool) -> int:
    from dedup_pipeline.runner import run_landing_folder

    ensure_dagster_home()
    summary = run_landing_folder(landing)
    print(json.dumps(summary.as_dict()) if as_json else format_summary(summary))
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    from dedup_pipeline.landing import landing_dir

    landing = Path(args.landing) if args.landing else landing_dir()
    return _run(landing, args.json)


def cmd_demo(args: argparse.Namespace) -> int:
    from dedup_pipeline.demo import write_demo_crawl

    with tempfile.TemporaryDirectory(prefix="dedup-demo-") as folder:
        paths = write_demo_crawl(Path(folder))
        if not args.json:
            print(f"wrote {len(paths)} demo batches to {folder}; running the ladder...\n")
        return _run(Path(folder), args.json)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dedup-pipeline", description="Keep a warehouse of scraped records free of duplicates.")
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="register every batch in the landing folder and run the whole ladder for each")
    run.add_argument("--landing", help="landing folder (default: $DEDUP_LANDING_DIR or .dedup/landing)")
    run.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    run.set_defaults(func=cmd_run)
    demo = commands.add_parser("demo", help="write a realistic sample crawl to a temporary folder and run it")
    demo.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    demo.set_defaults(func=cmd_demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
