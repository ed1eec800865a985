"""The whole ladder end to end: `dedup-pipeline run` on PostgreSQL + Redis against the seeds' naive path, in one run.

    python benchmarks/bench_e2e.py                                # both densities, 100,000 records, 3 rounds
    python benchmarks/bench_e2e.py --density heavy --rounds 1 --records 20000   # a quick look
    python benchmarks/bench_e2e.py --batches 10 --density typical # cost growth over ten batches

The crawl (generated, seeded, from real text in ../shared/data): product listings whose titles are real product
names (Walmart-Amazon, Abt-Buy, Amazon-Google) and whose descriptions are a few real sentences (from the
article-extraction benchmark: curly quotes, dashes, non-ASCII), from two sources (`shop-a`, `shop-b`), in
`--batches` batches landing one after the other. Each batch after the first holds exact re-crawls (other
volatile fields, tracking-parameter URLs), price changes, new listings and syndicated near-copies (another
host, a few words edited). Two densities: `typical` (one record in ten a syndicated copy) and `heavy`
(syndication-heavy: most records fall in clusters, some of hundreds).

Each round, interleaved so that drift on a shared machine hits both alike:
- ours, one process: `dedup-pipeline run --workers 1` (every batch in one process, in landing order) over the whole
  landing folder, in a fresh PostgreSQL database, a private redis-server and a fresh Dagster home, every rung
  and check;
- ours: `dedup-pipeline run` (its default `--workers 0`: the two sources' lanes at once, a worker
  process per CPU), the same way;
- seeds: the seeds' `store_if_new` (per record: Redis SADD, INSERT ... ON CONFLICT DO NOTHING, commit) on
  `--seed-sample` records of the same crawl, exact dedup only.
While ours runs, a sampler reads every 50 ms the CPU time of the run's process (client) and of the PostgreSQL
server's processes (server), and the wait events of the run's database sessions. Each step's window comes from
the run's step events in the Dagster event log, so wall and CPU time are reported per rung (its asset checks
beside it), with the fixed cost per batch (run wall minus its steps) and the process's start-up.
Printed (medians over the rounds): records/s of each and their ratios; per rung (from the one-process run)
wall, client and server CPU and client CPU per record; the near rung's client CPU per sketched document and the
share of its wall time its sessions waited on a lock (in the side-by-side run, where workers could wait on each
other); the per-batch run walls; bytes per stored record by table; links per clustered record; and whether the
side-by-side run's links and clusters, compared by natural key, are identical to the one-process run's.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psycopg  # noqa: E402
import redis  # noqa: E402

from benchmarks.bench_exact import seed_store_if_new  # noqa: E402
from benchmarks.common import (  # noqa: E402
    DATA,
    article_paragraphs,
    at_least_one,
    descendants,
    private_redis,
    process_cpu,
    scratch_database,
)

REPO = Path(__file__).resolve().parent.parent
CLI = str(Path(sys.executable).with_name("dedup-pipeline"))
SOURCES = ("shop-a", "shop-b")
RUNGS = ("raw_crawl_batches", "canonical_records", "deduplicated_records", "near_duplicate_clusters")
SAMPLE_SECONDS = 0.05


# ------------------------------------------------------------------ the crawl


def _titles() -> list[str]:
    titles: list[str] = []
    with open(DATA / "er_jedai" / "walmart-amazon" / "amazon.csv", encoding="utf-8", errors="replace") as handle:
        titles += [row["title"] for row in csv.DictReader(handle, delimiter="|") if row.get("title")]
    for path, column in (
        (DATA / "er_leipzig" / "Abt-Buy" / "Buy.csv", "name"),
        (DATA / "er_leipzig" / "Amazon-GoogleProducts" / "GoogleProducts.csv", "name"),
    ):
        with open(path, encoding="latin-1") as handle:
            titles += [row[column] for row in csv.DictReader(handle) if row.get(column)]
    return sorted({t.strip() for t in titles if len(t.split()) >= 2})


def _sentences() -> list[str]:
    """The sentences of the article benchmark's real texts (about 8,000), long enough to read as prose."""
    found = set()
    for paragraph in article_paragraphs():
        found.update(s.strip() for s in re.split(r"(?<=[.!?”])\s+", paragraph) if len(s.split()) >= 6)
    return sorted(found)


