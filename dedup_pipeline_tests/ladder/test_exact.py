"""The exact rung (dedup_pipeline.ladder.exact) on SQLite and PostgreSQL: decisions, ordering, replays, resumed runs."""

from __future__ import annotations

import threading
from datetime import UTC

import pytest
from sqlalchemy import select, text

from dedup_pipeline.ladder.canonical import canonicalise_batch
from dedup_pipeline.ladder.exact import deduplicate_batch
from dedup_pipeline.ladder.raw import ingest_raw_batch
from dedup_pipeline.ladder.settings import LadderSettings
from dedup_pipeline.landing import find_batch
from dedup_pipeline.store import json_text
from dedup_pipeline.store.exact import canonical_chunk_query, iter_canonical_chunks
from dedup_pipeline.store.json_text import EncodedJson
from dedup_pipeline.store.schema import canonical_records, dedup_decisions, record_history, records
from dedup_pipeline.store.warehouse import ANALYZE_FLOOR
from dedup_pipeline_tests.helpers import listing, write_batch
from dedup_pipeline_tests.ladder.common import DAY, count, run_batch


def test_last_occurrence_in_file_order_wins(warehouse, tmp_path):
    folder = tmp_path / "landing"
    write_batch(
        folder,
        "b",
        [listing(1, price="1.00"), listing(1, price="2.00"), listing(1, price="3.00")],
        landed=1_700_000_000,
    )
    _, _, exact, _ = run_batch(warehouse, folder, "b")
    assert [exact.decisions[d] for d in ("new", "changed")] == [1, 2]
    with warehouse.engine.connect() as conn:
        assert conn.execute(select(records.c.payload)).scalar_one()["price"] == "3"
        assert sorted(p["price"] for p in conn.execute(select(record_history.c.payload)).scalars()) == ["1", "2"]


def test_an_unchanged_recrawl_then_a_change_of_the_key_in_one_chunk(warehouse, tmp_path):
    """Breaks: a newer batch holds an unchanged re-crawl of a stored key, then, later in the same chunk, new content
    for it (the re-crawl alone would only date the row; the change rewrites it).

    Must hold: the batch succeeds (once, it kept conflicting until it failed): exact duplicate then changed, the
    row holds the new content and dates from the change's line, the old content is in history.
    """
    folder = tmp_path / "landing"
    write_batch(folder, "p1", [listing(1, price="1.00")], landed=1_700_000_000)
    write_batch(folder, "p2", [listing(1, price="1.00"), listing(1, price="2.00")], landed=1_700_000_000 + DAY)
    run_batch(warehouse, folder, "p1")
    _, _, exact, _ = run_batch(warehouse, folder, "p2")
    assert [exact.decisions[d] for d in ("exact_duplicate", "changed")] == [1, 1] and exact.chunk_retries == 0
    with warehouse.engine.connect() as conn:
        assert conn.execute(
            select(records.c.payload["price"].as_string(), records.c.last_batch_id, records.c.last_line_no)
        ).one() == ("2", "p2", 2)
        assert [p["price"] for p in conn.execute(select(record_history.c.payload)).scalars()] == ["1"]


@pytest.mark.parametrize("active", ["content/1", "content/2"])
@pytest.mark.parametrize("old, new", [('"0.00001"', '"0.00004"'), ("9.90001", "9.90002")], ids=["text", "number"])
def test_a_price_change_below_a_ten_thousandth(warehouse, tmp_path, active, old, new):
    """Breaks: a re-crawl whose price changed by less than 0.0001 (price text, or a JSON number).

    Must hold: under `content/1` (prices in the seeds' fixed `.4f` form) it is an exact duplicate: the row is
    re-dated to the newer batch and keeps the old price. `content/2` (exact minor units) sees the change.
    """
    from dedup_pipeline_tests.reliability.ladder_run import set_active_version

    set_active_version(warehouse, active)
    folder = tmp_path / "landing"
    line = (
        '{"url": "https://shop.example.com/p/1", "title": "Kettle", "price": %s, "currency": "EUR", "seller_id": "s1"}'
    )
    write_batch(folder, "p1", [(line % old).encode()], landed=1_700_000_000)
    write_batch(folder, "p2", [(line % new).encode()], landed=1_700_000_000 + DAY)
    run_batch(warehouse, folder, "p1")
    _, _, exact, _ = run_batch(warehouse, folder, "p2")
    kept, replaced = old.strip('"'), new.strip('"')
    with warehouse.engine.connect() as conn:
        row = conn.execute(select(records.c.payload["price"].as_string(), records.c.last_batch_id)).one()
        history = [p["price"] for p in conn.execute(select(record_history.c.payload)).scalars()]
    if active == "content/1":
        assert dict(+exact.decisions) == {"exact_duplicate": 1}
        assert tuple(row) == (kept, "p2") and history == []
    else:
        assert dict(+exact.decisions) == {"changed": 1}
        assert tuple(row) == (replaced, "p2") and history == [kept]


