"""Concurrent materialisations as separate processes: the same partition twice at once, overlapping batches in parallel.

Each worker runs the whole ladder (the functions the assets call) and waits
for the others at a barrier before every rung, so the rungs really overlap.
"""

from __future__ import annotations

import multiprocessing
import traceback
from collections import Counter

from sqlalchemy import func, select

from dedup_pipeline.ladder.settings import LadderSettings
from dedup_pipeline.quality.history import first_decision_counts
from dedup_pipeline.store.schema import canonical_records, dedup_decisions, quarantine, records
from dedup_pipeline.store.warehouse import Warehouse
from dedup_pipeline_tests.helpers import listing, snapshot, write_batch
from dedup_pipeline_tests.reliability.ladder_run import NEAR, assert_one_row_per_key_and_content, clean_run, count

SETTINGS = LadderSettings(chunk_size=25)


def _ladder_worker(url: str, folder, key: str, run_id: str, barrier) -> dict:
    """One worker: the four rungs of `key`, each started together with the other workers'."""
    from dedup_pipeline.ladder.canonical import canonicalise_batch
    from dedup_pipeline.ladder.exact import deduplicate_batch
    from dedup_pipeline.ladder.near import cluster_batch
    from dedup_pipeline.ladder.raw import ingest_raw_batch
    from dedup_pipeline.ladder.settings import NearSettings
    from dedup_pipeline.landing import find_batch

    warehouse = Warehouse(url)
    try:
        barrier.wait()
        ingest_raw_batch(warehouse, find_batch(folder, key))
        barrier.wait()
        canonicalise_batch(warehouse, key, SETTINGS)
        barrier.wait()
        exact = deduplicate_batch(warehouse, key, run_id, SETTINGS)
        barrier.wait()
        cluster_batch(warehouse, key, NearSettings(params=NEAR, chunk_size=SETTINGS.chunk_size))
        return {"key": key, "decisions": dict(exact.decisions), "records_in": exact.records_in}
    except Exception:  # noqa: BLE001 - report it to the test, which fails on it
        return {"key": key, "error": traceback.format_exc()}
    finally:
        warehouse.dispose()


def run_in_parallel(url: str, folder, jobs: list[tuple[str, str]]) -> list[dict]:
    """Run `(batch key, run id)` jobs as parallel processes; every worker must succeed."""
    ctx = multiprocessing.get_context("spawn")
    with ctx.Manager() as manager:
        barrier = manager.Barrier(len(jobs), timeout=300)
        with ctx.Pool(len(jobs)) as pool:
            results = pool.starmap(_ladder_worker, [(url, folder, key, run, barrier) for key, run in jobs])
    errors = [r["error"] for r in results if "error" in r]
    assert not errors, "a worker failed:\n" + "\n".join(errors)
    return results


def test_the_same_partition_materialised_twice_at_the_same_time(warehouse, warehouse_url, tmp_path):
    """Breaks: two runs of the same partition (batch b) start together, rung by rung, in two processes.

    Must hold: both runs succeed; each run's decisions add up to the batch's
    records; the partition's staged rows (canonical, quarantine) are there
    once; the first decision of every line and the tables equal one clean run.
    """
    folder = tmp_path / "landing"
    write_batch(folder, "a", [listing(n) for n in range(60)], landed=1e9)
    lines = [listing(n, crawl_id="b", price="1.25" if n % 5 == 0 else f"{10 + n}.90") for n in range(30, 130)]
    lines[10:10] = ['{"broken', {"url": "javascript:void(0)", "title": "x"}]
    write_batch(folder, "b", lines, landed=1e9 + 60)
    run_in_parallel(warehouse_url, folder, [("a", "run-a")])

    results = run_in_parallel(warehouse_url, folder, [("b", "run-b1"), ("b", "run-b2")])

    assert all(sum(r["decisions"].values()) == r["records_in"] == 100 for r in results)
    assert count(warehouse.engine, canonical_records, canonical_records.c.batch_id == "b") == 100
    assert count(warehouse.engine, quarantine, quarantine.c.batch_id == "b") == 2
    assert snapshot(warehouse.engine) == clean_run(tmp_path, folder, ["a", "b"], SETTINGS)
    assert_one_row_per_key_and_content(warehouse.engine)
    clean = Warehouse(f"sqlite:///{tmp_path / 'clean.sqlite'}")
    with warehouse.engine.connect() as conn, clean.engine.connect() as clean_conn:
        first = first_decision_counts(conn, ["b"])["b"]
        assert first == first_decision_counts(clean_conn, ["b"])["b"]
        both = Counter(
            dict(
                conn.execute(
                    select(dedup_decisions.c.decision, func.count())
                    .where(dedup_decisions.c.batch_id == "b")
                    .group_by(dedup_decisions.c.decision)
                ).all()
            )
        )
    clean.dispose()
    # The two runs together: every line decided twice, each insert or update done by exactly one of them.
    assert sum(both.values()) == 200 and both["new"] + both["changed"] == first["new"] + first["changed"]


