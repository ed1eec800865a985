"""The privacy and migration subcommands of `dedup-pipeline`: erase, prune-retention, grant-roles, migrate-url."""

from __future__ import annotations

import argparse
import json
import sys

from dedup_pipeline.cli.arguments import whole_number
from dedup_pipeline.core.clustering import DEFAULT_RULE, RULES
from dedup_pipeline.core.erasure import SubjectError, SubjectKind
from dedup_pipeline.core.url import URL_VERSION, URL_VERSIONS
from dedup_pipeline.environment import (
    DEFAULT_ERASURE_RUN_HOURS,
    DEFAULT_RETENTION_DAYS,
    ERASURE_RUN_RETENTION_ENV,
    RETENTION_DAYS_ENV,
)

#: The roles `grant-roles` creates (`RoleNames` fields, default names `dedup_<role>`) and who takes each.
ROLES = {
    "writer": "pipeline's role (rungs, retention, rehash)",
    "analyst": "analysts' read-only role (no personal fields)",
    "eraser": "erasure job's role",
    "monitor": "metrics exporter's role",
}


def _read_value(value: str) -> str:
    """'-' reads the value from standard input, which keeps it out of shell history and the process list."""
    return sys.stdin.readline().rstrip("\n") if value == "-" else value


#: A retention period on the command line.
_KEPT_FOR = whole_number("0 (keep forever) or a whole number")


def _print_counts(title: str, counts: dict, extra: dict) -> None:
    width = max([len(name) for name in counts] + [5])
    print(title)
    for name, n in sorted(counts.items()):
        print(f"  {name.ljust(width)}  {n:>8}")
    for name, value in extra.items():
        print(f"{name}: {value}")


def cmd_erase(args: argparse.Namespace) -> int:
    from dedup_pipeline.core.erasure import Subject
    from dedup_pipeline.ladder.erasure import erase_subject, url_seen_set_from_env
    from dedup_pipeline.store.seen_set import seen_set_from_env
    from dedup_pipeline.store.warehouse import Warehouse

    warehouse = Warehouse().create_schema()
    try:
        version = args.version or (
            warehouse.active_hash_version() if args.kind == SubjectKind.CONTENT_DIGEST.value else None
        )
        subject = Subject.parse(args.kind, _read_value(args.value), field=args.field, version=version)
        report = erase_subject(
            warehouse,
            subject,
            args.request_id,
            seen_set_from_env(args.seen_set),
            args.representative,
            url_seen_set_from_env(),
        )
    except SubjectError as exc:  # the subject as given cannot be used: a wrong argument
        print(f"dedup-pipeline erase: {exc}", file=sys.stderr)
        return 2
    finally:
        warehouse.dispose()
    summary = {
        "erasure_id": report.erasure_id,
        "request_id": report.request_id,
        "kind": report.subject_kind,
        "tombstones_added": report.tombstones_added,
        "clusters_recomputed": report.clusters_recomputed,
        "links_added": report.links_added,
        "seen_set": report.seen_set,
    }
    if report.seen_set_errors:
        summary["seen_set_errors"] = report.seen_set_errors
    if not any(report.removed.values()):  # a typo in the value, or a subject never crawled: say so, not just 0s
        print(
            "dedup-pipeline erase: nothing in the warehouse matched the subject (check the value and kind if it "
            "should have); its tombstones keep it out of every later crawl all the same",
            file=sys.stderr,
        )
    if args.json:
        print(json.dumps({**summary, "removed": report.removed}))
    else:
        _print_counts(
            f"erasure {report.erasure_id}: rows removed per table",
            report.removed,
            {k: v for k, v in summary.items() if k != "erasure_id"},
        )
    return 0


def cmd_prune(args: argparse.Namespace) -> int:
    import dagster as dg

    from dedup_pipeline.cli.runner import ensure_dagster_home
    from dedup_pipeline.defs.erasure import delete_old_erasure_runs, erasure_run_hours
    from dedup_pipeline.ladder.retention import RetentionSettings, prune_retention
    from dedup_pipeline.store.warehouse import Warehouse

    settings = RetentionSettings.from_env(
        decision_days=args.decision_days,
        history_days=args.history_days,
        staging_days=args.staging_days,
        quarantine_days=args.quarantine_days,
    )
    run_hours = erasure_run_hours(args.erasure_run_hours)
    warehouse = Warehouse.existing()  # a wrong URL: an error, not a new warehouse pruned of nothing
    try:
        report = prune_retention(warehouse, settings)
    finally:
        warehouse.dispose()
    ensure_dagster_home()  # the instance the CLI's runs go to: its erase_subject runs name their subjects
    with dg.DagsterInstance.get() as instance:
        runs_deleted = delete_old_erasure_runs(instance, run_hours)
    extra = {"erased decisions redacted": report.redacted_erased_decisions, "erasure runs deleted": runs_deleted}
    if args.json:
        print(
            json.dumps(
                {
                    "pruned": report.pruned,
                    "redacted_erased_decisions": report.redacted_erased_decisions,
                    "erasure_runs_deleted": runs_deleted,
                }
            )
        )
    else:
        _print_counts("rows pruned per table", report.pruned, extra)
    return 0