@dataclass
class Crawl:
    """The generator: products with a content version each, and the near-copies planted of them."""

    density: str
    seed: int
    titles: list[str] = field(default_factory=_titles)
    sentences: list[str] = field(default_factory=_sentences)
    products: list[tuple[int, int]] = field(default_factory=list)  # (product id, source index)
    price_version: dict[int, int] = field(default_factory=dict)
    originals: list[int] = field(default_factory=list)  # products that syndication copies

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.copies = 0

    def _text(self, p: int) -> tuple[str, str]:
        rng = random.Random(p * 7919 + 17)
        title = f"{self.titles[p % len(self.titles)]}" + (
            f" ({p // len(self.titles)})" if p >= len(self.titles) else ""
        )
        # A few sentences drawn from thousands: two listings rarely share one, as two real listings rarely do.
        description = " ".join(rng.sample(self.sentences, rng.randint(3, 6)))
        return title, description

    def listing(self, p: int, source: int, batch: int, tracking: bool) -> dict:
        title, description = self._text(p)
        version = self.price_version.get(p, 0)
        url = f"https://{SOURCES[source]}.example.com/item/{p}"
        if tracking:
            url += f"?utm_source=feed{batch}&utm_medium=cpc&gclid=g{self.rng.getrandbits(24):x}"
        return {
            "url": url,
            "title": title,
            "description": description,
            "price": f"{(p % 500) + 9.99 + version:.2f}",
            "currency": "EUR",
            "seller_id": f"{SOURCES[source]}-seller-{p % 83}",
            "sku": f"SKU-{p}",
            **self._volatile(batch),
        }

    def _volatile(self, batch: int) -> dict:
        return {
            "scraped_at": f"2026-11-{1 + batch % 28:02d}T{self.rng.randrange(24):02d}:{self.rng.randrange(60):02d}:00Z",
            "crawl_id": f"crawl-{batch}-{self.rng.randrange(8)}",
            "proxy_ip": f"10.{batch}.{self.rng.randrange(256)}.7",
            "response_ms": self.rng.randrange(40, 900),
            "etag": f'W/"{self.rng.getrandbits(32):08x}"',
        }

    def near_copy(self, p: int, batch: int) -> dict:
        """A syndicated copy of product `p` on a mirror host: the same text with a few words edited."""
        self.copies += 1
        title, description = self._text(p)
        words = description.split()
        rng = random.Random(self.copies * 104729 + self.seed)
        for _ in range(max(1, len(words) // 40)):
            at = rng.randrange(len(words))
            words[at] = rng.choice(("reportedly", "also", "now", "still", "—", "however,", "said"))
        host = f"mirror{self.copies % 37}.example.org"
        return {
            "url": f"https://{host}/syndicated/{p}-{self.copies}",
            "title": title,
            "description": " ".join(words),
            "price": f"{(p % 500) + 9.99:.2f}",
            "currency": "EUR",
            "seller_id": f"syndicator-{self.copies % 37}",
            "sku": f"SYN-{p}-{self.copies}",
            **self._volatile(batch),
        }

    def batch(self, batch: int, source: int, size: int) -> list[dict]:
        heavy = self.density == "heavy"
        mix = ((0.40, 0.05, 0.20, 0.35) if heavy else (0.45, 0.10, 0.35, 0.10)) if self.products else (0, 0, 0.9, 0.1)
        recrawl, change, new, _copy = mix
        lines: list[dict] = []
        mine = [p for p, s in self.products if s == source]
        for _ in range(size):
            roll = self.rng.random()
            if roll < recrawl and mine:
                lines.append(self.listing(self.rng.choice(mine), source, batch, self.rng.random() < 0.3))
            elif roll < recrawl + change and mine:
                p = self.rng.choice(mine)
                self.price_version[p] = self.price_version.get(p, 0) + 1
                lines.append(self.listing(p, source, batch, False))
            elif roll < recrawl + change + new or not self.originals:
                p = len(self.products)
                self.products.append((p, source))
                if self.rng.random() < 0.1:
                    self.originals.append(p)
                lines.append(self.listing(p, source, batch, self.rng.random() < 0.05))
            else:
                # Syndication copies some stories far more than others: clusters of every size, some of hundreds.
                pool = self.originals
                lines.append(
                    self.near_copy(
                        pool[int(len(pool) * self.rng.random() ** 2)] if heavy else self.rng.choice(pool), batch
                    )
                )
        return lines


def write_crawl(folder: Path, records: int, batches: int, density: str, seed: int = 20261202) -> list[Path]:
    """`batches` files in landing order (alternating sources), `records` lines in all; each file's mtime its landing."""
    crawl = Crawl(density, seed)
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for b in range(batches):
        source = b % len(SOURCES)
        path = folder / f"2026-11-{1 + b // len(SOURCES):02d}T{b % len(SOURCES):02d}_{SOURCES[source]}.jsonl"
        lines = crawl.batch(b, source, records // batches)
        path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in lines), encoding="utf-8")
        landed = 1_790_000_000 + b * 3600
        os.utime(path, (landed, landed))
        paths.append(path)
    return paths


# ------------------------------------------------------------------ sampling CPU and waits


def _postgres_pids() -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "comm").read_text().strip() == "postgres":
                    pids.append(int(entry.name))
            except OSError:
                pass
    return pids


