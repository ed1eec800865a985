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