def role_names(args: argparse.Namespace) -> dict[str, str]:
    """The role names `grant-roles` was given, by `RoleNames` field; the others keep their defaults."""
    return {role: getattr(args, role) for role in ROLES if getattr(args, role) is not None}


def cmd_grant_roles(args: argparse.Namespace) -> int:
    from dedup_pipeline.store.roles import RoleNames, grant_roles
    from dedup_pipeline.store.warehouse import Warehouse

    warehouse = Warehouse().create_schema()
    try:
        names = grant_roles(warehouse.engine, RoleNames(**role_names(args)))
    except (RuntimeError, ValueError) as exc:
        print(f"dedup-pipeline grant-roles: {exc}", file=sys.stderr)
        return 2
    finally:
        warehouse.dispose()
    print("granted: " + ", ".join(names))
    return 0


def cmd_migrate_url(args: argparse.Namespace) -> int:
    from dedup_pipeline.ladder.url_migration import migrate_url_version
    from dedup_pipeline.store.warehouse import Warehouse

    warehouse = Warehouse.existing().create_schema()
    try:
        report = migrate_url_version(warehouse, args.to, representative=args.representative)
    finally:
        warehouse.dispose()
    if args.json:
        print(json.dumps(report.as_metadata()))
    else:
        print(f"URL version: {report.from_version} -> {report.to_version}")
        _print_counts("rows changed", {k: v for k, v in report.as_metadata().items() if isinstance(v, int)}, {})
    return 0


def add_commands(commands) -> None:
    """Register the subcommands on the main parser's subparsers."""
    erase = commands.add_parser(
        "erase", help="erase a data subject: every copy in the warehouse, plus tombstones so no re-crawl brings it back"
    )
    erase.add_argument("--kind", required=True, choices=[k.value for k in SubjectKind], help="how the subject is named")
    erase.add_argument("--value", required=True, help="the key, URL, field value or digest; '-' reads it from stdin")
    erase.add_argument("--field", help="kind field: the field path, e.g. seller_id or author.email")
    erase.add_argument("--version", help="kind content_digest: the hash version (default: the active one)")
    erase.add_argument("--request-id", default="", help="your reference for the request (never personal data)")
    erase.add_argument(
        "--representative", default=DEFAULT_RULE, choices=RULES, help="cluster representative rule in use"
    )
    erase.add_argument(
        "--seen-set",
        default="auto",
        choices=["auto", "redis", "bloom", "none"],
        help="seen-set to clear (auto: Redis if $DEDUP_REDIS_URL is set)",
    )
    erase.add_argument("--json", action="store_true", help="print one JSON object")
    erase.set_defaults(func=cmd_erase)

    prune = commands.add_parser(
        "prune-retention", help="delete decision-log rows, history, staged rows and quarantine past retention"
    )
    for setting, variable in RETENTION_DAYS_ENV.items():  # --decision-days ... --quarantine-days
        prune.add_argument(
            f"--{setting.replace('_', '-')}",
            type=_KEPT_FOR,
            help=f"days to keep (default ${variable}, else {DEFAULT_RETENTION_DAYS[setting]}; 0 keeps forever)",
        )
    prune.add_argument(
        "--erasure-run-hours",
        type=_KEPT_FOR,
        help="hours finished erase_subject runs stay in the Dagster instance "
        f"(default ${ERASURE_RUN_RETENTION_ENV}, else {DEFAULT_ERASURE_RUN_HOURS})",
    )
    prune.add_argument("--json", action="store_true", help="print one JSON object")
    prune.set_defaults(func=cmd_prune)

    grant = commands.add_parser(
        "grant-roles", help="PostgreSQL: create the writer, analyst, eraser and monitor roles and apply their grants"
    )
    for role, what in ROLES.items():
        grant.add_argument(f"--{role}", metavar="NAME", help=f"name of the {what} (default dedup_{role})")
    grant.set_defaults(func=cmd_grant_roles)

    migrate = commands.add_parser(
        "migrate-url", help="move the warehouse's keys to a new URL version (url/2: no userinfo, compressed IPv6)"
    )
    migrate.add_argument("--to", default=URL_VERSION, choices=URL_VERSIONS, help="the target URL version")
    migrate.add_argument(
        "--representative", default=DEFAULT_RULE, choices=RULES, help="cluster representative rule in use"
    )
    migrate.add_argument("--json", action="store_true", help="print one JSON object")
    migrate.set_defaults(func=cmd_migrate_url)