class Sampler(threading.Thread):
    """Every 50 ms: time, client CPU per process (with its children), server CPU, and Lock waits per application."""

    def __init__(self, clients: dict[str, int], database_url: str):
        super().__init__(daemon=True)
        self.clients = clients
        self.samples: list[tuple[float, dict[str, float], float, set[str]]] = []
        self._halt = threading.Event()
        self._conn = psycopg.connect(database_url.replace("postgresql+psycopg", "postgresql"), autocommit=True)
        self._database = database_url.rsplit("/", 1)[1].split("?")[0]
        self._server_done: dict[int, float] = {}  # CPU of server processes that have exited, kept in the sum

    def _server_cpu(self) -> float:
        pids = _postgres_pids()
        now = {pid: process_cpu(pid) for pid in pids}
        for pid, seconds in now.items():
            self._server_done[pid] = max(self._server_done.get(pid, 0.0), seconds)
        return sum(self._server_done.values())

    def run(self) -> None:
        while not self._halt.is_set():
            client = {
                name: process_cpu(pid, True) + sum(process_cpu(c, True) for c in descendants(pid))
                for name, pid in self.clients.items()
            }
            waiting = {
                (row[0], row[1])
                for row in self._conn.execute(
                    "SELECT application_name, wait_event FROM pg_stat_activity "
                    "WHERE datname = %s AND wait_event_type = 'Lock'",
                    (self._database,),
                )
            }
            self.samples.append((time.time(), client, self._server_cpu(), waiting))
            self._halt.wait(SAMPLE_SECONDS)

    def stop(self) -> None:
        self._halt.set()
        self.join()
        self._conn.close()

    def cpu_between(self, name: str, start: float, end: float) -> tuple[float, float]:
        """(client CPU of `name`, server CPU) spent between two wall times, interpolated between samples."""
        return self._at(start, end, lambda s: s[1].get(name, 0.0)), self._at(start, end, lambda s: s[2])

    def lock_share(self, name: str, start: float, end: float) -> tuple[Counter, int]:
        """Samples between two wall times in which a session of `name` waited on a lock, by lock kind
        (`advisory`, `transactionid`: a row another transaction holds, `extend`: a table growing, ...), and all
        samples."""
        inside = [s for s in self.samples if start <= s[0] <= end]
        waits = Counter(event for s in inside for event in {e for app, e in s[3] if app == name})
        waits["any"] = sum(1 for s in inside if any(app == name for app, _ in s[3]))
        return waits, len(inside)

    def _at(self, start: float, end: float, value) -> float:
        def at(moment: float) -> float:
            before = [s for s in self.samples if s[0] <= moment]
            after = [s for s in self.samples if s[0] >= moment]
            if not before:
                return value(after[0]) if after else 0.0
            if not after:
                return value(before[-1])
            a, b = before[-1], after[0]
            if b[0] == a[0]:
                return value(a)
            return value(a) + (value(b) - value(a)) * (moment - a[0]) / (b[0] - a[0])

        return max(0.0, at(end) - at(start))