def overlapping_batches(folder):
    """p1, p2, p3, landed in that order. p2 changes the price of every third shared key; p3 changes every fourth
    and re-crawls the others unchanged, so some of its keys hold p1's content again after p2 changed it."""
    write_batch(folder, "p1", [listing(n) for n in range(0, 120)], landed=1e9)
    write_batch(
        folder,
        "p2",
        [listing(n, crawl_id="p2", price="2.50" if n % 3 == 0 else f"{10 + n}.90") for n in range(60, 180)],
        landed=1e9 + 60,
    )
    write_batch(
        folder,
        "p3",
        [listing(n, crawl_id="p3", price="3.75" if n % 4 == 0 else f"{10 + n}.90") for n in range(100, 220)],
        landed=1e9 + 120,
    )
    return folder


def test_batches_run_out_of_landing_order_end_as_in_landing_order(tmp_path):
    """Breaks: the batches run one after the other, but not in landing order (a retried or backfilled batch, a
    faster worker), so p3 re-crawls p1's content unchanged before p2, landed earlier, changes it.

    Must hold: the current rows (key, content, payload, and the batch and time each was first seen) equal those
    of a run in landing order: p2 is stale against p3's re-crawl (the row is dated to p3 although its content
    was p1's), and a key p3 stored before p2 ran was first seen in p2.
    """
    folder = overlapping_batches(tmp_path / "landing")
    in_order = [
        row[:4] for row in clean_run(tmp_path, folder, ["p1", "p2", "p3"], SETTINGS, name="in-order")["records"]
    ]
    first_in_order = first_seen(tmp_path, "in-order")
    for order in (["p1", "p3", "p2"], ["p3", "p2", "p1"], ["p2", "p3", "p1"]):
        rows = [row[:4] for row in clean_run(tmp_path, folder, order, SETTINGS, name="-".join(order))["records"]]
        assert rows == in_order, order
        assert first_seen(tmp_path, "-".join(order)) == first_in_order, order


def first_seen(tmp_path, name: str) -> list[tuple]:
    """(key, first batch, first seen) of each row of the warehouse `clean_run(..., name=name)` left behind."""
    warehouse = Warehouse(f"sqlite:///{tmp_path / f'{name}.sqlite'}")
    try:
        with warehouse.engine.connect() as conn:
            return sorted(
                conn.execute(select(records.c.natural_key, records.c.first_batch_id, records.c.first_seen_at))
            )
    finally:
        warehouse.dispose()


def test_overlapping_batches_materialised_in_parallel(warehouse, warehouse_url, tmp_path):
    """Breaks: three overlapping batches (shared keys re-crawled unchanged, with new prices, and their own keys)
    run the whole ladder at the same time in three processes.

    Must hold: every run succeeds; exactly one row per key and per content;
    each run's decisions add up to its records and together they insert each
    key once; the current rows (key, content, payload) equal a sequential run
    (the newest batch's content wins whatever order the workers took).
    """
    folder = overlapping_batches(tmp_path / "landing")

    results = run_in_parallel(warehouse_url, folder, [("p1", "r1"), ("p2", "r2"), ("p3", "r3")])

    assert all(sum(r["decisions"].values()) == r["records_in"] == 120 for r in results)
    figures = assert_one_row_per_key_and_content(warehouse.engine)
    assert figures["rows"] == 220
    assert sum(r["decisions"].get("new", 0) for r in results) == 220
    assert count(warehouse.engine, dedup_decisions) == 360
    current = [row[:4] for row in snapshot(warehouse.engine)["records"]]  # key, version, digest, payload
    expected = [row[:4] for row in clean_run(tmp_path, folder, ["p1", "p2", "p3"], SETTINGS)["records"]]
    assert current == expected
    with warehouse.engine.connect() as conn:
        prices = dict(conn.execute(select(records.c.natural_key, records.c.payload["price"].as_string())).all())
    assert prices["https://shop.example.com/p/108"] == "3.75" and prices["https://shop.example.com/p/99"] == "2.5"
