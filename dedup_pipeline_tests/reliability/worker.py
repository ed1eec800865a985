"""A ladder or rehash worker in its own process, for the tests that kill it, starve it or take its rights away.

    python -m dedup_pipeline_tests.reliability.worker ladder URL LANDING KEY [--chunk N] [--run-id R] [--rungs raw,...]
    python -m dedup_pipeline_tests.reliability.worker rehash URL TARGET SHARD|all [--chunk N]

Prints one JSON object: the figures of each rung, or {"error": type, "message": ...} (exit status 2).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

RUNGS = ("raw", "canonical", "exact", "near")


def run_ladder(args: argparse.Namespace) -> dict:
    from dedup_pipeline.core.near import NearDupParams
    from dedup_pipeline.ladder.canonical import canonicalise_batch
    from dedup_pipeline.ladder.exact import deduplicate_batch
    from dedup_pipeline.ladder.near import cluster_batch
    from dedup_pipeline.ladder.raw import ingest_raw_batch
    from dedup_pipeline.ladder.settings import LadderSettings, NearSettings
    from dedup_pipeline.landing import find_batch
    from dedup_pipeline.store.warehouse import Warehouse

    warehouse = Warehouse(args.url).create_schema()
    settings = LadderSettings(chunk_size=args.chunk)
    out = {}
    for rung in args.rungs.split(","):
        if rung == "raw":
            out[rung] = ingest_raw_batch(warehouse, find_batch(Path(args.landing), args.key)).as_metadata()
        elif rung == "canonical":
            out[rung] = canonicalise_batch(warehouse, args.key, settings).as_metadata()
        elif rung == "exact":
            report = deduplicate_batch(warehouse, args.key, args.run_id, settings)
            out[rung] = {k: v for k, v in report.as_metadata().items() if isinstance(v, (int, float, str))}
        elif rung == "near":
            report = cluster_batch(
                warehouse, args.key, NearSettings(params=NearDupParams(threshold=0.5), chunk_size=args.chunk)
            )
            out[rung] = {"sketched": report.sketched, "pairs": report.pairs}
        else:
            raise ValueError(f"unknown rung {rung!r}; known: {', '.join(RUNGS)}")
    return out


def run_rehash(args: argparse.Namespace) -> dict:
    from dedup_pipeline.ladder.rehash import backfill, backfill_shard
    from dedup_pipeline.store.warehouse import Warehouse

    warehouse = Warehouse(args.url)
    if args.shard == "all":
        reports = backfill(warehouse, args.target, chunk_size=args.chunk)
    else:
        reports = [backfill_shard(warehouse, args.target, args.shard, chunk_size=args.chunk)]
    return {
        "hashed": sum(r.hashed for r in reports),
        "unhashable": sum(r.unhashable for r in reports),
        "complete": all(r.complete for r in reports),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="worker")
    commands = parser.add_subparsers(dest="command", required=True)
    ladder = commands.add_parser("ladder")
    ladder.add_argument("url")
    ladder.add_argument("landing")
    ladder.add_argument("key")
    ladder.add_argument("--chunk", type=int, default=2000)
    ladder.add_argument("--run-id", default="worker")
    ladder.add_argument("--rungs", default=",".join(RUNGS))
    ladder.set_defaults(func=run_ladder)
    rehash = commands.add_parser("rehash")
    rehash.add_argument("url")
    rehash.add_argument("target")
    rehash.add_argument("shard")
    rehash.add_argument("--chunk", type=int, default=500)
    rehash.set_defaults(func=run_rehash)
    args = parser.parse_args(argv)
    try:
        result = args.func(args)
    except Exception as exc:  # noqa: BLE001 - the test reads the error's type and message
        print(json.dumps({"error": type(exc).__name__, "message": str(exc)}))
        return 2
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
