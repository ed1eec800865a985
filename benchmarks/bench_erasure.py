"""What erasure costs on PostgreSQL: the tombstone check on the exact rung, and one erasure.

    python benchmarks/bench_erasure.py [--records 20000] [--tombstones 100000] [--repeat 5] [--chunk 2000]

Printed side by side, medians over `--repeat` rounds (the modes alternate
within each round, so both see the same machine load):

1. the exact rung over a staged batch of N records with no tombstone in the
   warehouse (the check is one shared lock and one SELECT of an empty
   catalogue per chunk) against the same batch with T tombstones of every
   kind, one of which (a seller) suppresses about 1% of the batch: records/s
   and the ratio;
2. the check of one chunk: `erased_positions` (the chunk's fingerprints
   screened in memory against the tombstones' 8-byte prefixes, the few that
   pass confirmed in one SELECT) against a per-record baseline (one SELECT per
   record for its fingerprints): ms per chunk and the ratio;
3. one erasure of a seller (about N/97 current records with their hashes and
   decision rows) in a warehouse of N records: seconds and rows removed.
"""

from __future__ import annotations

import argparse
import os
import secrets
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sqlalchemy import delete, insert, select  # noqa: E402

from benchmarks.common import at_least_one, crawl_with_duplicates, median, scratch_database, timed, write_jsonl  # noqa: E402
from dedup_pipeline.core import erasure as core  # noqa: E402
from dedup_pipeline.core.erasure import Subject  # noqa: E402
from dedup_pipeline.environment import TOMBSTONE_KEY_ENV  # noqa: E402
from dedup_pipeline.ladder.canonical import canonicalise_batch  # noqa: E402
from dedup_pipeline.ladder.erasure import erase_subject  # noqa: E402
from dedup_pipeline.ladder.exact import deduplicate_batch  # noqa: E402
from dedup_pipeline.ladder.raw import ingest_raw_batch  # noqa: E402
from dedup_pipeline.ladder.settings import LadderSettings  # noqa: E402
from dedup_pipeline.landing import find_batch  # noqa: E402
from dedup_pipeline.store import tombstones as store  # noqa: E402
from dedup_pipeline.store.exact import iter_canonical_chunks  # noqa: E402
from dedup_pipeline.store.schema import (  # noqa: E402
    dedup_decisions,
    erasure_scopes,
    erasure_tombstones,
    record_hashes,
    record_history,
    records,
)
from dedup_pipeline.store.warehouse import Warehouse, utcnow  # noqa: E402

ERASED_SELLER = "seller-5"


def clear_warehouse(warehouse: Warehouse) -> None:
    with warehouse.engine.begin() as conn:
        for table in (record_hashes, record_history, dedup_decisions, records):
            conn.execute(delete(table))


def seed_tombstones(warehouse: Warehouse, count: int) -> list[dict]:
    """`count` tombstones spread over every kind and scope, plus the scopes catalogue rows; returns the scopes."""
    with warehouse.engine.connect() as conn:
        kid = core.key_id(store.tombstone_key(conn))
    kinds = [
        ("natural_key", ""),
        ("canonical_url", "url/1"),
        ("field", "seller_id"),
        ("content_digest", "content/1"),
        ("content_digest", "content/2"),
    ]
    rows = [
        {
            "fingerprint": secrets.token_bytes(32),
            "kind": kinds[i % 5][0],
            "scope": kinds[i % 5][1],
            "key_id": kid,
            "erasure_id": 0,
            "created_at": utcnow(),
        }
        for i in range(count)
    ]
    with warehouse.engine.begin() as conn:
        for start in range(0, len(rows), 10_000):
            conn.execute(insert(erasure_tombstones), rows[start : start + 10_000])
    return [{"kind": kind, "scope": scope, "key_id": kid} for kind, scope in kinds]


def set_catalogue(warehouse: Warehouse, scopes: list[dict]) -> None:
    with warehouse.engine.begin() as conn:
        conn.execute(delete(erasure_scopes))
        if scopes:
            conn.execute(insert(erasure_scopes), scopes)


