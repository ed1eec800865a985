"""The command line, as a user runs it: a fresh working directory, the embedded default."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from dedup_pipeline_tests.helpers import listing, write_batch


def run_cli(args, cwd: Path, **env) -> subprocess.CompletedProcess:
    environment = {k: v for k, v in os.environ.items() if not k.startswith(("DEDUP_", "DAGSTER_HOME"))}
    environment.update(env)
    return subprocess.run(
        [sys.executable, "-m", "dedup_pipeline.cli", *args],
        cwd=cwd,
        env=environment,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_run_json_on_the_embedded_default(tmp_path):
    landing = tmp_path / "landing"
    write_batch(landing, "a", [listing(n) for n in range(5)] + [listing(0, crawl_id="x"), "{broken"], landed=1e9)
    write_batch(
        landing, "b", [listing(n, price="1.00") if n == 4 else listing(n) for n in range(3, 8)], landed=1e9 + 60
    )
    result = run_cli(["run", "--landing", str(landing), "--json"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["warehouse_records"] == 8
    a, b = out["batches"]
    assert a == {
        "batch": "a",
        "records_in": 7,
        "quarantined": 1,
        "exact_duplicates": 1,
        "changed": 0,
        "new": 5,
        "stale": 0,
        "near_duplicates": 0,
        "change_ignored": 0,
        "erased": 0,
        "capped": 0,
    }
    assert (b["exact_duplicates"], b["changed"], b["new"]) == (1, 1, 3)
    # the embedded default: a SQLite warehouse and a local Dagster instance inside the working directory
    assert (tmp_path / ".dedup" / "warehouse.sqlite").exists()
    assert (tmp_path / ".dagster_home").is_dir()


def test_every_line_of_a_run_is_counted_once_erased_records_too(tmp_path):
    """Breaks: the summary left erased records out, so a batch's figures did not add up to its lines. The table
    shows the `erased` column when a batch has one, and only then."""
    import secrets

    env = {"DEDUP_TOMBSTONE_KEY": secrets.token_hex(32)}
    landing = tmp_path / "landing"
    write_batch(landing, "a", [listing(n) for n in range(3)], landed=1e9)
    first = run_cli(["run", "--landing", str(landing)], cwd=tmp_path, **env)
    assert first.returncode == 0 and "erased" not in first.stdout, first.stdout + first.stderr
    erase = ["erase", "--kind", "canonical_url", "--value", listing(1)["url"], "--request-id", "R-1"]
    assert run_cli(erase, cwd=tmp_path, **env).returncode == 0
    write_batch(landing, "b", [listing(1, crawl_id="again"), listing(2, price="99.90"), "{broken"], landed=1e9 + 60)
    result = run_cli(["run", "--landing", str(landing), "--json"], cwd=tmp_path, **env)
    assert result.returncode == 0, result.stderr
    a, b = json.loads(result.stdout)["batches"]
    assert (a["erased"], a["exact_duplicates"], b["erased"], b["changed"], b["quarantined"]) == (1, 2, 1, 1, 1)
    for batch in (a, b):
        decided = sum(
            batch[k] for k in ("quarantined", "exact_duplicates", "changed", "new", "stale", "change_ignored", "erased")
        )
        assert decided == batch["records_in"], batch
    table = run_cli(["run", "--landing", str(landing)], cwd=tmp_path, **env).stdout
    header, _, row_a, row_b = table.splitlines()[:4]
    assert "erased" in header.split("  ") and "change ignored" not in header, table
    assert row_b.split()[header.split().index("erased") - 1] == "1", table  # "exact dup": two words, one cell


def test_run_goes_on_past_a_failed_batch_and_names_every_file_it_left_alone(tmp_path):
    """Breaks: a landing folder with a corrupt batch between good ones, a batch still being written, files
    that are not batches (a README, a name no partition key can take, an upper-case suffix), and two files of
    one batch key.

    Must hold: the good batches are stored; the corrupt one is reported as failed (stderr and JSON) and the
    exit status is 1; the fresh file is left for a later run, and so is every other file, each named with why.
    """
    import gzip

    landing = tmp_path / "landing"
    write_batch(landing, "2026-11-01-a", [listing(n) for n in range(3)], landed=1e9)
    flipped = bytearray(gzip.compress(b"".join(json.dumps(listing(n)).encode() + b"\n" for n in range(300))))
    flipped[len(flipped) // 2] ^= 0x10
    (landing / "2026-11-02-b.jsonl.gz").write_bytes(bytes(flipped))
    os.utime(landing / "2026-11-02-b.jsonl.gz", (1e9 + 60, 1e9 + 60))
    write_batch(landing, "2026-11-03-c", [listing(n) for n in range(10, 12)], landed=1e9 + 120)
    write_batch(landing, "2026-11-04-d", [listing(20)])  # modified now: still being written
    for name in ("README.md", "2026-11-05 e.jsonl", "2026-11-06-f.JSONL"):
        write_batch(landing, name.removesuffix(".jsonl"), [listing(30)], landed=1e9) if name.endswith(".jsonl") else (
            landing / name
        ).write_text("notes\n")
    write_batch(landing, "2026-11-07-g", [listing(40)], landed=1e9)
    write_batch(landing, "2026-11-07-g", [listing(41)], landed=1e9, gz=True)  # two files, one batch key

    # 60 s, not the default 5: on a busy machine the command can take longer than 5 s to start, and d would settle
    result = run_cli(["run", "--landing", str(landing), "--json", "--settle-seconds", "60"], cwd=tmp_path)
    assert result.returncode == 1, result.stderr
    out = json.loads(result.stdout)
    assert [b["batch"] for b in out["batches"]] == ["2026-11-01-a", "2026-11-03-c"]
    assert out["warehouse_records"] == 5
    (failed,) = out["failed"]
    assert failed["batch"] == "2026-11-02-b" and "is corrupt" in failed["error"]
    assert "batch 2026-11-02-b failed:" in result.stderr
    notices = "\n".join(out["notices"])
    assert "not yet: 2026-11-04-d.jsonl was modified" in notices
    assert "ignored: README.md: not a batch file" in notices
    assert "ignored: 2026-11-05 e.jsonl: its name (less the suffix) is not a batch key" in notices
    assert "ignored: 2026-11-06-f.JSONL: not a batch file" in notices
    assert "ambiguous: batch '2026-11-07-g': 2 files map to it (2026-11-07-g.jsonl, 2026-11-07-g.jsonl.gz)" in notices
    assert all(f"dedup-pipeline run: {notice}" in result.stderr for notice in out["notices"])

    later = run_cli(["run", "--landing", str(landing), "--json", "--settle-seconds", "0"], cwd=tmp_path)
    assert "2026-11-04-d" in [b["batch"] for b in json.loads(later.stdout)["batches"]]


def test_demo_prints_the_decision_table(tmp_path):
    result = run_cli(["demo"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    header = next(line for line in lines if line.startswith("batch"))
    assert header.split() == ["batch", "in", "quarantined", "exact", "dup", "changed", "new", "stale", "near", "dup"]
    rows = {line.split()[0]: line.split()[1:] for line in lines if line.startswith("2026-")}
    assert set(rows) == {f"2026-11-0{day}-shop" for day in range(1, 5)} | {"2026-11-02-syndication"}
    shop1 = dict(
        zip(["in", "quarantined", "exact", "changed", "new", "stale", "near"], map(int, rows["2026-11-01-shop"]))
    )
    assert shop1["quarantined"] == 2 and shop1["exact"] > 0 and shop1["new"] > 0
    syndication = rows["2026-11-02-syndication"]
    assert int(syndication[-1]) > 0  # syndicated copies are linked as near duplicates
    assert "warehouse records:" in result.stdout


def test_decisions_piped_into_a_reader_that_stops_early_ends_without_a_traceback(tmp_path):
    """`dedup-pipeline decisions | head -1`: the reader closes the pipe long before the log is printed."""
    from dedup_pipeline.ladder.canonical import canonicalise_batch
    from dedup_pipeline.ladder.exact import deduplicate_batch
    from dedup_pipeline.ladder.raw import ingest_raw_batch
    from dedup_pipeline.ladder.settings import LadderSettings
    from dedup_pipeline.landing import find_batch
    from dedup_pipeline.store.warehouse import Warehouse

    write_batch(tmp_path / "landing", "a", [listing(n) for n in range(2000)], landed=1e9)  # ~600 KB of events
    warehouse = Warehouse(f"sqlite:///{tmp_path / '.dedup' / 'warehouse.sqlite'}").create_schema()
    ingest_raw_batch(warehouse, find_batch(tmp_path / "landing", "a"))
    canonicalise_batch(warehouse, "a", LadderSettings())
    deduplicate_batch(warehouse, "a", "run-a", LadderSettings())
    warehouse.dispose()
    environment = {k: v for k, v in os.environ.items() if not k.startswith(("DEDUP_", "DAGSTER_HOME"))}
    process = subprocess.Popen(
        [sys.executable, "-m", "dedup_pipeline.cli", "decisions"],
        cwd=tmp_path,
        env=environment,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert json.loads(process.stdout.readline())["line_no"] == 1
    process.stdout.close()  # as `head` does once it has its line
    stderr = process.stderr.read().decode()
    assert process.wait(timeout=60) == 1  # cut short: a failure status, but no traceback
    assert "Traceback" not in stderr and "BrokenPipe" not in stderr, stderr


def test_what_the_operator_must_fix_is_one_line_of_error_not_a_traceback(tmp_path, pg_database_url):
    """An unwritable path, an unreachable warehouse (for `run` too, before any batch is tried), a warehouse file
    that is not an SQLite database, a landing folder
    or a DAGSTER_HOME that does not exist, a wrong retention setting, a missing tombstone key: one line naming
    it, status 1."""
    from dedup_pipeline.store.warehouse import Warehouse

    unwritable = str(tmp_path / "no" / "such" / "dir" / "dedup.prom")
    down = {"DEDUP_DATABASE_URL": "postgresql+psycopg://postgres@127.0.0.1:1/nowhere"}
    write_batch(tmp_path / "landing", "a", [listing(1)], landed=1e9)
    existing = f"sqlite:///{tmp_path / 'warehouse.sqlite'}"
    Warehouse(existing).create_schema().dispose()
    not_sqlite = tmp_path / "notes.sqlite"
    not_sqlite.write_text("a text file, not a database\n")
    cases = [
        (
            ["metrics", "--textfile", unwritable],
            {"DEDUP_DATABASE_URL": existing},
            f"cannot write {unwritable}: No such file or directory",
        ),
        (["metrics"], down, "connection failed"),
        (["run", "--landing", str(tmp_path / "landing")], down, "connection failed"),
        (["run", "--landing", str(tmp_path / "nowhere")], {}, "does not exist or is not a folder"),
        (["metrics"], {"DEDUP_DATABASE_URL": "postgres://postgres@127.0.0.1/test"}, "the warehouse URL is not one"),
        (["metrics"], {"DEDUP_DATABASE_URL": "not a url"}, "the warehouse URL is not one"),
        (["metrics"], {"DEDUP_DATABASE_URL": f"sqlite:///{not_sqlite}"}, "file is not a database"),
        (
            ["run", "--landing", str(tmp_path / "landing")],
            {"DEDUP_DATABASE_URL": f"sqlite:///{not_sqlite}"},
            "file is not a database",
        ),
        (
            ["run", "--landing", str(tmp_path / "landing")],
            {"DAGSTER_HOME": str(tmp_path / "no-home")},
            f"DAGSTER_HOME={tmp_path / 'no-home'} is not a folder",
        ),
        (
            ["prune-retention"],
            {"DEDUP_HISTORY_RETENTION_DAYS": "a year"},
            "DEDUP_HISTORY_RETENTION_DAYS must be a whole number",
        ),
        (
            ["erase", "--kind", "canonical_url", "--value", "https://shop.example.com/p/1"],
            {"DEDUP_DATABASE_URL": pg_database_url},
            "DEDUP_TOMBSTONE_KEY is not set",
        ),
    ]
    for args, env, reason in cases:
        result = run_cli(args, cwd=tmp_path, **env)
        assert result.returncode == 1, (args, result.stderr)
        assert result.stderr.startswith(f"dedup-pipeline {args[0]}: error: ") and reason in result.stderr, result.stderr
        assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr, result.stderr


def test_the_kubernetes_exporter_runs_a_command_the_cli_accepts():
    import yaml

    from dedup_pipeline.cli import build_parser

    manifest = Path(__file__).resolve().parents[2] / "deploy" / "k8s" / "metrics-exporter.yaml"
    deployment = next(doc for doc in yaml.safe_load_all(manifest.read_text()) if doc["kind"] == "Deployment")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    program, *args = container["command"]
    parsed = build_parser().parse_args(args)
    assert program == "dedup-pipeline" and parsed.command == "metrics"
    assert parsed.serve[1] == container["ports"][0]["containerPort"]


def test_read_only_commands_refuse_a_database_without_a_warehouse_and_create_nothing(tmp_path):
    """Breaks: `metrics`, `decisions` and `prune-retention` pointed at a wrong SQLite path, an empty SQLite file, a
    database of another application and an empty PostgreSQL database (the URL with a password).

    Must hold: one line of error naming the URL (its password hidden), status 1, and nothing created there:
    no file, no folder, no table.
    """
    from sqlalchemy import create_engine, inspect, text

    from dedup_pipeline.store.warehouse import Warehouse
    from dedup_pipeline_tests.helpers import database_url, fresh_database

    missing = tmp_path / "typo" / "warehouse.sqlite"
    empty = tmp_path / "empty.sqlite"
    empty.touch()
    other = tmp_path / "other.sqlite"
    with create_engine(f"sqlite:///{other}").begin() as conn:
        conn.execute(text("CREATE TABLE dedup_settings (name TEXT)"))  # one name in common, not a warehouse
    older = tmp_path / "older.sqlite"  # a warehouse of a version before erasure scopes
    Warehouse(f"sqlite:///{older}").create_schema().dispose()
    with create_engine(f"sqlite:///{older}").begin() as conn:
        conn.execute(text("DROP TABLE erasure_scopes"))
    with fresh_database("dedup_cli_empty") as name:
        pg_url = database_url(name).replace("postgres@", "postgres:s3cret@")
        shown_pg = pg_url.replace(":s3cret@", ":***@")
        every = (["metrics"], ["metrics", "--serve", "127.0.0.1:0"], ["decisions"], ["prune-retention"])
        cases = [
            (f"sqlite:///{missing}", "there is no dedup_pipeline warehouse at", every),
            (f"sqlite:///{empty}", "there is no dedup_pipeline warehouse at", (["decisions"],)),
            (f"sqlite:///{other}", "there is no dedup_pipeline warehouse at", (["metrics"],)),
            (f"sqlite:///{older}", "the dedup_pipeline warehouse at", (["metrics"],)),
            (pg_url, "there is no dedup_pipeline warehouse at", every),
        ]
        for url, reason, commands in cases:
            for args in commands:
                result = run_cli(args, cwd=tmp_path, DEDUP_DATABASE_URL=url)
                assert result.returncode == 1, (args, url, result.stdout, result.stderr)
                assert result.stderr.startswith(f"dedup-pipeline {args[0]}: error: {reason} "), result.stderr
                assert (shown_pg if url == pg_url else url) in result.stderr and "s3cret" not in result.stderr
                assert len(result.stderr.strip().splitlines()) == 1, result.stderr
                assert (
                    url != f"sqlite:///{older}"
                    or "lacks the tables erasure_scopes: a `dedup-pipeline run`" in result.stderr
                )
        assert not missing.parent.exists()
        assert empty.stat().st_size == 0  # and no journal beside it, nor beside the other application's file:
        assert not {"typo", "empty.sqlite-wal", "empty.sqlite-shm", "other.sqlite-wal"} & {
            p.name for p in tmp_path.iterdir()
        }
        for url in (f"sqlite:///{other}", database_url(name)):
            engine = create_engine(url)
            with engine.connect() as conn:
                assert inspect(conn).get_table_names() == (["dedup_settings"] if "other" in url else [])
            engine.dispose()


def test_migrate_url_moves_the_warehouse_to_url2_and_prints_counts(tmp_path):
    landing = tmp_path / "landing"
    write_batch(landing, "a", [listing(1), listing(2, url="http://[2001:0DB8::1]/p/2")], landed=1e9)
    assert run_cli(["migrate-url"], cwd=tmp_path).returncode == 1  # no warehouse yet: nothing is created
    assert run_cli(["run", "--landing", str(landing)], cwd=tmp_path).returncode == 0
    result = run_cli(["migrate-url", "--json"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert (report["from_version"], report["to_version"], report["rows_rewritten"]) == ("url/2", "url/2", 0)
    text = run_cli(["migrate-url"], cwd=tmp_path).stdout
    assert text.startswith("URL version: url/2 -> url/2") and "rows_rewritten" in text


def test_run_fails_a_batch_whose_gzip_header_is_damaged(tmp_path):
    """Breaks: a 150-record `.jsonl.gz` with a damaged header was "in 1, quarantined 1", exit status 0."""
    import gzip

    landing = tmp_path / "landing"
    landing.mkdir()
    data = bytearray(gzip.compress(b"".join(json.dumps(listing(n)).encode() + b"\n" for n in range(150)), mtime=0))
    data[0] ^= 0xFF
    (landing / "2026-11-01-shop.jsonl.gz").write_bytes(bytes(data))
    os.utime(landing / "2026-11-01-shop.jsonl.gz", (1e9, 1e9))
    result = run_cli(["run", "--landing", str(landing), "--json"], cwd=tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    (failed,) = json.loads(result.stdout)["failed"]
    assert failed["batch"] == "2026-11-01-shop" and "cannot be read (Not a gzipped file" in failed["error"]


def test_demo_batches_stay_in_the_landing_folder_the_ui_reads(tmp_path):
    """Breaks: the demo wrote its batches to a temporary folder and deleted it, so "Materialize" on a demo
    partition in the UI failed with `no landing file for batch …`."""
    result = run_cli(["demo", "--json"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    batches = [b["batch"] for b in json.loads(result.stdout)["batches"]]
    landed = sorted(p.name.split(".")[0] for p in (tmp_path / ".dedup" / "landing").iterdir())
    assert landed == batches and len(batches) == 5


def test_decisions_of_an_unknown_batch_is_an_error_naming_it(tmp_path):
    """Breaks: `decisions --batch <typo>` printed nothing and exited 0, as if the batch had no decisions."""
    landing = tmp_path / "landing"
    write_batch(landing, "2026-11-01-shop", [listing(n) for n in range(3)], landed=1e9)
    assert run_cli(["run", "--landing", str(landing)], cwd=tmp_path).returncode == 0
    known = run_cli(["decisions", "--batch", "2026-11-01-shop"], cwd=tmp_path)
    assert known.returncode == 0 and len(known.stdout.splitlines()) == 3
    unknown = run_cli(["decisions", "--batch", "2026-11-01-shpo"], cwd=tmp_path)
    assert unknown.returncode == 2 and unknown.stdout == ""  # a wrong argument
    assert unknown.stderr.startswith("dedup-pipeline decisions: error: no batch '2026-11-01-shpo' in the warehouse")
    # Breaks: `--run` with the 8 characters the UI shows, or a typo, printed nothing and exited 0.
    run_id = json.loads(known.stdout.splitlines()[0])["run_id"]
    short = run_cli(["decisions", "--run", run_id[:8]], cwd=tmp_path)
    assert short.returncode == 0 and len(short.stdout.splitlines()) == 3
    typo = run_cli(["decisions", "--run", "zz" + run_id[2:8]], cwd=tmp_path)
    assert typo.returncode == 2 and "names no run of the decision log" in typo.stderr
    # Breaks: an empty value (an unset shell variable) filtered nothing and printed every batch's decisions.
    for option in (["decisions", "--batch"], ["decisions", "--run"], ["export-signatures", "--batch"]):
        empty = run_cli([*option, ""], cwd=tmp_path)
        assert empty.returncode == 2 and empty.stdout == "", option
        assert f"argument {option[1]}: must not be empty, got ''" in empty.stderr


def test_version_prints_the_installed_version():
    from importlib.metadata import version

    result = subprocess.run(
        [sys.executable, "-m", "dedup_pipeline.cli", "--version"], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0 and result.stdout.strip() == f"dedup-pipeline {version('dedup_pipeline')}"


def test_run_holds_a_source_s_later_batches_after_one_failed_and_shows_what_the_failed_one_stored(tmp_path):
    """Breaks (#21.1): `run` went on with a source's later batches after an earlier one failed, so the later
    ones were stored first and the earlier one's history was lost; and a failed batch left the table.

    Must hold: the source's later batch is held, not run, and says so (stderr, JSON, the table's status
    column); another source's batch runs; the failed batch is in the table with what it stored before its
    blocking check failed (its lines and quarantined lines, no decisions); exit status 1.
    """
    landing = tmp_path / "landing"
    write_batch(landing, "2026-11-01-shop", [listing(n) for n in range(3)], landed=1e9)
    write_batch(landing, "2026-11-02-shop", [listing(5)] + ["{broken"] * 9, landed=1e9 + 60)  # mostly broken
    write_batch(landing, "2026-11-02-wire", [listing(n) for n in range(50, 52)], landed=1e9 + 90)
    write_batch(landing, "2026-11-03-shop", [listing(n) for n in range(10, 12)], landed=1e9 + 120)
    result = run_cli(["run", "--landing", str(landing), "--json"], cwd=tmp_path)
    assert result.returncode == 1, result.stderr
    out = json.loads(result.stdout)
    assert [b["batch"] for b in out["batches"]] == ["2026-11-01-shop", "2026-11-02-wire"]
    (failed,) = out["failed"]
    assert failed["batch"] == "2026-11-02-shop" and "quarantine_rate_under_bound" in failed["error"]
    assert (failed["stored"]["records_in"], failed["stored"]["quarantined"], failed["stored"]["new"]) == (10, 9, 0)
    (held,) = out["held"]
    assert held["batch"] == "2026-11-03-shop" and held["reason"].startswith(
        "held: batch 2026-11-02-shop of source 'shop' failed before it"
    )
    assert "dedup-pipeline run: batch 2026-11-03-shop held: batch 2026-11-02-shop" in result.stderr
    # not a terminal: one plain progress line per batch, on stderr
    assert "dedup-pipeline run: batch 2/4 2026-11-02-shop: FAILED in " in result.stderr
    assert "dedup-pipeline run: batch 4/4 2026-11-03-shop: held (not run)" in result.stderr

    table = run_cli(["run", "--landing", str(landing)], cwd=tmp_path).stdout.splitlines()
    assert table[0].split()[-1] == "status"
    rows = {line.split()[0]: line.split() for line in table[2:6]}
    assert rows["2026-11-02-shop"][1:3] == ["10", "9"] and rows["2026-11-02-shop"][-1] == "FAILED"
    assert rows["2026-11-03-shop"][-1] == "held" and rows["2026-11-01-shop"][-1] == "ok"


def test_the_rebuild_a_threshold_warning_advises_serves_the_threshold(tmp_path):
    """Breaks: near 1 the bands chosen for a threshold favour precision (2 x 59 at 0.99 makes candidates of 0.80
    of the pairs at it), yet the warning advised rebuilding "for 0.99", which gave the same index and warning.

    Must hold: the advised rebuild, run as printed, builds an index that serves the threshold without a warning.
    """
    landing = tmp_path / "landing"
    write_batch(landing, "a", [listing(n) for n in range(3)], landed=1e9)
    assert run_cli(["run", "--landing", str(landing)], cwd=tmp_path).returncode == 0
    first = run_cli(["rebuild-near-index", "--json", "--config", '{"threshold": 0.99}'], cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    warning = json.loads(first.stdout)["threshold_warning"]
    advised = re.search(r"rebuild-near-index --config '([^']*)'", warning).group(1)
    assert json.loads(advised) != {"threshold": 0.99}, warning
    second = run_cli(["rebuild-near-index", "--json", "--config", advised], cwd=tmp_path)
    assert second.returncode == 0, second.stderr
    figures = json.loads(second.stdout)
    assert "threshold_warning" not in figures and "too low" not in second.stderr
    assert figures["bands_rows"] == [json.loads(advised)["bands"], json.loads(advised)["rows"]]


def test_a_run_over_an_index_that_cannot_serve_its_threshold_says_so(tmp_path):
    """Breaks: an index rebuilt with bands for a higher threshold (16 x 8: a pair at 0.5 is a candidate with
    probability 0.06) took runs at 0.5 with no word outside the rung's metadata; the rebuild said nothing either."""
    landing = tmp_path / "landing"
    write_batch(landing, "a", [listing(n) for n in range(3)], landed=1e9)
    assert run_cli(["run", "--landing", str(landing)], cwd=tmp_path).returncode == 0
    rebuilt = run_cli(["rebuild-near-index", "--json", "--config", '{"bands": 16, "rows": 8}'], cwd=tmp_path)
    assert rebuilt.returncode == 0, rebuilt.stderr
    figures = json.loads(rebuilt.stdout)
    assert figures["bands_rows"] == [16, 8] and "too low for an index of 16 bands of 8 rows" in rebuilt.stderr
    assert figures["threshold_warning"] in rebuilt.stderr
    write_batch(landing, "b", [listing(n) for n in range(3, 6)], landed=1e9 + 60)
    again = run_cli(["run", "--landing", str(landing)], cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert again.stderr.count("dedup-pipeline run: near rung: threshold 0.5 is too low for an index of 16 bands") == 1


def test_the_deployment_s_policy_reaches_every_command_line_run(tmp_path):
    """Breaks: `dedup-pipeline run` always decided under `upsert`: a warehouse run under `keep_first` (from the
    launchpad) had its kept versions overwritten by the next command-line run, which had no way to take the
    policy. `DEDUP_ON_CHANGED` sets it for every run of the deployment."""
    landing = tmp_path / "landing"
    write_batch(landing, "2026-11-01-shop", [listing(1, price="9.90")], landed=1e9)
    write_batch(landing, "2026-11-02-shop", [listing(1, price="10.00")], landed=1e9 + 60)
    result = run_cli(["run", "--landing", str(landing), "--json"], cwd=tmp_path, DEDUP_ON_CHANGED="keep_first")
    assert result.returncode == 0, result.stderr
    later = json.loads(result.stdout)["batches"][1]
    assert (later["change_ignored"], later["changed"]) == (1, 0)
    wrong = run_cli(["run", "--landing", str(landing)], cwd=tmp_path, DEDUP_ON_CHANGED="keep_last")
    assert wrong.returncode == 1 and "on_changed" in wrong.stderr


def test_wrong_numbers_on_the_command_line_are_refused_in_one_line(tmp_path):
    """Breaks: `--settle-seconds -5` or `nan` took every file, `inf` none, both silently; `--workers abc` named an
    internal function; `--max-age` without `--serve` was ignored."""
    for args in (
        ["run", "--settle-seconds", "-5"],
        ["run", "--settle-seconds", "nan"],
        ["run", "--settle-seconds", "inf"],
        ["run", "--workers", "abc"],
        ["metrics", "--max-age", "5"],
    ):
        result = run_cli(args, cwd=tmp_path)
        assert result.returncode == 2 and len(result.stderr.strip().splitlines()) <= 3, (args, result.stderr)
        assert "_workers" not in result.stderr and "Traceback" not in result.stderr
        assert not (tmp_path / ".dedup").exists()  # refused before anything was created


def test_a_second_run_over_the_same_landing_folder_is_refused_while_the_first_runs(tmp_path):
    """Breaks: two `run`s over one folder (a cron entry overlapping the last) both ran every batch, a source's
    batches of one beside the other's, out of landing order, and counted every decision twice."""
    from dedup_pipeline.cli.runner import one_run_per_landing_folder

    landing = tmp_path / "landing"
    write_batch(landing, "2026-11-01-shop", [listing(1)], landed=1e9)
    home = tmp_path / ".dagster_home"
    home.mkdir()
    with one_run_per_landing_folder(home, landing):  # the first run, as far as the second can tell
        second = run_cli(["run", "--landing", str(landing)], cwd=tmp_path)
    assert second.returncode == 1, second.stderr
    assert f"another `dedup-pipeline run` (pid {os.getpid()}) is running over {landing.resolve()}" in second.stderr
    assert run_cli(["run", "--landing", str(landing)], cwd=tmp_path).returncode == 0  # once it ended


def test_ctrl_c_stops_a_run_before_its_next_batch(tmp_path):
    """Breaks: Ctrl-C during a batch failed it (or, landing in a query or between steps, was swallowed and the
    batch ended ok), and `run` went on with every batch after it. Must hold: no batch starts after the
    interrupt, and the command says so, exit status 130."""
    import signal
    import time

    landing = tmp_path / "landing"
    for day in range(4):
        rows = [listing(n, price=f"{day}.50") for n in range(2500)]
        write_batch(landing, f"2026-11-0{day + 1}-shop", rows, landed=1e9 + 60 * day)
    environment = {k: v for k, v in os.environ.items() if not k.startswith(("DEDUP_", "DAGSTER_HOME"))}
    process = subprocess.Popen(
        [sys.executable, "-m", "dedup_pipeline.cli", "run", "--landing", str(landing), "--settle-seconds", "0"],
        cwd=tmp_path,
        env=environment,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, as a terminal's foreground job: Ctrl-C reaches them all
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # a background job inherits it ignored
    )
    lines = []
    for line in process.stderr:
        lines.append(line)
        if "batch 1/4" in line and "ok in" in line:
            os.killpg(process.pid, signal.SIGINT)
            break
    time.sleep(0.1)
    rest = process.communicate(timeout=300)[1]
    err = "".join(lines) + rest
    assert process.returncode == 130, err
    assert "interrupted (Ctrl-C): no batch started after it" in err and "batch 4/4" not in err