def test_content_stored_under_another_key_is_an_exact_duplicate_whatever_the_seen_set_says(warehouse, tmp_path):
    """Breaks: under content/2 (the URL is not part of the content), a key kept first (keep_first) re-appears
    with content that another key holds, with no seen-set (nothing tells the rung that digest is stored, and
    nothing is inserted for the UNIQUE index to catch).

    Must hold: the record is decided an exact duplicate, as a warm seen-set would decide it.
    """
    from dedup_pipeline.core.exact import DuplicatePolicy
    from dedup_pipeline.ladder.rehash import compare_versions, switch_hash_version

    compare_versions(warehouse, "content/1", "content/2", low=-1, high=1)
    switch_hash_version(warehouse, "content/2", overlap_hours=0)
    folder = tmp_path / "landing"
    shared = listing(1)
    write_batch(folder, "p1", [shared, listing(2, price="12.00")], landed=1_700_000_000)
    write_batch(folder, "p2", [{**shared, "url": listing(2)["url"]}], landed=1_700_000_000 + DAY)
    settings = LadderSettings(chunk_size=7, policy=DuplicatePolicy(on_changed="keep_first"))
    run_batch(warehouse, folder, "p1", settings)
    _, _, exact, _ = run_batch(warehouse, folder, "p2", settings)
    assert dict(+exact.decisions) == {"exact_duplicate": 1}


@pytest.mark.parametrize("chunk_size", [1, 7])
@pytest.mark.parametrize(
    "move, titles, changed",
    [
        pytest.param(
            "chain", {"p/1": "Product 2 kettle", "p/2": "Product 3 kettle"}, 2, id="chain"
        ),  # B Z, then A B's Y
        pytest.param("swap", {"p/1": "Product 2 kettle", "p/2": "Product 1 kettle"}, 3, id="swap"),  # ... then B A's X
    ],
)
def test_content_moving_between_two_stored_keys_in_one_chunk(warehouse, tmp_path, move, titles, changed, chunk_size):
    """Breaks: under content/2 (the URL is not part of the content), keys A and B hold X and Y; a newer batch gives
    B new content Z, then A the content Y that B just left (a chain), then B the content X that A left (a swap).

    Must hold: whatever the chunk size, the batch ends as one record at a time would (once, a chunk holding both
    changes broke UNIQUE (hash_version, content_hash) and kept conflicting until the batch failed): every record
    changed, each key holds its last content, every content superseded is in history, no chunk replayed.
    """
    from dedup_pipeline.ladder.rehash import compare_versions, switch_hash_version

    compare_versions(warehouse, "content/1", "content/2", low=-1, high=1)
    switch_hash_version(warehouse, "content/2", overlap_hours=0)
    folder = tmp_path / "landing"
    a, b = listing(1)["url"], listing(2)["url"]
    write_batch(folder, "p1", [listing(1), listing(2)], landed=1_700_000_000)
    moves = [{**listing(3), "url": b}, {**listing(2), "url": a}] + (
        [{**listing(1), "url": b}] if move == "swap" else []
    )
    write_batch(folder, "p2", moves, landed=1_700_000_000 + DAY)
    settings = LadderSettings(chunk_size=chunk_size)
    run_batch(warehouse, folder, "p1", settings)
    _, _, exact, _ = run_batch(warehouse, folder, "p2", settings)
    assert dict(+exact.decisions) == {"changed": changed} and exact.chunk_retries == 0
    with warehouse.engine.connect() as conn:
        stored = dict(conn.execute(select(records.c.natural_key, records.c.payload["title"].as_string())).all())
        superseded = sorted(conn.execute(select(record_history.c.payload["title"].as_string())).scalars())
    assert stored == {f"https://shop.example.com/{path}": title for path, title in titles.items()}
    assert superseded == [f"Product {n} kettle" for n in range(1, changed + 1)]