# ------------------------------------------------------------------ running ours


def _environment(database_url: str, redis_url: str, home: Path, application: str) -> dict:
    home.mkdir(parents=True, exist_ok=True)
    (home / "dagster.yaml").write_text((REPO / "dagster.yaml").read_text())
    return {
        **os.environ,
        "DAGSTER_HOME": str(home),
        "DEDUP_REDIS_URL": redis_url,
        "DEDUP_DATABASE_URL": f"{database_url}?application_name={application}",
        "DEDUP_DATA_DIR": str(home / "data"),
    }


def launch(landing: Path, env: dict, workers: int) -> subprocess.Popen:
    return subprocess.Popen(
        [CLI, "run", "--landing", str(landing), "--json", "--workers", str(workers)],
        env=env,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(process: subprocess.Popen) -> dict:
    out, err = process.communicate()
    if process.returncode != 0:
        raise SystemExit(f"dedup-pipeline run failed ({process.returncode}):\n{err[-4000:]}\n{out[-2000:]}")
    return json.loads(out)


def step_windows(home: Path) -> list[dict]:
    """Per run of the instance at `home`: its partition, wall window and each step's (from the event log)."""
    from dagster import DagsterEventType, DagsterInstance
    from dagster._core.instance.ref import InstanceRef

    instance = DagsterInstance.from_ref(InstanceRef.from_dir(str(home)))
    runs = []
    for run in sorted(instance.get_runs(), key=lambda r: instance.get_run_record_by_id(r.run_id).create_timestamp):
        steps: dict[str, list[float]] = {}
        start = end = None
        for record in instance.all_logs(run.run_id):
            event = record.get_dagster_event() if record.is_dagster_event else None
            if event is None:
                continue
            if event.event_type == DagsterEventType.RUN_START:
                start = record.timestamp
            elif event.event_type in (DagsterEventType.RUN_SUCCESS, DagsterEventType.RUN_FAILURE):
                end = record.timestamp
            elif event.event_type == DagsterEventType.STEP_START:
                steps.setdefault(event.step_key, [record.timestamp, record.timestamp])[0] = record.timestamp
            elif event.event_type in (DagsterEventType.STEP_SUCCESS, DagsterEventType.STEP_FAILURE):
                steps.setdefault(event.step_key, [record.timestamp, record.timestamp])[1] = record.timestamp
        runs.append({"partition": run.tags.get("dagster/partition"), "start": start, "end": end, "steps": steps})
    instance.dispose()
    return runs


def _rung_of(step_key: str) -> str:
    """The rung a step belongs to: the asset's own step, or `<asset> checks` for a step of its asset checks."""
    for rung in reversed(RUNGS):
        if step_key == rung:
            return rung
        if step_key.startswith(rung):
            return f"{rung} checks"
    return step_key


def warehouse_figures(database_url: str) -> dict:
    with psycopg.connect(database_url.replace("postgresql+psycopg", "postgresql")) as conn:
        stored = conn.execute("SELECT count(*) FROM records").fetchone()[0]
        tables = dict(
            conn.execute(
                "SELECT c.relname, pg_total_relation_size(c.oid) FROM pg_class c "
                "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = 'public' AND c.relkind = 'r'"
            ).fetchall()
        )
        database = conn.execute("SELECT pg_database_size(current_database())").fetchone()[0]
        links = conn.execute("SELECT count(*) FROM near_duplicate_links").fetchone()[0]
        clustered = conn.execute("SELECT count(*) FROM near_duplicate_clusters").fetchone()[0]
        sketched, capped = conn.execute(
            "SELECT coalesce(sum((stats->>'sketched')::int), 0), coalesce(sum((stats->>'capped_records')::int), 0) "
            "FROM near_rung_runs"
        ).fetchone()
    return {
        "stored": stored,
        "tables": tables,
        "database": database,
        "links": links,
        "clustered": clustered,
        "sketched": sketched,
        "capped": capped,
    }


def clustering_by_key(database_url: str) -> tuple[set, set]:
    """Links as sets of natural-key pairs, clusters as (sorted member keys, representative key), stored (key,
    digest) pairs: id-free."""
    with psycopg.connect(database_url.replace("postgresql+psycopg", "postgresql")) as conn:
        links = {
            tuple(sorted(row))
            for row in conn.execute(
                "SELECT a.natural_key, b.natural_key FROM near_duplicate_links l "
                "JOIN records a ON a.record_id = l.record_a JOIN records b ON b.record_id = l.record_b"
            )
        }
        members: dict[int, list] = {}
        representative: dict[int, str] = {}
        for cluster, key, rep in conn.execute(
            "SELECT c.cluster_id, r.natural_key, c.is_representative FROM near_duplicate_clusters c "
            "JOIN records r ON r.record_id = c.record_id"
        ):
            members.setdefault(cluster, []).append(key)
            if rep:
                representative[cluster] = key
        clusters = {(tuple(sorted(keys)), representative.get(c)) for c, keys in members.items()}
        stored = {row for row in conn.execute("SELECT natural_key, content_hash FROM records")}
    return links, clusters, stored


@dataclass
class OursRound:
    seconds: float
    lines: int
    rung_wall: dict
    rung_client: dict
    rung_server: dict
    batch_walls: list
    batch_fixed: list
    startup: float
    near_lock_share: dict  # lock kind ("any": one or more) -> share of the near rung's wall its sessions waited
    near_documents: int
    figures: dict
    clustering: tuple


def run_ours(landing: Path, lines: int, workers: int) -> OursRound:
    with (
        scratch_database() as url,
        private_redis() as redis_url,
        tempfile.TemporaryDirectory(prefix="e2e-home-") as tmp,
    ):
        home = Path(tmp) / "dagster_home"
        env = _environment(url, redis_url, home, "e2e-ours")
        started = time.time()
        process = launch(landing, env, workers)
        sampler = Sampler({"ours": process.pid}, url)
        sampler.start()
        try:
            summary = finish(process)
        finally:
            sampler.stop()
        seconds = time.time() - started
        runs = step_windows(home)
        wall: dict[str, float] = {}
        client: dict[str, float] = {}
        server: dict[str, float] = {}
        lock_hits, lock_samples = Counter(), 0
        for run in runs:
            for step, (begin, end) in run["steps"].items():
                rung = _rung_of(step)
                wall[rung] = wall.get(rung, 0.0) + end - begin
                c, s = sampler.cpu_between("ours", begin, end)
                client[rung] = client.get(rung, 0.0) + c
                server[rung] = server.get(rung, 0.0) + s
                if step == "near_duplicate_clusters":
                    hits, samples = sampler.lock_share("e2e-ours", begin, end)
                    lock_hits, lock_samples = lock_hits + hits, lock_samples + samples
        batch_walls = [run["end"] - run["start"] for run in runs if run["start"] and run["end"]]
        fixed = [
            (run["end"] - run["start"]) - sum(e - b for b, e in run["steps"].values())
            for run in runs
            if run["start"] and run["end"]
        ]
        first_start = min(run["start"] for run in runs if run["start"])
        figures = warehouse_figures(url)
        clustering = clustering_by_key(url)
        if summary["failed"]:
            raise SystemExit(f"batches failed: {summary['failed']}")
    return OursRound(
        seconds,
        lines,
        wall,
        client,
        server,
        batch_walls,
        fixed,
        first_start - started,
        {kind: hits / lock_samples for kind, hits in lock_hits.items()} if lock_samples else {"any": 0.0},
        figures["sketched"],
        figures,
        clustering,
    )


def run_seed(sample: list[dict]) -> float:
    with scratch_database() as url, private_redis() as redis_url:
        conn = psycopg.connect(url.replace("postgresql+psycopg", "postgresql"))
        conn.execute("CREATE TABLE record (id bigserial PRIMARY KEY, content_hash text UNIQUE, payload jsonb)")
        conn.commit()
        client = redis.Redis.from_url(redis_url)
        started = time.perf_counter()
        for record in sample:
            seed_store_if_new(conn, client, record, "seed")
        seconds = time.perf_counter() - started
        conn.close()
    return len(sample) / seconds


# ------------------------------------------------------------------ report


def _median(values) -> float:
    return statistics.median(values) if values else float("nan")


def _lock_kinds(rounds: list[OursRound]) -> str:
    kinds = sorted({kind for r in rounds for kind in r.near_lock_share} - {"any"})
    return ", ".join(f"{kind} {_median([r.near_lock_share.get(kind, 0.0) for r in rounds]):.1%}" for kind in kinds)


def report(density: str, ours: list[OursRound], lanes: list[OursRound], seeds: list[float]) -> None:
    rates = [r.lines / r.seconds for r in ours]
    lane_rates = [r.lines / r.seconds for r in lanes]
    lines = ours[0].lines
    print(f"\n== {density} crawl: {lines:,} lines in {len(ours[0].batch_walls)} batches, {len(ours)} round(s), medians")
    for name, values in (
        ("ours  dedup-pipeline run   ", lane_rates),
        ("ours  run --workers 1      ", rates),
        ("seeds store_if_new         ", seeds),
    ):
        print(f"  {name}  {_median(values):>8,.0f} rec/s   (rounds: {', '.join(f'{r:,.0f}' for r in values)})")
    print(f"  ours / seeds                 {_median(lane_rates) / _median(seeds):8.2f}x  (target >= 3x)")
    print(f"  ours --workers 1 / seeds     {_median(rates) / _median(seeds):8.2f}x")
    one, two = ours[len(ours) // 2].clustering, lanes[len(lanes) // 2].clustering
    stored_same = all(a.clustering[2] == b.clustering[2] for a, b in zip(ours, lanes))
    clusters_same = all(a.clustering[1] == b.clustering[1] for a, b in zip(ours, lanes))
    clusters_differ = len(one[1] ^ two[1])
    print(
        f"  two sources side by side: {_median(lane_rates) / _median(rates):.2f}x one process (target >= 1.5x); "
        f"lock wait {_median([r.near_lock_share.get('any', 0.0) for r in lanes]):.1%} of the near rung's wall "
        f"(target <= 5%; by kind: {_lock_kinds(lanes)})"
    )
    print(
        f"    against the one-process run (by natural key): stored records {'identical' if stored_same else 'DIFFER'}; "
        f"clusters {'identical' if clusters_same else 'DIFFER'} ({clusters_differ:,} of {len(one[1]):,} differ); "
        f"links: {len(one[0] ^ two[0]):,} "
        f"of {len(one[0]):,} differ; records that met max_candidates: {lanes[len(lanes) // 2].figures['capped']:,}"
    )
    print("  per step (one process):")
    print("    step                               wall s   client CPU s   server CPU s   client us/record")
    for rung in (name for asset in RUNGS for name in (asset, f"{asset} checks")):
        wall = _median([r.rung_wall.get(rung, 0) for r in ours])
        client = _median([r.rung_client.get(rung, 0) for r in ours])
        server = _median([r.rung_server.get(rung, 0) for r in ours])
        print(f"    {rung:32s} {wall:8.1f} {client:14.1f} {server:14.1f} {client / lines * 1e6:18.0f}")
    total = _median([r.seconds for r in ours])
    print(f"    {'whole run':32s} {total:8.1f}")
    docs = _median([r.near_documents for r in ours])
    near_cpu = _median([r.rung_client.get("near_duplicate_clusters", 0) for r in ours])
    print(
        f"  near rung: {near_cpu / max(docs, 1) * 1e3:.3f} ms client CPU per sketched document "
        f"({docs:,.0f} documents; target <= 0.35)"
    )
    print(
        f"  start-up before the first run {_median([r.startup for r in ours]):.1f} s (side by side "
        f"{_median([r.startup for r in lanes]):.1f} s: the lanes start once their fork server's imports are done); "
        f"per batch: run wall "
        f"{', '.join(f'{w:.1f}' for w in ours[len(ours) // 2].batch_walls)} s, fixed cost (run minus steps) "
        f"median {_median([f for r in ours for f in r.batch_fixed]):.2f} s"
    )
    walls = ours[len(ours) // 2].batch_walls
    if len(walls) >= 10:
        print(f"  cost growth: batch 10 / batch 2 wall {walls[9] / walls[1]:.2f}x (target <= 1.2x)")
    figures = ours[len(ours) // 2].figures
    stored = max(figures["stored"], 1)
    print(
        f"  warehouse: {figures['stored']:,} stored records, {figures['database'] / stored:,.0f} bytes per stored "
        "record in the whole database (target <= 5,000)"
    )
    near_tables = ("lsh_buckets", "minhash_signatures", "near_index")
    index_bytes = sum(v for k, v in figures["tables"].items() if k in near_tables)
    print(f"    near index with signatures: {index_bytes / stored:,.0f} bytes per stored record (target <= 1,200)")
    print(
        f"    links: {figures['links']:,} for {figures['clustered']:,} clustered records: "
        f"{figures['links'] / max(figures['clustered'], 1):.2f} per clustered record (target <= 3)"
    )
    for table, size in sorted(figures["tables"].items(), key=lambda kv: -kv[1])[:12]:
        print(f"    {table:28s} {size / stored:10,.0f} bytes per stored record")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=at_least_one, default=100_000)
    parser.add_argument("--batches", type=at_least_one, default=4)
    parser.add_argument("--rounds", type=at_least_one, default=3)
    parser.add_argument("--density", choices=("typical", "heavy", "both"), default="both")
    parser.add_argument("--seed-sample", type=at_least_one, default=5_000)
    parser.add_argument("--keep", metavar="FOLDER", help="write the crawls here and keep them")
    args = parser.parse_args()
    print(f"load average at start: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f}")
    root = Path(args.keep or tempfile.mkdtemp(prefix="bench-e2e-"))
    densities = ("typical", "heavy") if args.density == "both" else (args.density,)
    try:
        for density in densities:
            folder = root / density
            paths = write_crawl(folder, args.records, args.batches, density)
            records = [json.loads(line) for path in paths for line in path.read_text(encoding="utf-8").splitlines()]
            sample = random.Random(1).sample(records, min(args.seed_sample, len(records)))
            ours, lanes, seeds = [], [], []
            for _ in range(args.rounds):
                seeds.append(run_seed(sample))
                ours.append(run_ours(folder, len(records), workers=1))
                lanes.append(run_ours(folder, len(records), workers=0))
            report(density, ours, lanes, seeds)
        print(f"load average at end: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f}")
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
