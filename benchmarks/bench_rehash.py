"""Backfill rate of the rehash migration on PostgreSQL, against a row-at-a-time UPDATE in the same run.

Usage::

    python benchmarks/bench_rehash.py [--rows 100000] [--baseline-rows 20000] [--repeat 3] [--chunk 5000]

A fresh PostgreSQL database (``$DEDUP_TEST_PG_URL``'s server, default
``postgresql+psycopg://postgres@127.0.0.1:5432/test``) gets ``--rows`` rows
as a pipeline that only knew ``content/1`` would have stored them (the test
suite's generator and bulk loader: a mirror copy every 40 rows, a price
``content/2`` cannot read every 97, a missing seller every 101). It is
dropped at the end.

Each round, after removing every ``content/2`` digest (and a VACUUM ANALYZE,
so both sides start from the same table state):

- **rehash**: `dedup_pipeline.ladder.rehash.backfill`, all sixteen shards in
  turn, as the Dagster backfill runs them: keyset pages of ``--chunk`` rows,
  one SELECT and one multi-row INSERT ... ON CONFLICT DO NOTHING per page,
  pages read one ahead of the hashing.
- **row-at-a-time** (the baseline): what a migration script usually does:
  one SELECT of the rows, then per row the same hash rule and one
  ``UPDATE records SET <new column> = :digest WHERE record_id = :id``,
  committing every 1000 rows. Run over the first ``--baseline-rows`` rows
  (its rate does not depend on the table size; the whole table would take
  minutes per round).

Both must write the same digests for the baseline's rows before anything is
reported. The script prints each round, then per method the median wall rate,
the median CPU seconds per 100,000 rows of this process (client) and of the
PostgreSQL backends serving the bench database (server, read from /proc),
and rows per CPU second (client + server, as if run on one idle core), and
the median of the per-round wall-rate ratios. The machine's load average is
printed too: on a shared machine it moves the wall rates more than anything
here, while the CPU figures hardly move.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import uuid
from pathlib import Path

from sqlalchemy import create_engine, select, text

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import at_least_one  # noqa: E402
from dedup_pipeline.core.errors import RecordError  # noqa: E402
from dedup_pipeline.core.hashing import hash_rule  # noqa: E402
from dedup_pipeline.ladder.rehash import backfill  # noqa: E402
from dedup_pipeline.store.schema import record_hashes  # noqa: E402
from dedup_pipeline.store.warehouse import Warehouse  # noqa: E402
from dedup_pipeline_tests.helpers import PG_ADMIN_URL  # noqa: E402
from dedup_pipeline_tests.rehash_helpers import load_legacy_rows, migration_listing  # noqa: E402

TARGET = "content/2"


CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process on this machine (the PostgreSQL backends run here too)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


class CpuMeter:
    """CPU seconds spent by this process and by the PostgreSQL backends serving the bench database."""

    def __init__(self, admin, database: str):
        self.admin, self.database = admin, database

    def _backends(self) -> dict[int, float]:
        with self.admin.connect() as conn:
            pids = (
                conn.execute(text("SELECT pid FROM pg_stat_activity WHERE datname = :d"), {"d": self.database})
                .scalars()
                .all()
            )
        return {pid: cpu_seconds(pid) for pid in pids}

    def __enter__(self):
        self.client, self.server = time.process_time(), self._backends()
        return self

    def __exit__(self, *exc):
        after = self._backends()
        self.client_seconds = time.process_time() - self.client
        self.server_seconds = sum(cpu - self.server.get(pid, 0.0) for pid, cpu in after.items())


def reset(warehouse: Warehouse) -> None:
    with warehouse.engine.begin() as conn:
        conn.execute(record_hashes.delete().where(record_hashes.c.hash_version == TARGET))
        conn.execute(text("UPDATE records SET bench_v2 = NULL WHERE bench_v2 IS NOT NULL"))
    with warehouse.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("VACUUM ANALYZE records, record_hashes"))


def run_rehash(warehouse: Warehouse, chunk: int) -> tuple[int, float]:
    started = time.perf_counter()
    reports = backfill(warehouse, TARGET, chunk)
    seconds = time.perf_counter() - started
    rows = sum(r.hashed + r.unhashable for r in reports)
    assert all(r.complete for r in reports) and rows == reports[-1].warehouse_progress.rows
    return rows, seconds


def run_row_at_a_time(warehouse: Warehouse, limit: int) -> tuple[int, float]:
    rule = hash_rule(TARGET)
    update = text("UPDATE records SET bench_v2 = :digest WHERE record_id = :id")
    started = time.perf_counter()
    with warehouse.engine.connect() as conn:
        rows = conn.execute(
            text("SELECT record_id, payload FROM records ORDER BY record_id LIMIT :n"), {"n": limit}
        ).all()
        for done, (record_id, payload) in enumerate(rows, start=1):
            try:
                digest = bytes.fromhex(rule.digest(payload))
            except RecordError:
                digest = b""  # the baseline marks "cannot hash" with an empty value
            conn.execute(update, {"digest": digest, "id": record_id})
            if done % 1000 == 0:
                conn.commit()
        conn.commit()
    return len(rows), time.perf_counter() - started


def same_digests(warehouse: Warehouse, limit: int) -> bool:
    with warehouse.engine.connect() as conn:
        ours = dict(
            conn.execute(
                select(record_hashes.c.record_id, record_hashes.c.content_hash).where(
                    record_hashes.c.hash_version == TARGET
                )
            ).all()
        )
        theirs = conn.execute(
            text("SELECT record_id, bench_v2 FROM records ORDER BY record_id LIMIT :n"), {"n": limit}
        ).all()
    return all((ours.get(rid) or b"") == bytes(digest) for rid, digest in theirs)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=at_least_one, default=100_000)
    parser.add_argument("--baseline-rows", type=at_least_one, default=20_000)
    parser.add_argument("--repeat", type=at_least_one, default=3)
    parser.add_argument("--chunk", type=at_least_one, default=5000)
    args = parser.parse_args()
    baseline_rows = min(args.baseline_rows, args.rows)

    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    name = f"bench_rehash_{uuid.uuid4().hex[:10]}"
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    warehouse = Warehouse(PG_ADMIN_URL.rsplit("/", 1)[0] + f"/{name}").create_schema()
    try:
        started = time.perf_counter()
        want = load_legacy_rows(warehouse, [migration_listing(n) for n in range(args.rows)])
        with warehouse.engine.begin() as conn:
            conn.execute(text("ALTER TABLE records ADD COLUMN bench_v2 BYTEA"))
        print(
            f"PostgreSQL, {args.rows} stored rows ({want['unhashable']} unhashable under {TARGET}), "
            f"loaded in {time.perf_counter() - started:.1f} s; chunk {args.chunk}; "
            f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs"
        )
        ours, theirs, ratios, cpu_ours, cpu_theirs = [], [], [], [], []
        for round_no in range(1, args.repeat + 1):
            reset(warehouse)
            with CpuMeter(admin, name) as ours_cpu:
                rows, seconds = run_rehash(warehouse, args.chunk)
            rate = rows / seconds
            with CpuMeter(admin, name) as base_cpu:
                done, base_seconds = run_row_at_a_time(warehouse, baseline_rows)
            base_rate = done / base_seconds
            if not same_digests(warehouse, baseline_rows):
                raise SystemExit("the two methods wrote different digests")
            ours.append(rate)
            theirs.append(base_rate)
            ratios.append(rate / base_rate)
            cpu_ours.append((ours_cpu.client_seconds / rows * 1e5, ours_cpu.server_seconds / rows * 1e5))
            cpu_theirs.append((base_cpu.client_seconds / done * 1e5, base_cpu.server_seconds / done * 1e5))
            print(
                f"round {round_no}: rehash {rows} rows in {seconds:.2f} s = {rate:,.0f} rows/s "
                f"(CPU {ours_cpu.client_seconds:.2f} s client + {ours_cpu.server_seconds:.2f} s server); "
                f"row-at-a-time {done} rows in {base_seconds:.2f} s = {base_rate:,.0f} rows/s "
                f"(CPU {base_cpu.client_seconds:.2f} s + {base_cpu.server_seconds:.2f} s); "
                f"load average {os.getloadavg()[0]:.1f}"
            )
        print()
        print(
            f"{'method':<16}{'median rows/s':>15}{'client CPU s/100k':>19}{'server CPU s/100k':>19}"
            f"{'rows per CPU s':>16}"
        )
        for label, rates, cpu in (("rehash backfill", ours, cpu_ours), ("row-at-a-time", theirs, cpu_theirs)):
            client = statistics.median(c for c, _ in cpu)
            server = statistics.median(s for _, s in cpu)
            print(
                f"{label:<16}{statistics.median(rates):>15,.0f}{client:>19.2f}{server:>19.2f}"
                f"{1e5 / (client + server):>16,.0f}"
            )
        print(f"median ratio (wall rows/s): {statistics.median(ratios):.1f}x")
    finally:
        warehouse.dispose()
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()
    return 0


if __name__ == "__main__":
    sys.exit(main())