def test_a_constraint_the_replay_cannot_satisfy_fails_the_chunk_at_once(warehouse, tmp_path, monkeypatch):
    """Breaks: writing a chunk raises an IntegrityError, once (as a lost race does), then on every attempt (as a
    plan the warehouse's constraints refuse whatever the other writers do).

    Must hold: the one-off is replayed and the batch succeeds; the lasting one fails the batch as soon as two
    attempts against the warehouse alone loaded the same rows, naming the chunk and the error (once, it was
    replayed 40 times), and leaves nothing of the chunk behind.
    """
    from sqlalchemy.exc import IntegrityError

    from dedup_pipeline.ladder import exact as exact_rung

    folder = tmp_path / "landing"
    write_batch(folder, "p1", [listing(n) for n in range(3)], landed=1_700_000_000)
    write_batch(folder, "p2", [listing(n) for n in range(3, 6)], landed=1_700_000_000 + DAY)
    attempts, failures = [], iter([1])
    apply_plan = exact_rung.apply_plan

    def refused(*args, **kwargs):
        attempts.append(args[3])
        if next(failures, None) is not None:
            raise IntegrityError("UPDATE records ...", {}, Exception("refused by a constraint"))
        return apply_plan(*args, **kwargs)

    monkeypatch.setattr(exact_rung, "apply_plan", refused)
    _, _, exact, _ = run_batch(warehouse, folder, "p1")
    assert exact.decisions["new"] == 3 and len(attempts) == 2

    failures, attempts[:] = iter(int, None), []  # every attempt fails
    with pytest.raises(RuntimeError, match=r"chunk of batch p2 \(lines 1-3\) broke a constraint twice .*refused by a"):
        run_batch(warehouse, folder, "p2")
    # The first attempt trusted the seen-set's misses (none: every digest unseen); then twice the warehouse alone.
    assert len(attempts) == 3 and count(warehouse, records) == 3


@pytest.mark.parametrize("order", [["p1", "p2", "p3"], ["p3", "p1", "p2"], ["p2", "p3", "p1"], ["p3", "p2", "p1"]])
def test_a_rows_first_batch_is_its_earliest_in_landing_order_whatever_the_run_order(warehouse, tmp_path, order):
    """Breaks: three batches landed p1 < p2 < p3 run in another order (a retry, a backfill, a faster worker).

    Must hold: each row is first seen (first_batch_id, first_seen_at) in the earliest batch, in landing order, that
    brought its key, as in a run in landing order, and holds the newest content (once, the batch that happened to
    run first kept it): product 1 is re-crawled unchanged by p3 after p2 changed it, product 2 changed by p3 (p1
    is stale against it), product 3 first crawled by p2, product 4 only by p3.
    """
    from datetime import datetime

    from dedup_pipeline.store.warehouse import as_utc

    folder = tmp_path / "landing"
    hours = {"p1": 10, "p2": 11, "p3": 12}

    def crawl(batch, n, price):
        return listing(n, price=price, crawl_id=batch, scraped_at=f"2026-11-01T{hours[batch]}:0{n}:00Z")

    write_batch(folder, "p1", [crawl("p1", 1, "1.00"), crawl("p1", 2, "5.00")], landed=1_700_000_000)
    write_batch(folder, "p2", [crawl("p2", 1, "2.00"), crawl("p2", 3, "7.00")], landed=1_700_000_000 + DAY)
    write_batch(
        folder,
        "p3",
        [crawl("p3", n, price) for n, price in ((1, "1.00"), (2, "6.00"), (3, "7.00"), (4, "8.00"))],
        landed=1_700_000_000 + 2 * DAY,
    )
    for batch in order:
        run_batch(warehouse, folder, batch)
    with warehouse.engine.connect() as conn:
        rows = conn.execute(
            select(
                records.c.natural_key,
                records.c.first_batch_id,
                records.c.first_seen_at,
                records.c.payload["price"].as_string(),
            )
        ).all()
    firsts = {key.rsplit("/", 1)[1]: (batch, as_utc(seen), price) for key, batch, seen, price in rows}
    assert firsts == {
        str(n): (batch, datetime(2026, 11, 1, hours[batch], n, tzinfo=UTC), price)
        for n, batch, price in ((1, "p1", "1"), (2, "p1", "6"), (3, "p2", "7"), (4, "p3", "8"))
    }


