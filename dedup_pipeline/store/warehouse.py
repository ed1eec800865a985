"""Connecting to the warehouse: SQLite by default, PostgreSQL when DEDUP_DATABASE_URL is set."""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, create_engine, event, inspect, select, text
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError

from dedup_pipeline import environment
from dedup_pipeline.core.errors import ConfigurationError
from dedup_pipeline.core.hashing import HASH_RULES, INITIAL_ACTIVE_VERSION
from dedup_pipeline.core.url import URL_VERSION, URL_VERSIONS
from dedup_pipeline.store import json_text
from dedup_pipeline.store.schema import crawl_batches, hash_version_events, metadata, records, settings
from dedup_pipeline.store.tombstones import use_key

log = logging.getLogger(__name__)
ACTIVE_HASH_VERSION = "active_hash_version"
ACTIVE_URL_VERSION = "active_url_version"
#: The URL version of a warehouse made before URL versions were a setting (it has a hash version and no URL one).
LEGACY_URL_VERSION = "url/1"


def data_dir() -> Path:
    """Where the embedded default keeps its files: $DEDUP_DATA_DIR, else ./.dedup."""
    return environment.data_dir()


def default_database_url() -> str:
    """$DEDUP_DATABASE_URL, else a SQLite file in the data folder."""
    return environment.database_url() or f"sqlite:///{data_dir() / 'warehouse.sqlite'}"


def utcnow() -> datetime:
    return datetime.now(UTC)


def as_utc(moment: datetime) -> datetime:
    """SQLite hands back naive datetimes; everything here is UTC."""
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


def _sqlite_pragmas(dbapi_connection, _record) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.close()


_JSON_CODEC = {"json_serializer": json_text.dumps, "json_deserializer": json_text.loads}


def _engine(url: str, **options) -> Engine:
    """`create_engine` for every engine the project makes: bound values never enter error text.

    SQLAlchemy otherwise appends a failed statement's parameters to its exception (`[parameters: {...}]`), and
    an erasure's are the subject's value: a lock timeout or a dropped connection would carry it into the
    Dagster event log, the compute logs and stderr.
    """
    return create_engine(url, hide_parameters=True, **options)


#: libpq settings of every PostgreSQL connection, unless the warehouse URL gives its own. Without them a server
#: that stops answering (a dead host, a half-open connection) hangs a step for ever, and a transaction of a
#: vanished worker keeps its locks (the erasure lock among them) until the OS notices, about two hours later.
PG_CONNECT_DEFAULTS = {
    "connect_timeout": 10,  # seconds to reach the server
    "keepalives": 1,
    "keepalives_idle": 30,
    "keepalives_interval": 10,
    "keepalives_count": 3,  # a silent peer: ~1 min
    "tcp_user_timeout": 60_000,  # ms: data the server has not acknowledged for a minute ends the connection
    # Server side: a transaction left idle for 10 minutes (its client gone or stuck) is ended, its locks freed.
    "options": "-c idle_in_transaction_session_timeout=600000",
}


def parse_url(url: str) -> URL:
    """The warehouse URL parsed, or a ConfigurationError for one SQLAlchemy cannot use."""
    try:
        parsed = make_url(url)
        parsed.get_dialect()
    except ArgumentError as exc:  # a setting to fix (`postgres://`, a typo), not a fault of the code
        raise ConfigurationError(
            f"the warehouse URL is not one SQLAlchemy can use ({exc}); PostgreSQL is postgresql+psycopg://user@host/db"
        ) from None
    return parsed


def make_engine(url: str) -> Engine:
    """An engine with the settings each backend needs for concurrent pipeline steps (and no values in its errors)."""
    parsed = parse_url(url)
    if parsed.get_backend_name() == "sqlite":
        if parsed.database and parsed.database != ":memory:":
            Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
        engine = _engine(url, connect_args={"timeout": 120}, **_JSON_CODEC)
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    return _engine(url, pool_pre_ping=True, connect_args=pg_connect_args(parsed.query), **_JSON_CODEC)


#: libpq's environment variables for the defaults that have one: the operator's environment wins too.
_PG_ENVIRONMENT = {"connect_timeout": "PGCONNECT_TIMEOUT", "options": "PGOPTIONS"}


