"""Shared fixtures: a warehouse on SQLite and on the real PostgreSQL, each test in its own database state."""

from __future__ import annotations

import os
import secrets
import socket
import threading
from contextlib import ExitStack

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.exc import OperationalError

from dedup_pipeline.environment import TOMBSTONE_KEY_ENV
from dedup_pipeline.store.schema import metadata
from dedup_pipeline.store.warehouse import Warehouse
from dedup_pipeline_tests.helpers import PG_ADMIN_URL, database_url, fresh_database


@pytest.fixture(autouse=True, scope="session")
def keep_ephemeral_instances_alive():
    """Keep every test's ephemeral Dagster instance alive until the session ends.

    Dagster's storages hold only a weak reference to their instance, and the
    module-level `defs` (shared by all tests of a worker) caches objects that
    reach such storages (the definitions' load context takes one from
    `DagsterInstance.get()`). When such an instance is garbage collected, a later
    test could fail with "Attempted to resolve undefined DagsterInstance
    weakref" depending on test order and GC timing. Holding the instances makes
    that impossible; each is a small in-memory store.
    """
    import dagster as dg

    kept = []
    originals = {name: getattr(dg.DagsterInstance, name) for name in ("ephemeral", "get")}  # staticmethods

    def keeping(make):
        def wrapper(*args, **kwargs):
            instance = make(*args, **kwargs)
            kept.append(instance)
            return instance

        return staticmethod(wrapper)

    for name, make in originals.items():
        setattr(dg.DagsterInstance, name, keeping(make))
    yield kept
    for name, make in originals.items():
        setattr(dg.DagsterInstance, name, staticmethod(make))


@pytest.fixture(autouse=True, scope="session")
def no_stale_defs_state_storage():
    """Never hand Dagster a "current" definitions-state storage in the test process.

    Dagster keeps that storage in a context variable which `with instance:` sets and resets by token.
    A context object that entered an instance and is only finalised later (by the garbage collector,
    in the middle of another test) resets the variable to whatever was current back then: the storage
    of an instance that is gone or whose temporary directory was removed. Loading `defs` then fails
    ("undefined DagsterInstance weakref", "unable to open database file"), depending on GC timing.
    The storage only serves state-backed definitions, which this project has none of, so in-process
    tests run as a process that never entered an instance does. Subprocesses (`dagster dev`, the CLI)
    are untouched.
    """
    from dagster._core.storage.defs_state.base import DefsStateStorage

    original = DefsStateStorage.__dict__["get"]
    DefsStateStorage.get = classmethod(lambda cls: None)
    yield
    DefsStateStorage.get = original


@pytest.fixture(autouse=True, scope="session")
def session_data_dir(tmp_path_factory):
    """DEDUP_DATA_DIR for what runs before any test's own (module and session fixtures, their subprocesses).

    The embedded default keeps files there (a Bloom seen-set, for one), by default in the working
    directory: never let a test write into the checkout's `.dedup`, where `make demo` keeps its own.
    """
    previous = os.environ.get("DEDUP_DATA_DIR")
    os.environ["DEDUP_DATA_DIR"] = str(tmp_path_factory.mktemp("dedup-data-session"))
    yield
    if previous is None:
        del os.environ["DEDUP_DATA_DIR"]
    else:
        os.environ["DEDUP_DATA_DIR"] = previous


@pytest.fixture(autouse=True)
def data_dir_of_its_own(tmp_path_factory, monkeypatch):
    """Give each test a DEDUP_DATA_DIR of its own (see `session_data_dir`); one it sets itself still wins."""
    monkeypatch.setenv("DEDUP_DATA_DIR", str(tmp_path_factory.mktemp("dedup-data")))


@pytest.fixture(scope="session")
def pg_database_url():
    """A fresh PostgreSQL database for this test session, dropped at the end."""
    with ExitStack() as stack:
        try:
            name = stack.enter_context(fresh_database("dedup_test"))
        except OperationalError as exc:  # say clearly what is missing
            pytest.fail(f"PostgreSQL is required at {PG_ADMIN_URL} (start it, see .ci/run): {exc}")
        yield database_url(name)


@pytest.fixture(params=["sqlite", "postgresql"])
def warehouse_url(request, tmp_path):
    """A warehouse URL with an empty schema: a SQLite file, or the session's PostgreSQL database."""
    from dedup_pipeline.defs.resources import _warehouse

    _warehouse.cache_clear()  # a process-wide Warehouse made by an earlier test has not seen this schema reset
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'warehouse.sqlite'}"
        return
    url = request.getfixturevalue("pg_database_url")
    engine = create_engine(url)
    metadata.drop_all(engine)
    with engine.begin() as conn:  # tables outside the metadata (later migrations) go too
        conn.execute(text("DROP SCHEMA public CASCADE; CREATE SCHEMA public"))
    engine.dispose()
    yield url


@pytest.fixture
def warehouse(warehouse_url):
    wh = Warehouse(warehouse_url).create_schema()
    yield wh
    wh.dispose()


@pytest.fixture
def hung_redis_url():
    """A server that accepts connections and never answers (a Redis stuck in a long command, a dead proxy)."""
    connections: list[socket.socket] = []
    server = socket.create_server(("127.0.0.1", 0))

    def accept() -> None:
        while True:
            try:
                connections.append(server.accept()[0])
            except OSError:  # closed at teardown
                return

    threading.Thread(target=accept, daemon=True).start()
    yield f"redis://127.0.0.1:{server.getsockname()[1]}/0", connections
    server.close()
    for connection in connections:
        connection.close()


@pytest.fixture
def tombstone_key(monkeypatch):
    """A fresh $DEDUP_TOMBSTONE_KEY for the test (the erasure tests use it; see pytestmark there)."""
    key = secrets.token_hex(32)
    monkeypatch.setenv(TOMBSTONE_KEY_ENV, key)
    return key