@pytest.mark.parametrize("chunk_size", [1, 7])
def test_a_key_new_in_a_batch_is_first_seen_at_its_first_occurrence_whatever_the_chunk_size(
    warehouse, tmp_path, chunk_size
):
    """Breaks: a new key appears twice in one batch, crawled at two times, with two contents.

    Must hold: its row was first seen at the first occurrence's crawl time and last crawled at the last's, whether
    both lines fall in one chunk or two (once, one chunk gave the last occurrence's time to both).
    """
    from datetime import datetime

    from dedup_pipeline.store.warehouse import as_utc

    folder = tmp_path / "landing"
    write_batch(
        folder,
        "p1",
        [
            listing(1, price="1.00", scraped_at="2026-11-01T10:00:00Z"),
            listing(2),
            listing(1, price="2.00", scraped_at="2026-11-01T10:30:00Z"),
        ],
        landed=1_700_000_000,
    )
    run_batch(warehouse, folder, "p1", LadderSettings(chunk_size=chunk_size))
    with warehouse.engine.connect() as conn:
        first, last = conn.execute(
            select(records.c.first_seen_at, records.c.last_crawled_at).where(records.c.natural_key == listing(1)["url"])
        ).one()
    assert (as_utc(first), as_utc(last)) == (
        datetime(2026, 11, 1, 10, 0, tzinfo=UTC),
        datetime(2026, 11, 1, 10, 30, tzinfo=UTC),
    )


def test_staged_payloads_are_carried_as_their_stored_text_and_stored_unchanged(warehouse, tmp_path):
    """The exact rung reads each payload as JSON text, never decodes it, and `records` gets the same value."""
    odd = {"note": 'Ünïcode ☕ \\ "quoted"', "dims": [1.5, 100000000000000000000000000001, {"deep": None}]}
    write_batch(tmp_path, "b", [listing(n, **odd) for n in range(12)] + [listing(3, price="7.00")])
    ingest_raw_batch(warehouse, find_batch(tmp_path, "b"))
    canonicalise_batch(warehouse, "b", LadderSettings(chunk_size=5))
    with warehouse.engine.connect() as conn:
        staged = dict(conn.execute(select(canonical_records.c.line_no, canonical_records.c.payload)).all())
        chunks = list(iter_canonical_chunks(conn, "b", 5))
    carried = [record for chunk in chunks for record in chunk]
    assert [len(chunk) for chunk in chunks] == [5, 5, 3]
    assert all(type(record.payload) is EncodedJson for record in carried)
    assert {record.line_no: json_text.decoded(record.payload) for record in carried} == staged
    deduplicate_batch(warehouse, "b", "run-b", LadderSettings(chunk_size=5))
    with warehouse.engine.connect() as conn:
        stored = dict(conn.execute(select(records.c.natural_key, records.c.payload)).all())
        superseded = conn.execute(select(record_history.c.payload)).scalar_one()
    assert stored == {payload["url"]: payload for line, payload in staged.items() if line != 4}
    assert superseded == staged[4] and stored[staged[4]["url"]] == staged[13]
    assert stored[staged[1]["url"]]["dims"][1] == 100000000000000000000000000001


@pytest.mark.parametrize("warehouse_url", ["postgresql"], indirect=True)
def test_the_exact_rung_reads_a_fresh_batch_in_index_order(warehouse, tmp_path):
    """Each chunk's query walks the primary key: no sort of the batch's remaining lines per chunk."""
    lines = ANALYZE_FLOOR + 1000  # smaller batches are left to autovacuum: a few sorts of little cost
    write_batch(tmp_path, "big", [listing(n) for n in range(lines)])
    ingest_raw_batch(warehouse, find_batch(tmp_path, "big"))
    canonicalise_batch(warehouse, "big", LadderSettings(chunk_size=2000))
    query = canonical_chunk_query("big", lines // 2, 2000).compile(
        warehouse.engine, compile_kwargs={"literal_binds": True}
    )
    with warehouse.engine.connect() as conn:
        plan = "\n".join(conn.execute(text(f"EXPLAIN {query}")).scalars())
    assert "canonical_records_pkey" in plan and "Sort" not in plan, plan


