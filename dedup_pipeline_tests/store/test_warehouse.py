"""The warehouse engine and schema on the real PostgreSQL: created by many processes at once, never hanging."""

from __future__ import annotations

import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy import create_engine, inspect, text

from dedup_pipeline.store.schema import metadata
from dedup_pipeline.store.warehouse import Warehouse
from dedup_pipeline_tests.helpers import database_url, fresh_database

REPO = Path(__file__).resolve().parents[2]


@contextmanager
def empty_database():
    with fresh_database("dedup_test_schema") as name:
        yield database_url(name)


def test_processes_creating_a_new_warehouse_at_once_all_succeed():
    """Breaks: four processes (two `dedup-pipeline run`s, say) create the tables of an empty warehouse together.

    Must hold: each succeeds (once, all but one failed on a duplicate type in PostgreSQL's catalogue), and the
    schema is whole.
    """
    with empty_database() as url:
        code = f"from dedup_pipeline.store.warehouse import Warehouse; Warehouse({url!r}).create_schema()"
        processes = [subprocess.Popen([sys.executable, "-c", code], cwd=REPO, stderr=subprocess.PIPE) for _ in range(4)]
        failures = [p.stderr.read().decode()[-500:] for p in processes if p.wait(timeout=120) != 0]
        assert not failures, failures
        engine = create_engine(url)
        assert set(metadata.tables) <= set(inspect(engine).get_table_names())
        engine.dispose()


def test_connections_give_up_on_a_silent_server_and_a_forgotten_transaction_unless_the_url_says_otherwise():
    with empty_database() as url:
        for query, expected in (("", "10min"), ("?options=-c%20idle_in_transaction_session_timeout%3D2000", "2s")):
            warehouse = Warehouse(url + query)
            with warehouse.engine.connect() as conn:
                assert conn.execute(text("SHOW idle_in_transaction_session_timeout")).scalar() == expected
                assert conn.connection.driver_connection.info.get_parameters()["connect_timeout"] == "10"
            warehouse.dispose()


def test_libpq_environment_settings_still_apply(monkeypatch):
    """PGOPTIONS and PGCONNECT_TIMEOUT, which an explicit parameter would silently override, keep their effect."""
    monkeypatch.setenv("PGOPTIONS", "-c statement_timeout=5000")
    monkeypatch.setenv("PGCONNECT_TIMEOUT", "30")
    with empty_database() as url:
        warehouse = Warehouse(url)
        with warehouse.engine.connect() as conn:
            assert conn.execute(text("SHOW statement_timeout")).scalar() == "5s"
            assert conn.execute(text("SHOW idle_in_transaction_session_timeout")).scalar() == "10min"
            assert conn.connection.driver_connection.info.get_parameters()["connect_timeout"] == "30"
        warehouse.dispose()


def test_a_url_s_own_options_keep_the_idle_in_transaction_timeout():
    with empty_database() as url:
        warehouse = Warehouse(url + "?options=-c%20statement_timeout%3D5000")
        with warehouse.engine.connect() as conn:
            assert conn.execute(text("SHOW statement_timeout")).scalar() == "5s"
            assert conn.execute(text("SHOW idle_in_transaction_session_timeout")).scalar() == "10min"
        warehouse.dispose()


def test_price_changes_relabel_index_rows_in_place_also_in_a_warehouse_made_before_the_fillfactor():
    """Breaks: a re-crawl with the same text and a new price re-labels its near-index row's digest; on a full
    page that update writes the row anew with an entry in each of its 27 indexes. Must hold: `create_schema` gives
    a warehouse made without the schema's fillfactor that fillfactor; rows written after it fill a page with 23
    rows of 26 bands (no alignment padding in a row, 16 bytes of the digest), and two re-labels on every page are
    then made in place (HOT)."""
    from dedup_pipeline.store.bulk import copy_rows
    from dedup_pipeline.store.near import update_digests
    from dedup_pipeline.store.schema import NEAR_INDEX_FILLFACTOR, RECORD_COLUMNS, near_index, records

    with empty_database() as url:
        warehouse = Warehouse(url).create_schema()

        def options() -> list[str]:
            with warehouse.engine.connect() as conn:
                return conn.execute(text("SELECT reloptions FROM pg_class WHERE relname = 'near_index'")).scalar()

        try:
            assert options() == [f"fillfactor={NEAR_INDEX_FILLFACTOR}"]
            with warehouse.engine.begin() as conn:
                conn.execute(text("ALTER TABLE near_index RESET (fillfactor)"))  # as older code made it
            assert options() is None
            warehouse.create_schema()
            assert options() == [f"fillfactor={NEAR_INDEX_FILLFACTOR}"]

            n = 2000
            with warehouse.engine.begin() as conn:
                now = conn.execute(text("SELECT now()")).scalar()
                copy_rows(
                    conn,
                    records,
                    RECORD_COLUMNS,
                    [
                        (rid, f"k{rid}", f"https://e.com/{rid}", "url/1", "content/1", rid.to_bytes(32, "big"), {}, now)
                        + (now, "b", "b", now, rid)
                        for rid in range(1, n + 1)
                    ],
                )
                copy_rows(
                    conn,
                    near_index,
                    ("record_id", "content_hash", "first_landed_us", "first_seen_us", "key_order", "signature")
                    + tuple(f"b{b}" for b in range(26)),
                    [(rid, bytes(16), 0, 0, 0, bytes(128)) + tuple(range(rid, rid + 26)) for rid in range(1, n + 1)],
                )
                pages = conn.execute(
                    text(
                        "SELECT (ctid::text::point)[0] AS page, array_agg(record_id ORDER BY record_id) "
                        "FROM near_index GROUP BY 1 ORDER BY 1"
                    )
                ).all()
            assert max(len(ids) for _, ids in pages) == 23
            changed = [rid for _, ids in pages for rid in ids[:2]]  # two on every page
            with warehouse.engine.begin() as conn:
                update_digests(conn, {rid: b"\x01" * 32 for rid in changed})
                updated, in_place = conn.execute(
                    text("SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_xact_user_tables WHERE relname = 'near_index'")
                ).one()
            assert (updated, in_place) == (len(changed), len(changed))
        finally:
            warehouse.dispose()
