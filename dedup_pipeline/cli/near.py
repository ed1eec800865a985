"""The near-duplicate index's subcommands of `dedup-pipeline`: rebuild it, and take its sketches out for datasketch."""

from __future__ import annotations

import argparse
import base64
import json
import sys

from dedup_pipeline.cli.arguments import name, unknown_batch

#: What `--config` of `rebuild-near-index` takes, for its error messages.
CONFIG_EXAMPLE = '{"bands": 20, "rows": 5}'


def near_settings(config: str | None = None):
    """The near rung's settings: the `near_dup` resource's defaults, with `config` over them (a JSON object, as a
    run's `resources.near_dup.config`). A key the resource does not have, or a value it refuses, is a
    `ConfigurationError`: a typo must not rebuild the index with the defaults."""
    from dedup_pipeline.core.errors import ConfigurationError
    from dedup_pipeline.defs.resources import NearDupResource

    try:
        values = json.loads(config) if config else {}
    except json.JSONDecodeError as exc:
        raise ConfigurationError(f"--config is not JSON ({exc}); for example {CONFIG_EXAMPLE}") from None
    if not isinstance(values, dict):
        raise ConfigurationError(f"--config must be a JSON object of near_dup settings, for example {CONFIG_EXAMPLE}")
    unknown = sorted(set(values) - set(NearDupResource.model_fields))
    if unknown:
        known = ", ".join(sorted(NearDupResource.model_fields))
        raise ConfigurationError(f"--config: no near_dup setting {', '.join(unknown)} (the settings: {known})")
    try:
        return NearDupResource(**values).settings()
    except ValueError as exc:  # pydantic's ValidationError is one
        raise ConfigurationError(f"--config: {' '.join(str(exc).split())}") from None


def cmd_rebuild(args: argparse.Namespace) -> int:
    from dedup_pipeline.ladder.near import rebuild_index
    from dedup_pipeline.store.warehouse import Warehouse

    settings = near_settings(args.config)  # before the warehouse: a wrong setting changes nothing
    warehouse = Warehouse.existing()
    try:
        reports = rebuild_index(warehouse, settings)
    finally:
        warehouse.dispose()
    figures = {
        "batches": len(reports),
        "sketched": sum(r.sketched for r in reports),
        "pairs": sum(r.pairs for r in reports),
        "near_duplicates": sum(len(r.near_duplicates) for r in reports),
        "bands_rows": list(reports[0].bands_rows) if reports and reports[0].method == "minhash" else None,
    }
    warning = next((r.threshold_warning for r in reports if r.threshold_warning), None)
    if warning:  # an index that cannot serve the threshold in use: said here, not only in the rung's figures
        figures["threshold_warning"] = warning
    if args.json:
        print(json.dumps(figures))
    else:
        bands = figures["bands_rows"]
        built = f" ({bands[0]} bands of {bands[1]} rows)" if bands else ""
        print(
            f"near-duplicate index rebuilt{built} over {figures['batches']} batch(es): {figures['sketched']} records "
            f"sketched, {figures['pairs']} verified pairs, {figures['near_duplicates']} records linked as each batch "
            "was indexed"
        )
    if warning:
        print(f"dedup-pipeline rebuild-near-index: warning: {warning}", file=sys.stderr)
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from dedup_pipeline.ladder.near import lean_minhashes
    from dedup_pipeline.store.warehouse import Warehouse

    warehouse = Warehouse.existing()
    with warehouse.engine.connect() as conn:
        unknown = unknown_batch(conn, "export-signatures", args.batch)
    if unknown:
        warehouse.dispose()
        return 2  # a wrong argument, as argparse's own errors
    try:
        sketches = lean_minhashes(warehouse, args.batch)
    except ValueError as exc:  # a SimHash index: nothing written, not even an empty file
        warehouse.dispose()
        print(f"dedup-pipeline export-signatures: error: {exc}", file=sys.stderr)
        return 1
    out = open(args.out, "w", encoding="utf-8") if args.out != "-" else sys.stdout
    count = 0
    try:
        for record_id, natural_key, sketch in sketches:
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
        "from the stored records, batch by batch in landing order, with the near_dup resource's settings",
    )
    rebuild.add_argument(
        "--config",
        metavar="JSON",
        help="near_dup settings over the resource's defaults, as in a run's resources.near_dup.config, for example "
        f"'{CONFIG_EXAMPLE}' (bands and rows of a new index) or "
        '\'{"shingle": "word", "ngram": 3}\'. Runs after it take the index\'s sketch settings wherever their '
        "near_dup config leaves them empty; a run that names other ones is refused",
    )
    rebuild.add_argument("--json", action="store_true", help="print one JSON object")
    rebuild.set_defaults(func=cmd_rebuild)

    export = commands.add_parser(
        "export-signatures",
        help="write each stored record's MinHash sketch as a datasketch LeanMinHash (JSON Lines: record_id, "
        "natural_key, lean_minhash = base64 of LeanMinHash.serialize), for datasketch's LSH Forest or Ensemble",
    )
    export.add_argument("--out", default="-", help="file to write ('-': standard output)")
    export.add_argument("--batch", type=name, help="only the records dated to this batch")
    export.set_defaults(func=cmd_export)
