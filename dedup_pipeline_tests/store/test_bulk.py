"""Bulk writes: COPY on PostgreSQL, executemany on SQLite."""

from __future__ import annotations

from datetime import UTC

from sqlalchemy import select


def test_json_columns_take_values_or_with_json_as_text_the_text_a_worker_encoded(warehouse):
    """Both arrive as the same JSON value; `json_as_text` only spares the pass over every row."""
    from datetime import datetime

    from dedup_pipeline.store.bulk import copy_rows
    from dedup_pipeline.store.schema import exact_rung_runs

    now = datetime(2026, 12, 1, tzinfo=UTC)
    columns = ("batch_id", "run_id", "finished_at", "stats")
    with warehouse.engine.begin() as conn:
        copy_rows(conn, exact_rung_runs, columns, [("a", "r", now, {"n": 1, "s": "ü"})])
        copy_rows(conn, exact_rung_runs, columns, [("b", "r", now, '{"n": 2, "s": "ü"}')], json_as_text=True)
    with warehouse.engine.connect() as conn:
        stored = conn.execute(select(exact_rung_runs.c.stats).order_by(exact_rung_runs.c.batch_id)).scalars().all()
    assert stored == [{"n": 1, "s": "ü"}, {"n": 2, "s": "ü"}]


def _statements(engine):
    """A list that every statement the engine sends is appended to, with whether it went once per row."""
    from sqlalchemy import event

    sent: list[tuple[str, bool]] = []

    def record(conn, cursor, statement, parameters, context, executemany):
        sent.append((statement, executemany))

    event.listen(engine, "before_cursor_execute", record)
    return sent


def test_insert_rows_and_update_rows_write_every_row_and_on_postgresql_in_one_statement(warehouse):
    """Rows of every column type the near rung sends (ids, floats, text, booleans, digests), a conflict kept
    as stored, and per-row values in an UPDATE's SET and WHERE; PostgreSQL gets one statement for each call."""
    from sqlalchemy import update

    from dedup_pipeline.store.bulk import insert_rows, update_rows
    from dedup_pipeline.store.schema import near_duplicate_clusters as clusters
    from dedup_pipeline.store.schema import near_duplicate_links as links
    from dedup_pipeline.store.schema import near_index, records
    from dedup_pipeline.store.warehouse import upsert_ignore, utcnow

    now = utcnow()
    stored = {
        "url_version": "url/1",
        "hash_version": "content/1",
        "payload": {},
        "first_seen_at": now,
        "last_crawled_at": now,
        "first_batch_id": "b",
        "last_batch_id": "b",
        "last_landed_at": now,
        "last_line_no": 1,
    }
    index_row = {"first_landed_us": 0, "first_seen_us": 0, "key_order": 0, "signature": b"s"}
    with warehouse.engine.begin() as conn:
        for rid in (1, 2, 3):
            key = f"https://example.com/{rid}"
            conn.execute(
                records.insert().values(
                    record_id=rid, natural_key=key, canonical_url=key, content_hash=bytes([rid]) * 32, **stored
                )
            )
            conn.execute(near_index.insert().values(record_id=rid, content_hash=bytes(32), **index_row))
        conn.execute(links.insert().values(record_a=1, record_b=2, similarity=0.9, method="minhash", batch_id="old"))
    sent = _statements(warehouse.engine)
    with warehouse.engine.begin() as conn:
        insert_rows(
            conn,
            upsert_ignore(conn, links),
            [
                {"record_a": 1, "record_b": 2, "similarity": 0.5, "method": "minhash", "batch_id": "new"},
                {"record_a": 1, "record_b": 3, "similarity": 0.75, "method": "simhash", "batch_id": "new"},
            ],
        )
        insert_rows(
            conn, clusters.insert(), [{"record_id": r, "cluster_id": 1, "is_representative": r == 1} for r in (1, 2, 3)]
        )
        update_rows(
            conn,
            lambda v: (
                update(clusters)
                .where(clusters.c.record_id == v["rid"])
                .values(cluster_id=v["cid"], is_representative=v["rep"])
            ),
            {
                "rid": clusters.c.record_id.type,
                "cid": clusters.c.cluster_id.type,
                "rep": clusters.c.is_representative.type,
            },
            [(2, 2, True), (3, 2, False)],
        )
        update_rows(
            conn,
            lambda v: update(near_index).where(near_index.c.record_id == v["rid"]).values(content_hash=v["digest"]),
            {"rid": near_index.c.record_id.type, "digest": near_index.c.content_hash.type},
            [(1, b"\x01" * 32), (3, b"\x03" * 32)],
        )
        insert_rows(conn, clusters.insert(), [])  # nothing to write: no statement
    if warehouse.engine.dialect.name == "postgresql":
        assert [many for _, many in sent] == [False] * 4
    with warehouse.engine.connect() as conn:
        assert sorted(
            map(tuple, conn.execute(select(links.c.record_a, links.c.record_b, links.c.similarity, links.c.batch_id)))
        ) == [
            (1, 2, 0.9, "old"),
            (1, 3, 0.75, "new"),
        ]
        assert sorted(map(tuple, conn.execute(select(clusters)))) == [(1, 1, True), (2, 2, True), (3, 2, False)]
        digests = dict(conn.execute(select(near_index.c.record_id, near_index.c.content_hash)).all())
    assert {rid: bytes(d) for rid, d in digests.items()} == {1: b"\x01" * 32, 2: bytes(32), 3: b"\x03" * 32}


def test_in_values_finds_the_rows_asked_for_by_integers_beyond_32_bits_and_by_text(warehouse):
    """One array parameter on PostgreSQL, a plain IN on SQLite: both find exactly the rows asked for, by an integer
    column (values past 2**31 included) or a text one, and no values find none."""
    from dedup_pipeline.store.bulk import in_values
    from dedup_pipeline.store.schema import crawl_batches
    from dedup_pipeline.store.warehouse import utcnow

    sizes = [5, 2**40 + 1, 2**62, 7]
    row = {"file_path": "p", "file_sha256": "0" * 64, "lines": 1, "parsed": 1, "quarantined": 0}
    with warehouse.engine.begin() as conn:
        for size in sizes:
            conn.execute(
                crawl_batches.insert().values(
                    batch_id=f"b{size}", file_bytes=size, landed_at=utcnow(), registered_at=utcnow(), **row
                )
            )
    c = crawl_batches.c
    with warehouse.engine.connect() as conn:

        def found(column, values) -> list:
            return sorted(conn.execute(select(c.batch_id).where(in_values(conn, column, values))).scalars())

        assert found(c.file_bytes, [5, 2**40 + 1, 2**62, 8]) == sorted(["b5", f"b{2**40 + 1}", f"b{2**62}"])
        assert found(c.batch_id, ["b7", "b8"]) == ["b7"]
        assert found(c.file_bytes, []) == []
