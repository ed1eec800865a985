"""A batch that runs late (its first run failed, and later batches of its source went on) leaves the warehouse a
landing-order run leaves: the same records, history, links and clusters (real PostgreSQL)."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from dedup_pipeline.ladder.settings import LadderSettings
from dedup_pipeline.store.schema import near_duplicate_links, record_history, records
from dedup_pipeline.store.warehouse import Warehouse
from dedup_pipeline_tests.helpers import clusters_by_key, database_url, fresh_database, listing, write_batch
from dedup_pipeline_tests.ladder.common import DAY, run_batch

pytestmark = pytest.mark.parametrize("warehouse_url", ["postgresql"], indirect=True)

KEYS = ("2026-11-01-shop", "2026-11-02-shop", "2026-11-03-shop")
#: Chunks larger than a batch: a key's lines of one batch are decided together.
SETTINGS = LadderSettings(chunk_size=100)


def _mirror(n: int, url: str, words: str, **fields) -> dict:
    """A syndicated copy of listing n at another URL: its title, its description and a few words more."""
    base = listing(n)
    return listing(1000 + n, url=url, title=base["title"], description=f"{base['description']} {words}", **fields)


def _crawl(folder) -> None:
    """Three batches of one source: re-crawls, price changes (one reverting), keys dropped and back, a key twice
    in a batch, and mirror copies that form clusters across the batches."""
    b0 = [listing(n, price=f"{n}.00") for n in range(30)]
    b0.insert(6, listing(5, price="5.50"))  # key 5 twice: 5.00 then 5.50
    b0 += [_mirror(1, "https://mirror.example.net/1", "today"), _mirror(2, "https://copy.example.org/2", "fast")]
    b1 = [listing(n, price=f"{n}.10" if n < 20 else f"{n}.00", crawl_id="b1") for n in range(10, 40)]
    b1 += [_mirror(1, "https://copy.example.org/1", "shipped"), _mirror(12, "https://mirror.example.net/12", "new")]
    b2 = [listing(n, price=f"{n}.20", crawl_id="b2") for n in range(0, 10)]
    b2 += [listing(n, price=f"{n}.00", crawl_id="b2") for n in range(10, 15)]  # back to the price of b0
    b2 += [listing(n, price=f"{n}.30", crawl_id="b2") for n in range(30, 35)]
    b2 += [_mirror(2, "https://mirror.example.net/2", "soon"), _mirror(12, "https://copy.example.org/12", "cheap")]
    for i, (key, lines) in enumerate(zip(KEYS, (b0, b1, b2))):
        write_batch(folder, key, lines, landed=1_700_000_000 + i * DAY)


def _by_key(warehouse: Warehouse) -> dict:
    """The tables as values that do not depend on record ids (they follow run order): by natural key."""
    with warehouse.engine.connect() as conn:
        keys = dict(conn.execute(select(records.c.record_id, records.c.natural_key)).all())
        rows = conn.execute(select(records)).all()
        history = conn.execute(select(record_history)).all()
        links = conn.execute(select(near_duplicate_links)).all()
        clusters = clusters_by_key(conn, keys)
    return {
        "records": sorted(
            (
                r.natural_key,
                r.content_hash.hex(),
                str(sorted(r.payload.items())),
                r.first_batch_id,
                r.last_batch_id,
                r.last_line_no,
            )
            for r in rows
        ),
        "history": sorted(
            (
                keys[h.record_id],
                h.natural_key,
                h.content_hash.hex(),
                str(sorted(h.payload.items())),
                h.valid_from,
                h.superseded_by_batch_id,
            )
            for h in history
        ),
        "links": sorted((keys[link.record_a], keys[link.record_b], round(link.similarity, 9)) for link in links),
        "clusters": sorted((sorted(m), representative) for m, representative in clusters),
    }


def _run(url: str, folder, order: list[str]) -> dict:
    warehouse = Warehouse(url).create_schema()
    try:
        for key in order:
            run_batch(warehouse, folder, key, SETTINGS)
        return _by_key(warehouse)
    finally:
        warehouse.dispose()


@pytest.mark.parametrize(
    "order",
    [[1, 2, 0, 1, 2], [0, 2, 1], [2, 1, 0]],
    ids=["b1-b2-then-all", "b1-between", "reverse"],
)
def test_a_batch_run_late_leaves_the_warehouse_of_a_landing_order_run(warehouse_url, tmp_path, order):
    """Breaks: a source's batches b0, b1, b2; b1 and b2 run first (b0 failed on a transient error and the source's
    later batches went on), then the whole folder (b0 late, b1 and b2 again); against b0, b1, b2 in landing order.

    Also b1 run after b2 (between the two others in landing order), and all three in reverse.

    Must hold: the same records, the same history (a version a later batch superseded is still filed, by the
    batch that superseded it in landing order: once, b0's superseded versions were never filed), the same
    links, and the same clusters with the same representatives (the first landed, not the smallest record id).
    """
    folder = tmp_path / "landing"
    _crawl(folder)
    landing_order = _run(warehouse_url, folder, list(KEYS))
    with fresh_database("late_batch") as name:
        late = _run(database_url(name), folder, [KEYS[i] for i in order])
    assert landing_order["history"] and len(landing_order["clusters"]) >= 2
    assert [t for t in ("records", "history", "links", "clusters") if late[t] != landing_order[t]] == []