def pg_connect_args(query: Mapping[str, Any]) -> dict[str, Any]:
    """`PG_CONNECT_DEFAULTS` less what the URL's query or libpq's environment sets; the options the URL or
    `PGOPTIONS` gives are kept, with the idle-in-transaction timeout added unless they set one."""
    args = {}
    for name, value in PG_CONNECT_DEFAULTS.items():
        variable = _PG_ENVIRONMENT.get(name)
        if name in query or (variable and environment.libpq_setting(variable) and name != "options"):
            continue
        args[name] = value
    # Explicit options replace PGOPTIONS, and the URL's replace both: carry theirs along, adding the timeout.
    given = query.get("options") or environment.libpq_setting("PGOPTIONS")
    if isinstance(given, (tuple, list)):
        given = " ".join(given)
    if "idle_in_transaction_session_timeout" in given:
        args.pop("options", None)
    else:
        args["options"] = f"{given} {PG_CONNECT_DEFAULTS['options']}".strip()
    return args


_SCHEMA_LOCK = int.from_bytes(hashlib.sha256(b"dedup:schema").digest()[:8], "big", signed=True)


class Warehouse:
    """The warehouse: an engine plus the schema and the settings that live in it.

    `tombstone_key` keys its erasure tombstones (`store.tombstones`); None leaves it to $DEDUP_TOMBSTONE_KEY
    when they are asked, as the command line has it. It is kept in memory only.
    """

    def __init__(self, url: str | None = None, engine: Engine | None = None, tombstone_key: str | None = None):
        self.url = url or default_database_url()
        self.engine = engine or make_engine(self.url)
        if tombstone_key:
            use_key(self.engine, tombstone_key)

    @classmethod
    def existing(cls, url: str | None = None) -> Warehouse:
        """The warehouse at `url` (default: the configured one), for a command that must not create one.

        Nothing is created there, not even a SQLite file: where there is no
        warehouse (a typo in the URL, an empty database, the wrong path), a
        ConfigurationError names the URL, its password hidden; one of an
        older version that lacks a newer table is named as such.
        """
        url = url or default_database_url()
        parsed = parse_url(url)
        shown = parsed.render_as_string(hide_password=True)
        sqlite = parsed.get_backend_name() == "sqlite"
        if sqlite and not (parsed.database and Path(parsed.database).is_file()):
            raise ConfigurationError(f"there is no dedup_pipeline warehouse at {shown}: no such file")
        # SQLite: a bare engine, whose connection leaves a file that is not ours as it was (no WAL pragma).
        probe = _engine(url) if sqlite else make_engine(url)
        try:
            with probe.connect() as conn:
                missing = sorted(set(metadata.tables) - set(inspect(conn).get_table_names()))
        finally:
            probe.dispose()
        if records.name in missing:
            raise ConfigurationError(f"there is no dedup_pipeline warehouse at {shown}: it has no {records.name} table")
        if missing:  # a warehouse of an older version
            raise ConfigurationError(
                f"the dedup_pipeline warehouse at {shown} lacks the tables {', '.join(missing)}: "
                "a `dedup-pipeline run` of this version adds them"
            )
        return cls(url)

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    def create_schema(self) -> Warehouse:
        """Create missing tables and initial settings; safe to call on every run, from many processes at once."""
        with self.engine.begin() as conn:
            if conn.dialect.name == "postgresql":  # two processes creating a new warehouse's tables would collide
                conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _SCHEMA_LOCK})
            metadata.create_all(conn)
            _declared_storage(conn)
            new = read_setting(conn, ACTIVE_HASH_VERSION) is None
            initial = {ACTIVE_HASH_VERSION: INITIAL_ACTIVE_VERSION, ACTIVE_URL_VERSION: URL_VERSION}
            if not new:  # a warehouse of older code keeps its keys: url/1 until `dedup-pipeline migrate-url`
                initial = {ACTIVE_URL_VERSION: LEGACY_URL_VERSION}
            for name, value in initial.items():
                if read_setting(conn, name) is None:
                    conn.execute(upsert_ignore(conn, settings).values(name=name, value=value, updated_at=utcnow()))
        return self

    def active_hash_version(self) -> str:
        with self.engine.connect() as conn:
            return active_hash_version(conn)

    def dispose(self) -> None:
        self.engine.dispose()


def _declared_storage(conn: Connection) -> None:
    """Give the tables of a warehouse made by older code the storage parameters the schema declares now
    (`postgresql_with`, such as a fillfactor), where this role owns them: they apply to pages written from then on."""
    if conn.dialect.name != "postgresql":
        return
    for table in metadata.tables.values():
        declared = {f"{name}={value}" for name, value in (table.dialect_options["postgresql"]["with"] or {}).items()}
        if not declared:
            continue
        options, owned = conn.execute(
            text(
                "SELECT coalesce(reloptions, '{}'), pg_has_role(relowner, 'USAGE') FROM pg_class "
                "WHERE oid = to_regclass(:name)"
            ),
            {"name": table.name},
        ).one()
        if owned and not declared <= set(options):
            conn.execute(text(f"ALTER TABLE {table.name} SET ({', '.join(sorted(declared))})"))


