"""One run of the ladder as the daemon launches it: in process (the project's executor) against a process per step.

    python benchmarks/bench_run_process.py                     # 10,000 lines, 3 rounds
    python benchmarks/bench_run_process.py --records 2000 --rounds 5

A run launched from the UI, a sensor or a schedule is a run worker process executing the job's steps with the
job's executor. This benchmark runs one batch (`bench_e2e.py`'s crawl, typical density) through the whole
`dedup_ladder` job, every rung and check, with `dagster job execute` (a new process, as the run worker is) on a
fresh PostgreSQL database and Dagster home each time, twice a round, alternating:
- in process: the code location `dedup_pipeline.definitions` as it is (`in_process_executor`: one process);
- a process per step: the same assets, checks and resources on Dagster's default `multiprocess_executor`
  (`benchmarks/multiprocess_location.py`), which starts a process per step, each loading the code location and,
  for the check steps, Great Expectations.
Printed: the medians of wall time and CPU time (the run's process and its children: user + system), per round
and their ratio.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.bench_e2e import REPO, write_crawl  # noqa: E402
from benchmarks.common import at_least_one, scratch_database  # noqa: E402

DAGSTER = str(Path(sys.executable).with_name("dagster"))
LOCATIONS = {"in process": "dedup_pipeline.definitions", "a process per step": "benchmarks.multiprocess_location"}


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_once(module: str, batch: Path, database_url: str, home: Path) -> tuple[float, float]:
    """(wall, CPU) seconds of one `dagster job execute` of the ladder over `batch`, checked to have succeeded."""
    home.mkdir(parents=True)
    (home / "dagster.yaml").write_text((REPO / "dagster.yaml").read_text())
    env = {**os.environ, "DAGSTER_HOME": str(home), "DEDUP_DATABASE_URL": database_url}
    env["DEDUP_DATA_DIR"] = str(home / "data")
    key = batch.name.removesuffix(".jsonl")
    setup = (
        "import dagster as dg\n"
        "from dedup_pipeline.store.warehouse import Warehouse\n"
        "Warehouse().create_schema()\n"
        f"dg.DagsterInstance.get().add_dynamic_partitions('crawl_batches', [{key!r}])\n"
    )
    subprocess.run([sys.executable, "-c", setup], env=env, cwd=REPO, check=True)
    config = home / "run.yaml"
    config.write_text(f"resources:\n  landing:\n    config:\n      folder: {batch.parent}\n")
    command = [DAGSTER, "job", "execute", "-m", module, "-j", "dedup_ladder", "-c", str(config)]
    command += ["--tags", f'{{"dagster/partition": "{key}"}}']
    cpu, started = _children_cpu(), time.perf_counter()
    done = subprocess.run(command, env=env, cwd=REPO, capture_output=True, text=True)
    wall, cpu = time.perf_counter() - started, _children_cpu() - cpu
    if done.returncode != 0 or "RUN_SUCCESS" not in done.stdout + done.stderr:
        raise SystemExit(f"the run failed ({module}):\n{done.stderr[-3000:]}")
    return wall, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=at_least_one, default=10_000)
    parser.add_argument("--rounds", type=at_least_one, default=3)
    args = parser.parse_args()
    print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    with tempfile.TemporaryDirectory(prefix="bench-run-") as tmp:
        (batch,) = write_crawl(Path(tmp) / "landing", args.records, 1, "typical")
        figures: dict[str, list[tuple[float, float]]] = {name: [] for name in LOCATIONS}
        for round_ in range(args.rounds):
            for name, module in LOCATIONS.items():
                with scratch_database() as url:
                    figures[name].append(run_once(module, batch, url, Path(tmp) / f"home-{round_}-{module}"))
    print(f"\none run of dedup_ladder over one batch of {args.records:,} lines, {args.rounds} rounds, medians")
    medians = {}
    for name, values in figures.items():
        wall, cpu = statistics.median(v[0] for v in values), statistics.median(v[1] for v in values)
        medians[name] = wall, cpu
        rounds = ", ".join(f"{w:.1f}/{c:.1f}" for w, c in values)
        print(f"  {name:20s} wall {wall:6.1f} s   CPU {cpu:6.1f} s   (rounds, wall/CPU: {rounds})")
    (own_wall, own_cpu), (base_wall, base_cpu) = medians["in process"], medians["a process per step"]
    print(f"  a process per step / in process: wall {base_wall / own_wall:.2f}x, CPU {base_cpu / own_cpu:.2f}x")
    print(f"load average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
