"""The near rung's links and clusters do not depend on the order batches ran in, nor on two workers racing.

Compared by natural key (record ids follow the order records were first stored, which differs between runs):
the links (earlier key, later key, similarity), and the clusters (their members and representative).
"""

from __future__ import annotations

import multiprocessing
import random

import pytest
from sqlalchemy import select

from dedup_pipeline.ladder.near import cluster_batch
from dedup_pipeline.ladder.settings import NearSettings
from dedup_pipeline.store.schema import near_duplicate_links, near_pending, records
from dedup_pipeline.store.warehouse import Warehouse
from dedup_pipeline_tests.helpers import clusters_by_key, database_url, description, fresh_database, listing
from dedup_pipeline_tests.ladder.test_near import land

LANDED = 1e9
SOURCES = ("shop-a", "shop-b")


def _variant(rng: random.Random, base: str, edits: int) -> str:
    words = base.split()
    for _ in range(edits):
        words[rng.randrange(len(words))] = f"w{rng.randrange(10_000)}"
    return " ".join(words)


def syndicated_crawl(seed: int = 7, stories: int = 12, batches: int = 3) -> dict[str, list[dict]]:
    """Batches of two sources, alternating, in landing order; each holds new stories and edited copies of earlier
    ones (the other source's too), so links and clusters cross batches and sources."""
    rng = random.Random(seed)
    bases = [description(500 + s, words=60) for s in range(stories)]
    out: dict[str, list[dict]] = {}
    n = 0
    for b in range(batches * len(SOURCES)):
        source = SOURCES[b % len(SOURCES)]
        rows = []
        for _ in range(14):
            story = rng.randrange(stories)
            n += 1
            rows.append(
                listing(
                    n,
                    url=f"https://{source}.example.com/p/{n}",
                    title=f"Story {story}",
                    description=_variant(rng, bases[story], rng.randrange(0, 5)),
                )
            )
        out[f"{b:02d}_{source}"] = rows
    return out


def stage(warehouse, folder, crawl: dict[str, list[dict]], order=None) -> None:
    """Every batch through the raw, canonical and exact rungs, landed one second apart, run in `order`
    (landing order by default): record ids follow the run order."""
    landed = {key: LANDED + i for i, key in enumerate(crawl)}
    for key in order or list(crawl):
        land(warehouse, folder, key, crawl[key], landed=landed[key])


def by_key(warehouse) -> tuple[set, set]:
    with warehouse.engine.connect() as conn:
        keys = dict(conn.execute(select(records.c.record_id, records.c.natural_key)).all())
        links = {
            (keys[a], keys[b], round(s, 9))
            for a, b, s in conn.execute(
                select(
                    near_duplicate_links.c.record_a, near_duplicate_links.c.record_b, near_duplicate_links.c.similarity
                )
            )
        }
        clusters = clusters_by_key(conn, keys)
        pending = conn.execute(select(near_pending.c.record_id)).all()
    assert not pending
    return links, clusters


def clustered(url: str, folder, crawl, order) -> tuple[set, set]:
    warehouse = Warehouse(url).create_schema()
    stage(warehouse, folder, crawl, order)
    for key in order:
        cluster_batch(warehouse, key, NearSettings(chunk_size=5))
    out = by_key(warehouse)
    warehouse.dispose()
    return out


def test_batches_clustered_in_any_order_give_the_links_and_clusters_of_landing_order(warehouse_url, tmp_path):
    """Breaks: the batches run in reverse landing order (a batch whose step failed and ran later, or runs launched
    out of order), every rung, so record ids follow the run order; against a run in landing order.

    Must hold: the same links (each record to its nearest earlier-landed near duplicates, by landing, not by run
    order) and the same clusters with the same representatives (the first landed).
    """
    crawl = syndicated_crawl()
    forward = clustered(warehouse_url, tmp_path / "forward", crawl, list(crawl))
    if warehouse_url.startswith("sqlite"):
        backward = clustered(
            f"sqlite:///{tmp_path / 'backward.sqlite'}", tmp_path / "backward", crawl, list(reversed(crawl))
        )
    else:
        with fresh_database("near_order") as name:
            backward = clustered(database_url(name), tmp_path / "backward", crawl, list(reversed(crawl)))
    assert forward[0] and len(forward[1]) >= 3
    assert backward == forward


def _cluster_source(url: str, keys: list[str], start) -> None:
    start.wait()  # both workers begin clustering at the same moment
    warehouse = Warehouse(url)
    for key in keys:
        cluster_batch(warehouse, key, NearSettings(chunk_size=4))
    warehouse.dispose()


@pytest.mark.postgres
def test_two_workers_on_two_sources_at_once_give_the_links_and_clusters_of_one_serial_run(tmp_path):
    """Breaks: two processes cluster the batches of two sources at the same time, into one warehouse, their chunks
    interleaved (small chunks: many transactions race), while each source's copies are near duplicates of the
    other's.

    Must hold: exactly the links and clusters of one worker clustering every batch in landing order, nothing left
    pending, and no lock held across workers for the whole write (a shared lock would serialise them; the test
    only passes if the result is right however they interleave).
    """
    crawl = syndicated_crawl(seed=11, stories=8, batches=4)
    with fresh_database("near_serial") as serial_name, fresh_database("near_parallel") as parallel_name:
        serial = Warehouse(database_url(serial_name)).create_schema()
        stage(serial, tmp_path / "serial", crawl)
        for key in crawl:
            cluster_batch(serial, key, NearSettings(chunk_size=4))
        expected = by_key(serial)
        serial.dispose()

        url = database_url(parallel_name)
        parallel = Warehouse(url).create_schema()
        stage(parallel, tmp_path / "parallel", crawl)
        parallel.dispose()
        ctx = multiprocessing.get_context("spawn")
        with ctx.Manager() as manager:
            start = manager.Barrier(2)
            with ctx.Pool(2) as pool:
                pool.starmap(
                    _cluster_source, [(url, [k for k in crawl if k.endswith(source)], start) for source in SOURCES]
                )
        parallel = Warehouse(url)
        got = by_key(parallel)
        parallel.dispose()
    assert expected[0] and any(len(members) > 4 for members, _ in expected[1])
    assert got == expected