def per_record_check(warehouse: Warehouse, chunk) -> set[int]:
    """The baseline: the same fingerprints, one SELECT per record."""
    erased = set()
    with warehouse.engine.begin() as conn:
        catalogue = store.load_catalogue(conn)
        key = store.tombstone_key(conn)
        for position, record in enumerate(chunk):
            prints = core.record_fingerprints(
                key, catalogue, record.natural_key, record.canonical_url, record.payload, record.hashes
            )
            column = erasure_tombstones.c.fingerprint
            if conn.execute(select(column).where(column.in_(prints)).limit(1)).first() is not None:
                erased.add(position)
    return erased


def set_based_check(warehouse: Warehouse, chunk) -> set[int]:
    with warehouse.engine.begin() as conn:
        return store.erased_positions(conn, chunk)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=at_least_one, default=20_000)
    parser.add_argument("--tombstones", type=at_least_one, default=100_000)
    parser.add_argument("--repeat", type=at_least_one, default=5)
    parser.add_argument("--chunk", type=at_least_one, default=2000)
    args = parser.parse_args()
    os.environ.setdefault(TOMBSTONE_KEY_ENV, secrets.token_hex(32))
    settings = LadderSettings(chunk_size=args.chunk)
    with scratch_database() as url, tempfile.TemporaryDirectory() as folder:
        warehouse = Warehouse(url).create_schema()
        batch = write_jsonl(crawl_with_duplicates(args.records, duplicate_share=0.0), Path(folder) / "bench.jsonl")
        ingest_raw_batch(warehouse, find_batch(batch.parent, "bench"))
        canonicalise_batch(warehouse, "bench", settings)
        scopes = seed_tombstones(warehouse, args.tombstones)
        with warehouse.engine.connect() as conn:
            chunk = next(iter_canonical_chunks(conn, "bench", args.chunk))

        plain, checked, erasures, removed = [], [], [], 0
        one_query, per_record = [], []
        for round_no in range(args.repeat):
            clear_warehouse(warehouse)
            set_catalogue(warehouse, [])
            canonicalise_batch(warehouse, "bench", settings)  # the check drops suppressed lines' staged rows
            seconds, report = timed(deduplicate_batch, warehouse, "bench", f"plain-{round_no}", settings)
            assert report.decisions["new"] == args.records
            plain.append(args.records / seconds)

            seconds, result = timed(
                erase_subject, warehouse, Subject.parse("field", ERASED_SELLER, field="seller_id"), "bench"
            )
            erasures.append(seconds)
            removed = result.removed["records"]

            clear_warehouse(warehouse)
            canonicalise_batch(warehouse, "bench", settings)  # the erasure dropped the seller's staged rows
            set_catalogue(warehouse, scopes)  # seller_id is among them: the erased seller is checked
            seconds, report = timed(deduplicate_batch, warehouse, "bench", f"checked-{round_no}", settings)
            assert report.decisions["erased"] == removed, (report.decisions, removed)
            checked.append(args.records / seconds)

            seconds, fast = timed(set_based_check, warehouse, chunk)
            one_query.append(seconds * 1000)
            seconds, slow = timed(per_record_check, warehouse, chunk)
            per_record.append(seconds * 1000)
            assert fast == slow
        warehouse.dispose()

    print(f"records={args.records} tombstones={args.tombstones} chunk={args.chunk} repeat={args.repeat}")
    print("1. exact rung, records/s (median)")
    print(f"   no tombstones            {median(plain):>10,.0f}")
    print(
        f"   {args.tombstones:,} tombstones     {median(checked):>10,.0f}   "
        f"ratio {median(checked) / median(plain):.2f} (1% of the batch erased)"
    )
    print(f"2. tombstone check of one chunk of {len(chunk)} records, ms (median)")
    print(f"   erased_positions         {median(one_query):>10.1f}")
    print(
        f"   per record (baseline)    {median(per_record):>10.1f}   ratio {median(per_record) / median(one_query):.1f}x"
    )
    print(f"3. erasure of one seller ({removed} current records of {args.records}): {median(erasures):.3f} s (median)")


if __name__ == "__main__":
    main()
