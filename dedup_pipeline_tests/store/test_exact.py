"""`load_state`: what the exact rung knows of a chunk before it plans, and how many statements it costs."""

from __future__ import annotations

import json
from datetime import UTC

from sqlalchemy import event

from dedup_pipeline.core.hashing import HASH_RULES
from dedup_pipeline.core.records import canonicalise_records, parse_line
from dedup_pipeline.ladder.canonical import canonicalise_batch
from dedup_pipeline.ladder.exact import deduplicate_batch
from dedup_pipeline.ladder.raw import ingest_raw_batch
from dedup_pipeline.ladder.settings import LadderSettings
from dedup_pipeline.landing import find_batch
from dedup_pipeline.store.exact import load_state
from dedup_pipeline_tests.helpers import listing, new_run_id, write_batch

# content/2 leaves the URL (the natural key) out, so one content can be stored under two keys.
VERSION = "content/2"


def canonical(*raw):
    lines = [parse_line(json.dumps(record).encode()) for record in raw]
    return canonicalise_records(lines, range(1, len(lines) + 1), tuple(HASH_RULES), "content/1")


def selects(engine):
    """The SELECT statements run on `engine` while the block runs, in a list filled as they go."""
    seen: list[str] = []

    def note(conn, cursor, statement, *args):
        if statement.lstrip().upper().startswith("SELECT"):
            seen.append(statement)

    event.listen(engine, "before_cursor_execute", note)
    return seen, lambda: event.remove(engine, "before_cursor_execute", note)


def stored_warehouse(warehouse, tmp_path):
    write_batch(tmp_path / "landing", "a", [listing(n) for n in range(5)], landed=1e9)
    settings = LadderSettings(chunk_size=50)
    ingest_raw_batch(warehouse, find_batch(tmp_path / "landing", "a"))
    canonicalise_batch(warehouse, "a", settings)
    deduplicate_batch(warehouse, "a", new_run_id("a"), settings)
    return warehouse


def test_a_digest_its_key_holds_needs_no_digest_lookup(warehouse, tmp_path):
    stored_warehouse(warehouse, tmp_path)
    recrawls = canonical(listing(0, crawl_id="again"), listing(1, crawl_id="again"))
    seen, stop = selects(warehouse.engine)
    try:
        with warehouse.engine.connect() as conn:
            by_key, stored = load_state(conn, recrawls, VERSION)
    finally:
        stop()
    assert stored == {record.hashes[VERSION]: {record.natural_key} for record in recrawls}
    assert set(by_key) == {record.natural_key for record in recrawls}
    assert len(seen) == 1  # the key lookup answered for both digests


def test_other_digests_are_looked_up_and_found_under_any_key(warehouse, tmp_path):
    stored_warehouse(warehouse, tmp_path)
    chunk = canonical(
        listing(0, crawl_id="again"),  # its key holds its digest
        listing(2, url="https://mirror.example.org/p/2"),  # listing 2's content under a key not stored
        listing(1, title="Product 1 kettle, now in red"),  # its key holds another digest
        listing(99),  # new
    )
    recrawl, mirrored, changed, new = (record.hashes[VERSION] for record in chunk)
    key0, key1, key2 = (record.natural_key for record in canonical(listing(0), listing(1), listing(2)))
    with warehouse.engine.connect() as conn:
        (left,) = {row.content_hash for key, row in load_state(conn, chunk, VERSION)[0].items() if key == key1}
    seen, stop = selects(warehouse.engine)
    try:
        with warehouse.engine.connect() as conn:
            _, everything = load_state(conn, chunk, VERSION)
            _, narrowed = load_state(conn, chunk, VERSION, check_digests=[])  # a seen-set that missed them all
    finally:
        stop()
    assert everything == {recrawl: {key0}, mirrored: {key2}, left: {key1}}
    # A miss is assumed new unless its own key holds it; listing 1's key changes content, so its new digest
    # (not stored) and the one it leaves (held by it alone) are looked up all the same.
    assert narrowed == {recrawl: {key0}, left: {key1}}
    assert len(seen) == 4  # a key lookup and a digest lookup per call
    assert {changed, new}.isdisjoint(everything)


def test_a_rows_first_batch_is_loaded_only_for_a_chunk_older_than_its_last_version(warehouse, tmp_path):
    """A chunk of a batch landed after the rows' (the common case) costs no lookup of their first batch; one landed
    before them (an out-of-order run) costs one, which gives each row the batch it was first stored from."""
    from datetime import datetime

    stored_warehouse(warehouse, tmp_path)  # batch "a", landed at 1e9
    chunk = canonical(listing(0, crawl_id="again"), listing(1, crawl_id="again"))
    landed = datetime.fromtimestamp(1e9, UTC)
    for batch_time, lookups, first in (
        (datetime(2026, 11, 1, tzinfo=UTC), 1, None),
        (landed, 1, None),
        (datetime(2000, 1, 1, tzinfo=UTC), 2, (landed, "a")),
    ):
        seen, stop = selects(warehouse.engine)
        try:
            with warehouse.engine.connect() as conn:
                by_key, _ = load_state(conn, chunk, VERSION, batch_order=(batch_time, "b"))
        finally:
            stop()
        assert len(seen) == lookups and {row.first for row in by_key.values()} == {first}, batch_time