def read_setting(conn: Connection, name: str) -> str | None:
    return conn.execute(select(settings.c.value).where(settings.c.name == name)).scalar_one_or_none()


def batch_registered(conn: Connection, batch_id: str) -> bool:
    """Whether the raw rung registered `batch_id` (its file landed and was read)."""
    found = conn.execute(select(crawl_batches.c.batch_id).where(crawl_batches.c.batch_id == batch_id)).first()
    return found is not None


def retired_hash_versions(conn: Connection) -> set[str]:
    """Versions retired (`retire_hash_version`) and not made active again since: the ladder computes them no more."""
    e = hash_version_events.c
    retired: set[str] = set()
    events = select(e.action, e.from_version, e.to_version).where(e.action.in_(["retire", "switch"]))
    for action, from_version, to_version in conn.execute(events.order_by(e.event_id)):
        if action == "retire":
            retired.add(from_version)
        else:
            retired.discard(to_version)
    return retired


def active_hash_version(conn: Connection) -> str:
    """The hash version dedup decisions use; it lives in the warehouse, not in code."""
    version = read_setting(conn, ACTIVE_HASH_VERSION) or INITIAL_ACTIVE_VERSION
    if version not in HASH_RULES:
        raise RuntimeError(f"warehouse names hash version {version!r}, which this code does not know")
    return version


def active_url_version(conn: Connection) -> str:
    """The URL version of the warehouse's keys (`url/2` on a new one); it lives in the warehouse, not in code."""
    version = read_setting(conn, ACTIVE_URL_VERSION) or LEGACY_URL_VERSION
    if version not in URL_VERSIONS:
        raise RuntimeError(f"warehouse names URL version {version!r}, which this code does not know")
    return version


def upsert_ignore(conn: Connection, table):
    """INSERT ... ON CONFLICT DO NOTHING for the connection's dialect."""
    if conn.dialect.name == "postgresql":
        from sqlalchemy.dialects.postgresql import insert
    else:
        from sqlalchemy.dialects.sqlite import insert
    return insert(table).on_conflict_do_nothing()


def _analyze_statement(table, columns: Sequence[str] = ()) -> str:
    return f"{table.name} ({', '.join(columns)})" if columns else table.name


def _analysable_counts(conn: Connection, names: Sequence[str]) -> dict[str, tuple[float, int]]:
    """Name -> (rows the last statistics counted, live rows now) of those tables this role may ANALYZE.

    PostgreSQL lets only the owner of a table or of the database analyse it (and
    a superuser); it skips any other table with a warning. The least-privilege
    writer role (`dedup-pipeline grant-roles`) owns nothing, so under it the
    rungs leave statistics to autovacuum, quietly.
    """
    rows = conn.execute(
        text(
            "SELECT s.relname, greatest(c.reltuples, 0), s.n_live_tup FROM pg_stat_user_tables s "
            "JOIN pg_class c ON c.oid = s.relid "
            "WHERE s.schemaname = current_schema() AND s.relname = ANY(:names) AND ("
            " pg_has_role(c.relowner, 'USAGE')"
            " OR pg_has_role((SELECT datdba FROM pg_database WHERE datname = current_database()), 'USAGE'))"
        ),
        {"names": list(names)},
    ).all()
    return {name: (counted, live) for name, counted, live in rows}


def analyze(conn: Connection, table, columns: Sequence[str] = ()) -> None:
    """Refresh PostgreSQL's planner statistics of `table` now, rather than after autovacuum's next nap.

    `columns` limits the statistics to the columns lookups filter on: several
    times cheaper on wide rows, and the table's row count is refreshed all the same.
    """
    if conn.dialect.name == "postgresql" and _analysable_counts(conn, [table.name]):
        conn.execute(text("ANALYZE " + _analyze_statement(table, columns)))


#: Fewer new rows than this are never worth an ANALYZE: planned badly, they still cost only a few small sorts.
ANALYZE_FLOOR = 10_000


#: The sample of a batch's ANALYZE (`analyze_new_batch`): 3,000 rows, not the default's 30,000. It has only to
#: show the planner that the batch's id holds many rows, and the default's sample cost a random read of up to
#: 30,000 pages of a wide table per batch (0.2 s for `records`, 1.1 s for `canonical_records` at 224,000 stored
#: records; 0.02 and 0.06 s at 10), a cost that grows with the warehouse.
BATCH_STATISTICS_TARGET = 10