def _staged_batch_of_30(warehouse, tmp_path) -> LadderSettings:
    """Batch "b": 30 distinct listings, staged up to the exact rung, which takes them in chunks of 7."""
    folder = tmp_path / "landing"
    write_batch(folder, "b", [listing(n) for n in range(30)], landed=1_700_000_000)
    settings = LadderSettings(chunk_size=7)
    ingest_raw_batch(warehouse, find_batch(folder, "b"))
    canonicalise_batch(warehouse, "b", settings)
    return settings


def _dies_after(monkeypatch, chunks: int):
    """The warehouse connection drops as the exact rung writes its chunk number `chunks` + 1 (of this run)."""
    from sqlalchemy.exc import OperationalError

    from dedup_pipeline.ladder import exact as exact_rung

    real, calls = exact_rung.apply_plan, []

    def drops(*args, **kwargs):
        calls.append(1)
        if len(calls) == chunks + 1:
            raise OperationalError("INSERT ...", {}, Exception("server closed the connection unexpectedly"))
        return real(*args, **kwargs)

    monkeypatch.setattr(exact_rung, "apply_plan", drops)
    return lambda: monkeypatch.setattr(exact_rung, "apply_plan", real)


def _decided_lines(warehouse, run_id: str) -> list[int]:
    with warehouse.engine.connect() as conn:
        return sorted(
            conn.execute(select(dedup_decisions.c.line_no).where(dedup_decisions.c.run_id == run_id)).scalars()
        )


def _counted(warehouse) -> dict:
    """What the counters say: the sums of every finished run's figures."""
    from dedup_pipeline.metrics import totals

    with warehouse.engine.connect() as conn:
        return dict(+totals(conn)["decisions"])


def test_a_retried_step_resumes_its_run_and_decides_each_line_once(warehouse, tmp_path, monkeypatch):
    """Breaks: the warehouse connection drops after the exact rung committed some chunks of a batch, and the step
    is retried under the same run id (Dagster's RetryPolicy does that).

    Must hold: the retry resumes after the last committed chunk: one decision per line in the run, and the run's
    figures (report, `exact_rung_runs`, the counters) are the whole batch's, all `new` (once, the committed
    lines were decided again, as exact duplicates, and the figures said so).
    """
    from sqlalchemy.exc import OperationalError

    from dedup_pipeline.store.schema import exact_rung_runs

    settings = _staged_batch_of_30(warehouse, tmp_path)
    heal = _dies_after(monkeypatch, 2)
    with pytest.raises(OperationalError):
        deduplicate_batch(warehouse, "b", "run-1", settings)
    heal()
    assert count(warehouse, records) == 14  # two chunks committed
    report = deduplicate_batch(warehouse, "b", "run-1", settings)
    assert (report.records_in, dict(+report.decisions)) == (30, {"new": 30})
    with warehouse.engine.connect() as conn:
        stats = conn.execute(select(exact_rung_runs.c.stats).where(exact_rung_runs.c.run_id == "run-1")).scalar_one()
    assert _decided_lines(warehouse, "run-1") == list(range(1, 31))
    assert stats["new"] == 30 and stats.get("exact_duplicate", 0) == 0
    assert count(warehouse, records) == 30


