"""The landing folder and the local disk misbehaving: read-only, unreadable files, a full disk, files being written.

A full disk is a real one where the kernel lets us mount a tmpfs of a few
hundred kilobytes (as root in CI); elsewhere SQLite's `max_page_count` gives
the same SQLITE_FULL error ("database or disk is full") and the Bloom
seen-set writes its file through a symlink to /dev/full (ENOSPC).
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import dagster as dg
import pytest
from sqlalchemy import event, select
from sqlalchemy.exc import OperationalError

import dedup_pipeline.ladder.canonical as canonical_rung
import dedup_pipeline.ladder.raw as raw_rung
from dedup_pipeline.defs.resources import LadderResource, LandingResource
from dedup_pipeline.defs.sensors import landing_sensor
from dedup_pipeline.ladder.canonical import canonicalise_batch
from dedup_pipeline.ladder.exact import deduplicate_batch
from dedup_pipeline.ladder.raw import ingest_raw_batch
from dedup_pipeline.landing import BatchFileError, find_batch, iter_lines
from dedup_pipeline.store.schema import canonical_records, crawl_batches, quarantine
from dedup_pipeline.store.seen_set import BloomSeenSet
from dedup_pipeline.store.warehouse import Warehouse
from dedup_pipeline_tests.helpers import listing, snapshot, write_batch
from dedup_pipeline_tests.reliability.ladder_run import (
    SETTINGS,
    canonical_lines,
    clean_run,
    count,
    quarantined_lines,
    run_ladder,
)

REPO = Path(__file__).resolve().parents[2]
#: SQLITE_FULL as SQLAlchemy wraps it, or raw from the bulk path (`copy_rows` uses the driver cursor).
DISK_FULL = (OperationalError, sqlite3.OperationalError)


def _mount_tmpfs(folder: Path, size: str) -> bool:
    folder.mkdir(parents=True, exist_ok=True)
    return (
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)], capture_output=True
        ).returncode
        == 0
    )


def _umount(folder: Path) -> None:
    subprocess.run(["umount", "-l", str(folder)], capture_output=True)


@pytest.fixture
def small_disk(tmp_path):
    """A 16 MiB tmpfs if the kernel lets us mount one, else a plain folder (the tests then simulate ENOSPC)."""
    folder = tmp_path / "small-disk"
    mounted = _mount_tmpfs(folder, "16m")
    yield folder, mounted
    if mounted:
        _umount(folder)


def fill(folder: Path, leave: int = 0) -> Path:
    """Write a filler file until the disk has at most `leave` bytes free."""
    filler = folder / "filler"
    with open(filler, "wb") as handle:
        block = b"\0" * 4096
        try:
            while os.statvfs(folder).f_bavail * os.statvfs(folder).f_frsize > leave:
                handle.write(block)
                handle.flush()
        except OSError:
            pass
    return filler


def partition_state(engine, batch: str) -> list:
    with engine.connect() as conn:
        return [
            sorted(tuple(r) for r in conn.execute(select(*t.c).where(t.c.batch_id == batch)))
            for t in (crawl_batches, quarantine, canonical_records)
        ]


def run_worker(*args: str, drop_root_rights: bool = False) -> dict:
    """The ladder in a separate process; as root, without the capabilities that let root read any file."""
    command = [sys.executable, "-m", "dedup_pipeline_tests.reliability.worker", *args]
    if drop_root_rights and os.geteuid() == 0:
        command = ["setpriv", "--bounding-set=-dac_override,-dac_read_search", *command]
    done = subprocess.run(command, capture_output=True, text=True, cwd=REPO, timeout=300)
    assert done.stdout, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("warehouse_url", ["sqlite"], indirect=True)  # the landing folder does not care which warehouse
def test_a_read_only_landing_folder_is_only_read(warehouse, tmp_path):
    """Breaks: the landing folder is read-only (a tmpfs remounted read-only when possible, else chmod a-w).

    Must hold: the whole ladder runs (it never writes to the landing folder),
    the tables equal a run from a writable folder, and the folder is unchanged.
    """
    folder = tmp_path / "landing-ro"
    mounted = _mount_tmpfs(folder, "16m")
    try:
        write_batch(folder, "a", [listing(n) for n in range(30)] + ["{broken"], landed=1e9)
        write_batch(folder, "b", [listing(n, crawl_id="b") for n in range(20, 50)], landed=1e9 + 60, gz=True)
        before = sorted((p.name, p.stat().st_mtime, p.stat().st_size) for p in folder.iterdir())
        if mounted:
            assert subprocess.run(["mount", "-o", "remount,ro", str(folder)], capture_output=True).returncode == 0
            with pytest.raises(OSError):
                (folder / "probe").write_text("x")
        else:
            for path in (folder, *folder.iterdir()):
                path.chmod(0o555 if path.is_dir() else 0o444)
        for key in ("a", "b"):
            run_ladder(warehouse, folder, key)
        assert sorted((p.name, p.stat().st_mtime, p.stat().st_size) for p in folder.iterdir()) == before
        expected = clean_run(tmp_path, folder, ["a", "b"])
        assert snapshot(warehouse.engine) == expected
    finally:
        if mounted:
            _umount(folder)
        elif folder.exists():
            folder.chmod(0o755)


def test_an_unreadable_batch_file_is_a_clear_error(tmp_path):
    """Breaks: a registered batch file loses its read permission (mode 000; run without root's override).

    Must hold: re-materialising the raw or the canonical rung fails with an
    error that names the problem, and the partition stays exactly as it was.
    """
    folder, url = tmp_path / "landing", f"sqlite:///{tmp_path / 'w.sqlite'}"
    path = write_batch(folder, "locked", [listing(n) for n in range(20)] + ["{broken"], landed=1e9)
    assert "error" not in run_worker("ladder", url, str(folder), "locked", "--rungs", "raw,canonical")
    warehouse = Warehouse(url)
    before = partition_state(warehouse.engine, "locked")
    path.chmod(0o000)
    try:
        raw = run_worker("ladder", url, str(folder), "locked", "--rungs", "raw", drop_root_rights=True)
        canonical = run_worker("ladder", url, str(folder), "locked", "--rungs", "canonical", drop_root_rights=True)
    finally:
        path.chmod(0o644)
    assert raw == {"error": "BatchFileError", "message": f"batch file {path} is not readable"}
    assert canonical["error"] in ("BatchFileError", "PermissionError") and str(path) in canonical["message"]
    assert partition_state(warehouse.engine, "locked") == before
    warehouse.dispose()


def _limit_sqlite_pages(engine, pages: int) -> None:
    @event.listens_for(engine, "connect")
    def _limit(dbapi_connection, _record):
        dbapi_connection.execute(f"PRAGMA max_page_count = {pages}")


def test_a_full_disk_under_the_embedded_warehouse(small_disk, tmp_path):
    """Breaks: the disk holding the embedded SQLite warehouse fills up (a 16 MiB tmpfs filled to the brim, or
    SQLite's page limit where mounting is not allowed) during the canonical rung, then during the exact rung.

    Must hold: each rung fails with SQLite's "database or disk is full"; the
    canonical partition is untouched (one transaction) and the exact rung
    leaves whole chunks only; once space is freed, re-running gives one clean run's tables.
    """
    disk, mounted = small_disk
    folder = tmp_path / "landing"
    write_batch(folder, "big", [listing(n, description=listing(n)["description"] * 4) for n in range(600)], landed=1e9)
    warehouse = Warehouse(f"sqlite:///{disk / 'warehouse.sqlite'}").create_schema()
    ingest_raw_batch(warehouse, find_batch(folder, "big"))
    with warehouse.engine.connect() as conn:
        pages = conn.exec_driver_sql("PRAGMA page_count").scalar()
    if mounted:
        filler = fill(disk, leave=64 * 1024)
    else:
        _limit_sqlite_pages(warehouse.engine, pages + 16)
        warehouse.engine.dispose()
    with pytest.raises(DISK_FULL, match="database or disk is full"):
        canonicalise_batch(warehouse, "big", SETTINGS)
    assert count(warehouse.engine, canonical_records) == 0

    if mounted:
        filler.unlink()
        canonicalise_batch(warehouse, "big", SETTINGS)
        filler = fill(disk, leave=96 * 1024)
    else:
        warehouse.dispose()
        warehouse = Warehouse(warehouse.url)
        canonicalise_batch(warehouse, "big", SETTINGS)
        with warehouse.engine.connect() as conn:
            pages = conn.exec_driver_sql("PRAGMA page_count").scalar()
        _limit_sqlite_pages(warehouse.engine, pages + 24)
        warehouse.engine.dispose()
    with pytest.raises(DISK_FULL, match="database or disk is full"):
        deduplicate_batch(warehouse, "big", "run-big", SETTINGS)
    from dedup_pipeline.store.schema import dedup_decisions, records

    logged = count(warehouse.engine, dedup_decisions)
    assert logged % SETTINGS.chunk_size == 0 and logged < 600  # whole chunks only
    assert count(warehouse.engine, records) == logged

    if mounted:
        filler.unlink()
    else:
        warehouse.dispose()
        warehouse = Warehouse(warehouse.url)
    deduplicate_batch(warehouse, "big", "run-big", SETTINGS)
    from dedup_pipeline.ladder.near import cluster_batch
    from dedup_pipeline.ladder.settings import NearSettings
    from dedup_pipeline_tests.reliability.ladder_run import NEAR

    cluster_batch(warehouse, "big", NearSettings(params=NEAR, chunk_size=SETTINGS.chunk_size))
    assert snapshot(warehouse.engine) == clean_run(tmp_path, folder, ["big"])
    warehouse.dispose()


def test_a_full_disk_under_the_bloom_seen_set(warehouse, small_disk, tmp_path):
    """Breaks: the Bloom seen-set cannot save its filter file (no space left on the device).

    Must hold: the exact rung still succeeds (the seen-set is only a fast
    path: it fails open), reports the fallback, and stores every record.
    """
    disk, mounted = small_disk
    folder = tmp_path / "landing"
    write_batch(folder, "a", [listing(n) for n in range(50)], landed=1e9)
    seen = BloomSeenSet(disk / "seen-sets", capacity=200_000, error_rate=0.001)
    if mounted:
        fill(disk)
    else:  # the filter's temporary file is written through a symlink to /dev/full: ENOSPC
        seen.folder.mkdir(parents=True)
        temporary = seen._path("content/1").with_suffix(f".{os.getpid()}.tmp")
        temporary.symlink_to("/dev/full")
    reports = run_ladder(warehouse, folder, "a", seen_set=seen)
    assert reports.exact.decisions == {"new": 50}
    assert reports.exact.seen_set_fallbacks >= 1
    assert not list(seen.folder.glob("*.bloom"))  # nothing half-written was left as the filter


def test_the_sensor_leaves_a_batch_that_is_still_being_written(tmp_path):
    """Breaks: a crawler is still writing a batch file (modified within the settle time), or writes it under a
    hidden temporary name.

    Must hold: the landing sensor adds no partition and requests no run for
    it; once the file has settled it adds exactly that partition.
    """
    folder = tmp_path / "landing"
    folder.mkdir()
    (folder / ".late.jsonl.part").write_text(json.dumps(listing(1)) + "\n")
    path = write_batch(folder, "late", [listing(n) for n in range(5)])
    instance = dg.DagsterInstance.ephemeral()
    resources = {"landing": LandingResource(folder=str(folder), settle_seconds=5)}
    with dg.build_sensor_context(instance=instance, resources=resources) as context:
        result = landing_sensor(context)
    assert not result.run_requests and not result.dynamic_partitions_requests
    settled = time.time() - 10
    os.utime(path, (settled, settled))
    with dg.build_sensor_context(instance=instance, resources=resources) as context:
        result = landing_sensor(context)
    assert [r.partition_key for r in result.run_requests] == ["late"]
    assert [list(r.partition_keys) for r in result.dynamic_partitions_requests] == [["late"]]


def test_files_that_cannot_be_batches_are_named_with_the_reason(tmp_path):
    """Breaks: files a crawler meant as batches but whose names no partition key can take, beside real batches.

    Must hold: each is listed as ignored with why (suffix or name), hidden files and folders are passed over
    silently, a fresh batch is unsettled (not ignored), and the batches are found as before.
    """
    from dedup_pipeline.landing import BAD_KEY, NOT_A_BATCH, scan_landing

    folder = tmp_path / "landing"
    for name in (
        "ok.jsonl",
        "2026-11-09 shop-a.jsonl",
        "café.jsonl",
        "_x.jsonl",
        "x" * 201 + ".jsonl",
        "x\n.jsonl",  # Breaks: "$" of the key pattern matched before a final newline: a key holding one
        "x.JSONL",
        "x.jsonl.GZ",
        "x.json",
        "notes.txt",
        ".hidden.jsonl.part",
    ):
        write_batch(folder, name.removesuffix(".jsonl"), [listing(1)], landed=1e9) if name.endswith(".jsonl") else (
            folder / name
        ).write_text("{}\n")
    (folder / "sub.jsonl").mkdir()
    fresh = write_batch(folder, "fresh", [listing(2)])
    scan = scan_landing(folder, settle_seconds=5)
    assert [b.key for b in scan.batches] == ["ok"] and [b.path for b in scan.unsettled] == [fresh]
    assert dict(scan.ignored) == {
        "2026-11-09 shop-a.jsonl": BAD_KEY,
        "café.jsonl": BAD_KEY,
        "_x.jsonl": BAD_KEY,
        "x" * 201 + ".jsonl": BAD_KEY,
        "x\n.jsonl": BAD_KEY,
        "x.JSONL": NOT_A_BATCH,
        "x.jsonl.GZ": NOT_A_BATCH,
        "x.json": NOT_A_BATCH,
        "notes.txt": NOT_A_BATCH,
    }
    notices = scan.notices(5)
    assert notices[0].startswith("not yet: fresh.jsonl was modified ") and "less than the 5 s" in notices[0]
    assert "ignored: notes.txt: not a batch file: batch names end in .json.gz, .jsonl, " in "\n".join(notices)


def test_two_files_of_one_batch_key_set_aside_only_that_key(tmp_path, capfd):
    """Breaks: the landing folder holds files that map to one batch key (x.jsonl, x.jsonl.gz, x.ndjson; y.jsonl
    beside a y.ndjson still being written), beside a good batch.

    Must hold: neither key is taken and each is named with the files that collide, by the scan, the sensor and
    the catch-up schedule alike; the good batch goes on as usual; materialising an ambiguous partition fails
    with one line naming the files, never reading one of them.
    """
    from dedup_pipeline.defs.alerts import error_summary
    from dedup_pipeline.defs.assets import raw_crawl_batches
    from dedup_pipeline.defs.partitions import crawl_batches_partitions
    from dedup_pipeline.defs.resources import WarehouseResource
    from dedup_pipeline.defs.schedules import ladder_catch_up
    from dedup_pipeline.landing import scan_landing

    folder = tmp_path / "landing"
    write_batch(folder, "ok", [listing(1)], landed=1e9)
    for name in ("x.jsonl", "x.jsonl.gz", "x.ndjson", "y.jsonl"):
        (folder / name).write_text(json.dumps(listing(2)) + "\n")
        os.utime(folder / name, (1e9, 1e9))
    (folder / "y.ndjson").write_text(json.dumps(listing(3)) + "\n")  # modified now: still being written
    scan = scan_landing(folder, settle_seconds=5)
    assert [b.key for b in scan.batches] == ["ok"] and not scan.unsettled
    notices = scan.notices(5)
    assert any(all(name in n for name in ("'x'", "x.jsonl,", "x.jsonl.gz", "x.ndjson")) for n in notices), notices
    assert any("'y'" in n and "y.jsonl" in n and "y.ndjson" in n for n in notices), notices

    with pytest.raises(BatchFileError) as error:
        find_batch(folder, "x")
    assert "x.jsonl" in str(error.value) and "x.jsonl.gz" in str(error.value) and "\n" not in str(error.value)
    assert find_batch(folder, "ok").path.name == "ok.jsonl"

    resources = {"landing": LandingResource(folder=str(folder), settle_seconds=5)}
    with dg.instance_for_test() as instance:  # the schedule needs an instance with a ref
        with dg.build_sensor_context(instance=instance, resources=resources) as context:
            result = landing_sensor(context)
        assert [r.partition_key for r in result.run_requests] == ["ok"]
        assert [list(r.partition_keys) for r in result.dynamic_partitions_requests] == [["ok"]]
        assert "landing batch x set aside: 3 files map to it (x.jsonl, x.jsonl.gz, x.ndjson)" in capfd.readouterr().err
        tick = datetime.now(UTC)
        with dg.build_schedule_context(
            instance=instance, resources=resources, scheduled_execution_time=tick
        ) as context:
            assert [r.partition_key for r in ladder_catch_up(context)] == ["ok"]

        instance.add_dynamic_partitions(crawl_batches_partitions.name, ["x"])  # registered before x.jsonl.gz came
        result = dg.materialize(
            [raw_crawl_batches],
            partition_key="x",
            instance=instance,
            raise_on_error=False,
            resources={
                **resources,
                "ladder": LadderResource(),
                "warehouse": WarehouseResource(database_url=f"sqlite:///{tmp_path / 'w.sqlite'}"),
            },
        )
        [failure] = result.get_step_failure_events()
        message = error_summary(failure.step_failure_data.error)
        assert message.startswith("BatchFileError: batch 'x' ") and "x.jsonl, x.jsonl.gz, x.ndjson" in message, message


def test_a_batch_file_that_changes_after_the_raw_rung_is_refused(warehouse, tmp_path):
    """Breaks: the batch file grows (a crawler appends) between the raw and the canonical rung.

    Must hold: the canonical rung refuses it with a clear error (SHA-256 no
    longer matches the registration) and writes nothing; re-materialising
    the raw rung then lets the ladder take the whole file.
    """
    folder = tmp_path / "landing"
    path = write_batch(folder, "grow", [listing(n) for n in range(10)], landed=1e9)
    ingest_raw_batch(warehouse, find_batch(folder, "grow"))
    before = partition_state(warehouse.engine, "grow")
    with open(path, "ab") as handle:
        handle.write(b"{broken\n" + json.dumps(listing(10)).encode() + b"\n")
    with pytest.raises(BatchFileError, match="changed since it was registered: re-materialise raw_crawl_batches"):
        canonicalise_batch(warehouse, "grow", SETTINGS)
    assert partition_state(warehouse.engine, "grow") == before
    reports = run_ladder(warehouse, folder, "grow")
    assert (reports.raw.lines, reports.raw.quarantined, reports.exact.decisions["new"]) == (12, 1, 11)


def _growing_iter_lines(extra: bytes, when: str):
    """iter_lines, except that a crawler appends `extra` to the file just `before` the rung's first read or just
    `after` its last one (the two windows a check outside the read cannot see)."""

    def hooked(path, *args, **kwargs):
        if when == "before":
            _append(path, extra)
        yield from iter_lines(path, *args, **kwargs)
        if when == "after":
            _append(path, extra)

    return hooked


def _append(path: Path, extra: bytes) -> None:
    with open(path, "ab") as handle:
        handle.write(extra)


@pytest.mark.parametrize("rung, when", [("raw", "after"), ("canonical", "before")])
def test_a_batch_file_that_changes_while_a_rung_reads_it(warehouse, tmp_path, monkeypatch, rung, when):
    """Breaks: the batch file grows while a rung reads it: right after the raw rung's last read (before it
    registers the file), or right after the canonical rung's up-front SHA-256 check (before its first read).

    Must hold: the registration describes exactly the bytes the raw rung
    read, and the canonical rung refuses to write rows from bytes that are not
    the registered ones (clear error, partition untouched); no line is
    silently dropped: after re-materialising, every line of the final file is
    stored or quarantined.
    """
    folder = tmp_path / "landing"
    lines = [json.dumps(listing(n)).encode() for n in range(6)]
    path = write_batch(folder, "race", lines, landed=1e9)
    extra = b"{broken appended line\n" + json.dumps(listing(99)).encode() + b"\n"
    module = raw_rung if rung == "raw" else canonical_rung
    if rung == "canonical":
        ingest_raw_batch(warehouse, find_batch(folder, "race"))
    monkeypatch.setattr(module, "iter_lines", _growing_iter_lines(extra, when))
    if rung == "raw":
        report = ingest_raw_batch(warehouse, find_batch(folder, "race"))
        assert (report.lines, report.file_bytes) == (6, sum(len(line) + 1 for line in lines))
        monkeypatch.undo()
    before = partition_state(warehouse.engine, "race")
    with pytest.raises(BatchFileError, match="re-materialise raw_crawl_batches"):
        canonicalise_batch(warehouse, "race", SETTINGS)
    monkeypatch.undo()
    assert partition_state(warehouse.engine, "race") == before
    reports = run_ladder(warehouse, folder, "race")
    assert (reports.raw.lines, reports.raw.quarantined, reports.canonical.canonical) == (8, 1, 7)
    assert set(quarantined_lines(warehouse.engine, "race")) | set(canonical_lines(warehouse.engine, "race")) == set(
        range(1, 9)
    )
    assert path.stat().st_size == reports.raw.file_bytes
