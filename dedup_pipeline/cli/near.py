"""The near-duplicate index's subcommands of `dedup-pipeline`: rebuild it, and take its sketches out for datasketch."""

from __future__ import annotations

import argparse
import base64
import json
import sys


def _near_settings():
    from dedup_pipeline.defs.resources import NearDupResource

    return NearDupResource().settings()  # the code location's defaults


def cmd_rebuild(args: argparse.Namespace) -> int:
    from dedup_pipeline.ladder.near import rebuild_index
    from dedup_pipeline.store.warehouse import Warehouse

    warehouse = Warehouse.existing()
    try:
        reports = rebuild_index(warehouse, _near_settings())
    finally:
        warehouse.dispose()
    figures = {
        "batches": len(reports),
        "sketched": sum(r.sketched for r in reports),
        "pairs": sum(r.pairs for r in reports),
        "near_duplicates": sum(len(r.near_duplicates) for r in reports),
    }
    if args.json:
        print(json.dumps(figures))
    else:
        print(
            f"near-duplicate index rebuilt over {figures['batches']} batch(es): {figures['sketched']} records "
            f"sketched, {figures['pairs']} verified pairs, {figures['near_duplicates']} records with near duplicates"
        )
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from dedup_pipeline.ladder.near import lean_minhashes
    from dedup_pipeline.store.warehouse import Warehouse

    warehouse = Warehouse.existing()
    out = open(args.out, "w", encoding="utf-8") if args.out != "-" else sys.stdout
    count = 0
    try:
        for record_id, natural_key, sketch in lean_minhashes(warehouse, args.batch):
            data = bytearray(sketch.bytesize())
            sketch.serialize(data)
            out.write(
                json.dumps(
                    {
                        "record_id": record_id,
                        "natural_key": natural_key,
                        "lean_minhash": base64.b64encode(bytes(data)).decode("ascii"),
                    }
                )
                + "\n"
            )
            count += 1
    finally:
        warehouse.dispose()
        if out is not sys.stdout:
            out.close()
    print(f"{count} sketch(es) written", file=sys.stderr)
    return 0


def add_commands(commands) -> None:
    """Register the subcommands on the main parser's subparsers."""
    rebuild = commands.add_parser(
        "rebuild-near-index",
        help="drop the near-duplicate index, its links and clusters (an earlier layout's too) and build them again "
        "from the stored records, batch by batch in landing order, with the code location's near_dup settings",
    )
    rebuild.add_argument("--json", action="store_true", help="print one JSON object")
    rebuild.set_defaults(func=cmd_rebuild)

    export = commands.add_parser(
        "export-signatures",
        help="write each stored record's MinHash sketch as a datasketch LeanMinHash (JSON Lines: record_id, "
        "natural_key, lean_minhash = base64 of LeanMinHash.serialize), for datasketch's LSH Forest or Ensemble",
    )
    export.add_argument("--out", default="-", help="file to write ('-': standard output)")
    export.add_argument("--batch", help="only the records dated to this batch")
    export.set_defaults(func=cmd_export)