def test_a_new_run_takes_over_the_chunks_of_runs_that_did_not_finish(warehouse, tmp_path, monkeypatch):
    """Breaks: two runs of a partition die part-way (a dropped connection, a killed process) after committing
    some chunks; a third run of the partition (a re-execution, `dedup-pipeline run` again) finishes it.

    Must hold: the third run resumes after the last committed chunk and reports the whole batch as `new`, and
    so do the counters (once, the lines the dead runs committed were decided again as exact duplicates of
    themselves: a batch of distinct records showed a 20% collapse). A run after that, of a finished batch,
    decides every line again (all exact duplicates) and takes nothing over.
    """
    from sqlalchemy.exc import OperationalError

    settings = _staged_batch_of_30(warehouse, tmp_path)
    for run_id in ("run-1", "run-2"):
        heal = _dies_after(monkeypatch, 1)
        with pytest.raises(OperationalError):
            deduplicate_batch(warehouse, "b", run_id, settings)
        heal()
    assert _decided_lines(warehouse, "run-1") == list(range(1, 8))
    assert _decided_lines(warehouse, "run-2") == list(range(8, 15))
    report = deduplicate_batch(warehouse, "b", "run-3", settings)
    assert (report.records_in, dict(+report.decisions)) == (30, {"new": 30})
    assert _decided_lines(warehouse, "run-3") == list(range(15, 31))
    assert _counted(warehouse) == {"new": 30}

    again = deduplicate_batch(warehouse, "b", "run-4", settings)
    assert (again.records_in, dict(+again.decisions)) == (30, {"exact_duplicate": 30})
    assert _counted(warehouse) == {"new": 30, "exact_duplicate": 30}
    assert count(warehouse, records) == 30


def test_a_run_that_committed_every_chunk_but_did_not_finish_is_taken_over_once(warehouse, tmp_path, monkeypatch):
    """Breaks: a run commits every chunk of the batch, then dies before it records its figures; the next run
    has no line left to decide.

    Must hold: that run reports (and counts) the whole batch as `new`; a later run of the finished batch
    decides every line again instead of taking the dead run's decisions over a second time.
    """
    from dedup_pipeline.ladder import exact as exact_rung

    settings = _staged_batch_of_30(warehouse, tmp_path)
    real = exact_rung.record_rung_run

    def dies(*args, **kwargs):
        raise ConnectionResetError("the process died before its figures were written")

    monkeypatch.setattr(exact_rung, "record_rung_run", dies)
    with pytest.raises(ConnectionResetError):
        deduplicate_batch(warehouse, "b", "run-1", settings)
    monkeypatch.setattr(exact_rung, "record_rung_run", real)
    taken_over = deduplicate_batch(warehouse, "b", "run-2", settings)
    assert dict(+taken_over.decisions) == {"new": 30} and _decided_lines(warehouse, "run-2") == []
    again = deduplicate_batch(warehouse, "b", "run-3", settings)
    assert dict(+again.decisions) == {"exact_duplicate": 30}
    assert _counted(warehouse) == {"new": 30, "exact_duplicate": 30}


@pytest.mark.parametrize("warehouse_url", ["postgresql"], indirect=True)
def test_runs_of_one_batch_take_its_exact_rung_in_turn(warehouse, warehouse_url, tmp_path, monkeypatch):
    """Breaks: two runs of the same partition reach the exact rung at the same time.

    Must hold: the second waits for the first (it would otherwise take the live run's committed chunks over
    as a dead run's, and both would count them): one reports all `new`, the other all exact duplicates.
    """
    from dedup_pipeline.ladder import exact as exact_rung

    settings = _staged_batch_of_30(warehouse, tmp_path)
    real, calls, reports = exact_rung.apply_plan, [], {}
    second = threading.Thread(target=lambda: reports.update(run_2=deduplicate_batch(warehouse, "b", "run-2", settings)))

    def second_run_starts_mid_way(conn, plan, version, batch_id, run_id, *args, **kwargs):
        if run_id == "run-1":
            calls.append(1)
            if len(calls) == 3:  # run-1 has committed two chunks
                second.start()
                second.join(timeout=2)  # time enough for run-2 to take them over, were it let in
        return real(conn, plan, version, batch_id, run_id, *args, **kwargs)

    monkeypatch.setattr(exact_rung, "apply_plan", second_run_starts_mid_way)
    reports["run_1"] = deduplicate_batch(warehouse, "b", "run-1", settings)
    second.join(timeout=60)
    reports = list(reports.values())
    assert sorted(tuple(+r.decisions) for r in reports) == [("exact_duplicate",), ("new",)]
    assert all(r.records_in == 30 for r in reports)
    assert _counted(warehouse) == {"new": 30, "exact_duplicate": 30}
