"""The canonical rung in the step's process against worker processes, on PostgreSQL, in one run.

    python benchmarks/bench_canonical_workers.py [--records 25000,50000,100000] [--repeat 3] [--workers N]

`--workers` defaults to the CPUs this process may use (`available_cpus`).

For each size, one batch file of N records (half exact re-crawls) is registered
once (the raw rung); then `canonicalise_batch` (read the file, parse,
canonicalise, hash both versions, COPY into `canonical_records`, one
transaction) is run over it with `canonical_workers=1` (inline, the baseline)
and with `--workers` processes, alternating, each going first on every other
repeat. Every size goes through the workers, below `PARALLEL_FLOOR` too (the
floor is lifted for the measurement), so the figures show where the floor
belongs. Each run rewrites the partition whole, and the table's content is
checked identical (an md5 over every row) before any figure is printed.

Printed per size and setting: median wall seconds, records/s, and the CPU
seconds of this process and of its worker processes (forked from a fork
server, a child of this process, which reaps them: their CPU is read from its
/proc entry; the database server's is not counted); then the median of the
per-repeat ratios inline / workers. Spreading the work adds the pickling of
chunks and rows and a pipeline that fills and drains, so the speed-up depends
on the batch's size and on free cores.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sqlalchemy import text  # noqa: E402

from benchmarks.common import at_least_one, crawl_with_duplicates, process_cpu, scratch_database, write_jsonl  # noqa: E402
from dedup_pipeline.core.parallel import available_cpus  # noqa: E402
from dedup_pipeline.ladder import canonical  # noqa: E402
from dedup_pipeline.ladder.canonical import canonicalise_batch  # noqa: E402
from dedup_pipeline.ladder.raw import ingest_raw_batch  # noqa: E402
from dedup_pipeline.ladder.settings import LadderSettings  # noqa: E402
from dedup_pipeline.landing import find_batch  # noqa: E402
from dedup_pipeline.store.warehouse import Warehouse  # noqa: E402

_CONTENT = text(
    "SELECT count(*), md5(string_agg(line_no || natural_key || hashes::text || hash_errors::text || payload::text"
    " || coalesce(crawled_at::text, ''), ',' ORDER BY line_no)) FROM canonical_records WHERE batch_id = 'crawl'"
)


def children_cpu() -> float:
    """CPU seconds of this process's children: those it reaped, and what its live ones (the fork server) used
    and reaped of their own (the workers forked from it)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    live = Path(f"/proc/{os.getpid()}/task/{os.getpid()}/children").read_text().split()
    return usage.ru_utime + usage.ru_stime + sum(process_cpu(int(pid), reaped_children=True) for pid in live)


def timed_run(warehouse: Warehouse, settings: LadderSettings) -> tuple[float, float, float, int, tuple]:
    """(wall s, this process's CPU s, workers' CPU s, workers used, table content) of one canonical rung."""
    cpu, children, wall = time.process_time(), children_cpu(), time.perf_counter()
    report = canonicalise_batch(warehouse, "crawl", settings)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    time.sleep(0.1)  # the fork server reaps its ended workers on their signal
    children = children_cpu() - children
    with warehouse.engine.connect() as conn:
        content = tuple(conn.execute(_CONTENT).one())
    return wall, cpu, children, report.workers, content


def measure(size: int, args: argparse.Namespace) -> None:
    """Inline against `args.workers` workers on a batch of `size` records: the figures of one size."""
    folder = Path(tempfile.mkdtemp(prefix="bench-canonical-workers-"))
    write_jsonl(crawl_with_duplicates(size, 0.5), folder / "crawl.jsonl")
    os.utime(folder / "crawl.jsonl", (1e9, 1e9))
    settings = {n: LadderSettings(chunk_size=args.chunk, canonical_workers=n) for n in (1, args.workers)}
    runs: dict[int, list[tuple]] = {n: [] for n in settings}
    with scratch_database() as url:
        warehouse = Warehouse(url).create_schema()
        ingest_raw_batch(warehouse, find_batch(folder, "crawl"))
        for repeat in range(args.repeat):
            order = list(settings) if repeat % 2 == 0 else list(settings)[::-1]
            for n in order:
                runs[n].append(timed_run(warehouse, settings[n]))
        warehouse.dispose()
    contents = {run[4] for values in runs.values() for run in values}
    assert len(contents) == 1, f"the workers wrote other rows than the inline rung: {contents}"
    assert runs[args.workers][0][3] == args.workers, "the batch did not go through the worker processes"

    print(
        f"canonical rung, {size:,} records (50% exact re-crawls), chunks of {args.chunk}, "
        f"{args.repeat} repeats, {available_cpus()} CPUs; identical rows ({next(iter(contents))[0]:,})"
    )
    for n, values in runs.items():
        wall = statistics.median(v[0] for v in values)
        label = "inline (canonical_workers=1)" if n == 1 else f"{n} worker processes"
        print(
            f"  {label:30s} {wall:6.2f} s  {size / wall:>9,.0f} rec/s   CPU: this process "
            f"{statistics.median(v[1] for v in values):5.2f} s, "
            f"workers {statistics.median(v[2] for v in values):5.2f} s"
        )
    ratio = statistics.median(a[0] / b[0] for a, b in zip(runs[1], runs[args.workers]))
    print(f"  inline / workers: {ratio:4.2f}x (median of the per-repeat ratios)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", default="25000,50000,100000", help="batch sizes, comma-separated")
    parser.add_argument("--repeat", type=at_least_one, default=3)
    parser.add_argument("--workers", type=at_least_one, default=available_cpus())
    parser.add_argument("--chunk", type=at_least_one, default=5000)
    args = parser.parse_args()
    sizes = [int(size) for size in args.records.split(",")]
    if args.workers < 2 or min(sizes) <= args.chunk:
        parser.error("--workers must be at least 2, and every size larger than --chunk")
    floor, canonical.PARALLEL_FLOOR = canonical.PARALLEL_FLOOR, 0  # measured at every size, the floor's own too
    print(f"load average {os.getloadavg()[0]:.1f}; the rung's PARALLEL_FLOOR is {floor:,} lines")
    for size in sizes:
        measure(size, args)
    print(f"load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
