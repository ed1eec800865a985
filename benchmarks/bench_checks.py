"""What the per-batch asset checks cost, next to the rung they follow, on SQLite and PostgreSQL, in one run.

    python benchmarks/bench_checks.py [--records 2000] [--batches 4 16] [--repeat 5] [--backend both]

For each warehouse size (a number of batches of `--records` records, 30 % of
them exact re-crawls within the batch), the ladder's first three rungs run over every batch,
then each check's work is timed on the last batch (median of `--repeat`):
- baseline: re-canonicalising the batch (the `canonical_records` rung, idempotent);
- integrity, scoped: `check_batch_integrity` (the rows the batch wrote, compared
  with the whole warehouse through the unique indexes), what the check runs;
- integrity, whole warehouse: the same invariants as GROUP BY ... HAVING over
  every row, the naive alternative the scoping avoids;
- collapse history: the trailing 20 batches' first decisions from the decision log;
- quarantine rate, funnel queries, the funnel PNG;
- the Great Expectations suites (frame load + validation, the import excluded:
  it is paid once per step process and printed separately).
Ratios are against the baseline rung. The scoped integrity check should stay
flat as the warehouse grows; the whole-warehouse scan grows with it.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sqlalchemy import func, or_, select  # noqa: E402

from benchmarks.common import at_least_one, crawl_with_duplicates, median, scratch_database, timed, write_jsonl  # noqa: E402
from dedup_pipeline.core.hashing import HASH_RULES  # noqa: E402
from dedup_pipeline.defs.plots import funnel_png  # noqa: E402
from dedup_pipeline.ladder.canonical import canonicalise_batch  # noqa: E402
from dedup_pipeline.ladder.exact import deduplicate_batch  # noqa: E402
from dedup_pipeline.ladder.raw import ingest_raw_batch  # noqa: E402
from dedup_pipeline.ladder.settings import LadderSettings  # noqa: E402
from dedup_pipeline.landing import find_batch  # noqa: E402
from dedup_pipeline.quality import expectations, frames  # noqa: E402
from dedup_pipeline.quality.figures import STAGES, batch_funnel  # noqa: E402
from dedup_pipeline.quality.history import batch_rates  # noqa: E402
from dedup_pipeline.quality.integrity import check_batch_integrity  # noqa: E402
from dedup_pipeline.quality.quarantine import quarantine_report  # noqa: E402
from dedup_pipeline.store.schema import records  # noqa: E402
from dedup_pipeline.store.warehouse import Warehouse, active_hash_version  # noqa: E402

SETTINGS = LadderSettings(chunk_size=2000)


def whole_warehouse_integrity(conn) -> int:
    """The naive check: every invariant over every row (what the scoped check avoids)."""
    r = records.c
    dup_content = (
        select(r.hash_version, r.content_hash).group_by(r.hash_version, r.content_hash).having(func.count() > 1)
    )
    dup_keys = select(r.natural_key).group_by(r.natural_key).having(func.count() > 1)
    bad = (
        select(func.count())
        .select_from(records)
        .where(or_(func.length(r.content_hash) != 32, r.hash_version.not_in(sorted(HASH_RULES))))
    )
    return len(conn.execute(dup_content).all()) + len(conn.execute(dup_keys).all()) + conn.execute(bad).scalar_one()


def build(url: str, folder: Path, batches: int, size: int) -> tuple[Warehouse, list[str]]:
    warehouse = Warehouse(url).create_schema()
    keys = []
    for b in range(batches):
        key = f"batch-{b:03d}"
        crawl = crawl_with_duplicates(size, 0.3, seed=b)
        for record in crawl:  # products of their own per batch, so the warehouse grows with the batches
            record["url"] = record["url"].replace("/p/", f"/p/{b}-")
        path = write_jsonl(crawl, folder / f"{key}.jsonl")
        mtime = 1_700_000_000 + b * 3600
        os.utime(path, (mtime, mtime))
        ingest_raw_batch(warehouse, find_batch(folder, key))
        canonicalise_batch(warehouse, key, SETTINGS)
        deduplicate_batch(warehouse, key, f"run-{key}", SETTINGS)
        keys.append(key)
    return warehouse, keys


def measure(warehouse: Warehouse, key: str, repeat: int) -> dict[str, float]:
    def each(fn):
        return median([timed(fn)[0] for _ in range(repeat)])

    def connected(fn):
        def run():
            with warehouse.engine.connect() as conn:
                return fn(conn)

        return run

    def canonical_suite():
        with warehouse.engine.connect() as conn:
            frame = frames.canonical_frame(conn, key, active_hash_version(conn))
            expected = frames.expected_canonical_rows(conn, key)
        report = expectations.validate(frame, "canonical_records", expectations.canonical_suite(expected))
        assert report.success, report.markdown()

    def records_suite():
        with warehouse.engine.connect() as conn:
            frame = frames.records_frame(conn, key)
        report = expectations.validate(frame, "deduplicated_records", expectations.deduplicated_suite())
        assert report.success, report.markdown()

    with warehouse.engine.connect() as conn:
        funnel = batch_funnel(conn, key)
    stages = [(label, funnel[k]) for k, label in STAGES]
    return {
        "baseline: canonical rung": each(lambda: canonicalise_batch(warehouse, key, SETTINGS)),
        "integrity, scoped to the batch": each(connected(lambda c: check_batch_integrity(c, key))),
        "integrity, whole warehouse": each(connected(whole_warehouse_integrity)),
        "collapse history (20 batches)": each(connected(lambda c: batch_rates(c, key, 20))),
        "quarantine rate": each(connected(lambda c: quarantine_report(c, key))),
        "funnel queries": each(connected(lambda c: batch_funnel(c, key))),
        "funnel PNG": each(lambda: funnel_png(stages, key)),
        "GE suite, canonical_records": each(canonical_suite),
        "GE suite, deduplicated_records": each(records_suite),
    }


def report(backend: str, batches: int, size: int, warehouse: Warehouse, figures: dict[str, float]) -> None:
    with warehouse.engine.connect() as conn:
        rows = conn.execute(select(func.count()).select_from(records)).scalar_one()
    base = figures["baseline: canonical rung"]
    print(f"\n{backend}: {batches} batches x {size} records, {rows} warehouse rows; last batch timed")
    print(f"  {'operation':34s} {'median ms':>10s} {'x baseline':>10s}")
    for name, seconds in figures.items():
        print(f"  {name:34s} {seconds * 1000:10.1f} {seconds / base:10.2f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=at_least_one, default=2000, help="records per batch")
    parser.add_argument("--batches", type=at_least_one, nargs="+", default=[4, 16], help="warehouse sizes, in batches")
    parser.add_argument("--repeat", type=at_least_one, default=5)
    parser.add_argument("--backend", choices=["sqlite", "postgresql", "both"], default="both")
    args = parser.parse_args()

    start = time.perf_counter()
    import great_expectations  # noqa: F401  (what each GE check step pays once)

    print(f"great_expectations import: {time.perf_counter() - start:.1f} s (once per step process)")
    expectations.validate(frames.pd.DataFrame({"line_no": [1]}), "warm", [])  # first context: not timed

    backends = ["sqlite", "postgresql"] if args.backend == "both" else [args.backend]
    scaling: dict[str, list[tuple[int, float, float]]] = {}
    for backend in backends:
        for batches in args.batches:
            with tempfile.TemporaryDirectory(prefix="bench-checks-") as tmp:
                folder = Path(tmp) / "landing"
                if backend == "sqlite":
                    warehouse, keys = build(f"sqlite:///{tmp}/w.sqlite", folder, batches, args.records)
                    figures = measure(warehouse, keys[-1], args.repeat)
                    report(backend, batches, args.records, warehouse, figures)
                    warehouse.dispose()
                else:
                    with scratch_database() as url:
                        warehouse, keys = build(url, folder, batches, args.records)
                        figures = measure(warehouse, keys[-1], args.repeat)
                        report(backend, batches, args.records, warehouse, figures)
                        warehouse.dispose()
            scaling.setdefault(backend, []).append(
                (batches, figures["integrity, scoped to the batch"], figures["integrity, whole warehouse"])
            )

    print("\nintegrity check as the warehouse grows (median ms): scoped vs whole warehouse")
    for backend, points in scaling.items():
        for batches, scoped, whole in points:
            print(
                f"  {backend:10s} {batches:3d} batches: scoped {scoped * 1000:8.1f}  whole {whole * 1000:8.1f}  "
                f"whole/scoped {whole / scoped:6.2f}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