def analyze_new_batch(conn: Connection, table, columns: Sequence[str], rows: int) -> None:
    """`analyze` the `columns` a batch's rows are paged by, once the batch wrote `ANALYZE_FLOOR` rows or more,
    on a sample of `BATCH_STATISTICS_TARGET`.

    Statistics that have never seen a batch id estimate its rows at a few dozen, and each page of a
    keyset read then sorts every remaining row of the batch instead of walking the index. The caller's
    transaction does nothing else after it (the sample's setting lasts until its end).
    """
    if rows >= ANALYZE_FLOOR:
        if conn.dialect.name == "postgresql":
            _sample_at(conn, BATCH_STATISTICS_TARGET)
        analyze(conn, table, columns)


def _sample_at(conn: Connection, statistics_target: int) -> None:
    """The sample of this transaction's ANALYZEs: `default_statistics_target`, 300 rows per unit."""
    conn.execute(text(f"SET LOCAL default_statistics_target = {int(statistics_target)}"))


def analyze_grown(
    conn: Connection, tables: Mapping[Any, Sequence[str]], statistics_target: int | None = None
) -> list[str]:
    """ANALYZE those of `tables` (table -> columns, as in `analyze`) that grew by half since their statistics.

    A table filled within one run (the first batch of an empty warehouse) is
    otherwise planned as the near-empty table autovacuum last saw: index
    probes become scans that grow with every chunk. The test compares
    PostgreSQL's live-row counter with the row count of the last statistics
    (which a column-limited ANALYZE refreshes too): growth by half again, and
    by `ANALYZE_FLOOR` rows, so a growing table is analysed a logarithmic number
    of times and a steady one never. A table another session is analysing
    (another worker that saw the same growth) is left to it: ``SKIP_LOCKED``,
    not a wait on its lock. `statistics_target` (PostgreSQL's `default_statistics_target`
    for this ANALYZE) sets the sample: 300 rows per unit, 30,000 at the default 100.
    Returns the names of the tables analysed or left so.
    """
    if conn.dialect.name != "postgresql":
        return []
    by_name = {table.name: (table, columns) for table, columns in tables.items()}
    counts = _analysable_counts(conn, list(by_name))
    grown = sorted(
        name for name, (counted, live) in counts.items() if live - counted >= max(ANALYZE_FLOOR, counted / 2)
    )
    if grown:
        if statistics_target is not None:
            _sample_at(conn, statistics_target)
        conn.execute(text("ANALYZE (SKIP_LOCKED) " + ", ".join(_analyze_statement(*by_name[name]) for name in grown)))
    return grown


def _batch_lock_key(batch_id: str, rung: str = "") -> int:
    name = f"dedup:batch:{batch_id}" + (f":{rung}" if rung else "")
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big", signed=True)


def lock_batch(conn: Connection, batch_id: str) -> None:
    """Serialise the rungs that rewrite one batch's staged rows (raw, canonical) until the transaction ends.

    Two runs of the same partition at once then rewrite it one after the
    other instead of colliding on its primary keys. PostgreSQL: a
    transaction-level advisory lock keyed by the batch id; SQLite writers are
    serial already.
    """
    if conn.dialect.name == "postgresql":
        conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _batch_lock_key(batch_id)})


@contextmanager
def batch_rung_held(engine: Engine, batch_id: str, rung: str) -> Iterator[None]:
    """Run `rung` over one batch in one process at a time, across the many transactions it commits.

    PostgreSQL: a session-level advisory lock on a connection of its own, which
    the server drops if the process dies; a second run of the partition waits
    (and says so in its log). SQLite writers are serial already.
    """
    if engine.dialect.name != "postgresql":
        yield
        return
    key = {"key": _batch_lock_key(batch_id, rung)}
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        if not conn.execute(text("SELECT pg_try_advisory_lock(:key)"), key).scalar_one():
            log.info("batch %s: waiting for another run of its %s rung to end", batch_id, rung)
            conn.execute(text("SELECT pg_advisory_lock(:key)"), key)
        try:
            yield
        finally:
            try:
                conn.execute(text("SELECT pg_advisory_unlock(:key)"), key)
            except DBAPIError:
                conn.invalidate()  # closing the connection drops the lock


def record_rung_run(conn: Connection, table, batch_id: str, run_id: str, figures: Mapping[str, Any]) -> None:
    """Keep the figures (numbers and labels) of run `run_id` of a rung over a batch in `table` (`exact_rung_runs`, ...).

    A second execution of the same run (a step retried after the rung finished) replaces the first's figures.
    """
    stats = {key: value for key, value in figures.items() if isinstance(value, (int, float, str))}
    conn.execute(table.delete().where(table.c.batch_id == batch_id, table.c.run_id == run_id))
    conn.execute(table.insert().values(batch_id=batch_id, run_id=run_id, finished_at=utcnow(), stats=stats))
