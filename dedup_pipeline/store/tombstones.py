"""The tombstone gate: what the rungs ask before they store a record or a quarantined line.

Tombstones are keyed fingerprints (see `dedup_pipeline.core.erasure`) that an
erasure leaves (`dedup_pipeline.store.erasure`). `erased_positions` is asked
once per chunk by the canonical and exact rungs, which records a tombstone
suppresses; `erased_raw_lines`, by the raw and canonical rungs, which lines on
their way to quarantine name an erased subject. The key is the one the
warehouse was given (`Warehouse(tombstone_key=...)`: the Dagster `warehouse`
resource's `dg.EnvVar("DEDUP_TOMBSTONE_KEY")`), else $DEDUP_TOMBSTONE_KEY as
the command line has it; with neither, the embedded SQLite default keeps a
random one in a file beside the database. A warehouse whose tombstones were
made with another key refuses to ingest rather than let an erased subject back
in.

Erasure and ingestion are serialised on PostgreSQL by an advisory lock:
every chunk holds it shared while it checks tombstones and writes
(`lock_for_ingestion`), an erasure holds it exclusively (`lock_for_erasure`),
so a chunk either commits before the erasure (and is erased by it) or checks
tombstones after it. On SQLite, both begin their write transaction before they
read (BEGIN IMMEDIATE), so the database serialises them the same way.
"""

from __future__ import annotations

import os
import secrets
import threading
import weakref
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from sqlalchemy import Connection, Engine, any_, bindparam, delete, func, select, text
from sqlalchemy.dialects.postgresql import BYTEA
from sqlalchemy.engine import make_url

from dedup_pipeline import environment
from dedup_pipeline.core import erasure as core
from dedup_pipeline.core.erasure import Catalogue
from dedup_pipeline.core.errors import ConfigurationError
from dedup_pipeline.core.keys import MAKE_A_KEY, key_weakness
from dedup_pipeline.core.records import CanonicalRecord
from dedup_pipeline.environment import TOMBSTONE_KEY_ENV
from dedup_pipeline.store import json_text
from dedup_pipeline.store.bulk import chunked
from dedup_pipeline.store.schema import canonical_records, erasure_scopes, erasure_tombstones

#: Names the advisory lock that serialises erasure against ingestion (any constant works).
_ERASURE_LOCK = 7_301_043


class TombstoneKeyError(ConfigurationError):
    """The tombstone key is missing, weak (`core.keys.key_weakness`), or not the key the tombstones were made with."""


# ---------------------------------------------------------------- the key

_memory_keys: dict[int, bytes] = {}
_key_lock = threading.Lock()
# The key each engine's warehouse was given (`use_key`); held in memory only, never logged or stored.
_given_keys: weakref.WeakKeyDictionary[Engine, str] = weakref.WeakKeyDictionary()


def use_key(engine: Engine, key: str | None) -> None:
    """Key the tombstones of `engine`'s warehouse with `key` (None: $DEDUP_TOMBSTONE_KEY when they are asked)."""
    with _key_lock:
        if key:
            _given_keys[engine] = key
        else:
            _given_keys.pop(engine, None)


def tombstone_key(conn: Connection) -> bytes:
    """The HMAC key: the one given to the warehouse (`use_key`), else $DEDUP_TOMBSTONE_KEY, else (embedded SQLite
    only) a random key in a file beside the database.

    A PostgreSQL warehouse with neither is an error: production keys come
    from the environment (a secret store), never from a file or a default.
    """
    with _key_lock:
        given = _given_keys.get(conn.engine)
    configured = given or environment.tombstone_key()
    if configured:
        key = configured.strip()
        weakness = key_weakness(key)
        if weakness:
            raise TombstoneKeyError(f"{TOMBSTONE_KEY_ENV} is refused: {weakness}. Make a good one with: {MAKE_A_KEY}")
        return key.encode("utf-8")
    url = conn.engine.url
    if url.get_backend_name() != "sqlite":
        raise TombstoneKeyError(
            f"{TOMBSTONE_KEY_ENV} is not set: erasure tombstones on a {url.get_backend_name()} warehouse need a secret "
            f"key from the environment; make one with: {MAKE_A_KEY}"
        )
    if not url.database or url.database == ":memory:":
        with _key_lock:
            return _memory_keys.setdefault(id(conn.engine), secrets.token_hex(32).encode("ascii"))
    return _key_file(Path(url.database).resolve().with_name(Path(url.database).name + ".tombstone-key"))


def key_file_path(database_url: str) -> Path | None:
    """Where the embedded default keeps its tombstone key (None for other warehouses)."""
    url = make_url(database_url)
    if url.get_backend_name() != "sqlite" or not url.database or url.database == ":memory:":
        return None
    return Path(url.database).resolve().with_name(Path(url.database).name + ".tombstone-key")


def _key_file(path: Path) -> bytes:
    if not path.exists():
        try:
            handle = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            pass  # another process made it first
        else:
            with os.fdopen(handle, "w") as out:
                out.write(secrets.token_hex(32) + "\n")
    return path.read_text().strip().encode("ascii")


# ---------------------------------------------------------------- locking


def _sqlite_write_transaction(conn: Connection) -> None:
    """Make what follows one SQLite write transaction, reads included.

    Python's sqlite3 runs SELECTs outside any transaction until the first
    write, so a check read there could be stale by the time the chunk writes.
    BEGIN IMMEDIATE takes the write lock first (waiting for the busy timeout);
    a transaction already open keeps its snapshot, and a write after a
    concurrent commit fails and is replayed.
    """
    if not conn.connection.driver_connection.in_transaction:
        conn.exec_driver_sql("BEGIN IMMEDIATE")


def lock_for_ingestion(conn: Connection) -> None:
    if conn.dialect.name == "postgresql":
        conn.execute(text("SELECT pg_advisory_xact_lock_shared(:key)"), {"key": _ERASURE_LOCK})
    elif conn.dialect.name == "sqlite":
        _sqlite_write_transaction(conn)


def lock_for_erasure(conn: Connection) -> None:
    if conn.dialect.name == "postgresql":
        conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _ERASURE_LOCK})
    elif conn.dialect.name == "sqlite":
        _sqlite_write_transaction(conn)


# ---------------------------------------------------------------- the gate


def load_catalogue(conn: Connection) -> Catalogue:
    """The tombstone catalogue, and what identifies the tombstone set (for the in-memory prefix cache).

    The set is identified by its newest erasure id and its smallest and largest
    fingerprints, all read from indexes: any erasure that adds tombstones
    changes the id; a warehouse restored from a backup, or dropped and
    recreated under the same URL, changes at least one of the three.
    """
    t = erasure_tombstones
    generation = [
        select(func.max(t.c.erasure_id)).scalar_subquery().label("newest"),
        select(t.c.fingerprint).order_by(t.c.fingerprint).limit(1).scalar_subquery().label("lowest"),
        select(t.c.fingerprint).order_by(t.c.fingerprint.desc()).limit(1).scalar_subquery().label("highest"),
    ]
    rows = conn.execute(
        select(erasure_scopes.c.kind, erasure_scopes.c.scope, erasure_scopes.c.key_id, *generation)
    ).all()
    marker = (rows[0][3], bytes(rows[0][4] or b""), bytes(rows[0][5] or b"")) if rows else None
    return Catalogue.from_rows([row[:3] for row in rows], generation=marker)


def checked_key(conn: Connection, catalogue: Catalogue) -> bytes:
    key = tombstone_key(conn)
    foreign = catalogue.key_ids - {core.key_id(key)}
    if foreign:
        raise TombstoneKeyError(
            f"the warehouse holds tombstones made with another key (key id {sorted(foreign)}); "
            f"set {TOMBSTONE_KEY_ENV} to that key. Ingestion refuses to run rather than let erased subjects back in"
        )
    return key


def existing_fingerprints(conn: Connection, fingerprints: Sequence[bytes]) -> set[bytes]:
    """Which of `fingerprints` are tombstones. One statement on PostgreSQL.

    The fingerprints travel as ONE bytea parameter, cut into 32-byte pieces by
    the server: adapting a list of thousands of bytea values costs the client
    far more than the lookup costs the server.
    """
    if not fingerprints:
        return set()
    column = erasure_tombstones.c.fingerprint
    if conn.dialect.name == "postgresql":
        blob = bindparam("blob", b"".join(fingerprints), type_=BYTEA)
        piece = func.substring(blob, text("i * 32 + 1"), 32)
        wanted = select(piece).select_from(func.generate_series(0, len(fingerprints) - 1).alias("i"))
        return {
            bytes(fp)
            for fp in conn.execute(select(column).where(column == any_(func.array(wanted.scalar_subquery())))).scalars()
        }
    found: set[bytes] = set()
    for part in chunked(list(fingerprints)):
        found |= set(conn.execute(select(column).where(column.in_(part))).scalars())
    return found


# Per engine: (what identifies the tombstone set, sorted 64-bit prefixes of every tombstone). 8 bytes each.
_prefix_cache: weakref.WeakKeyDictionary[Engine, tuple[object, np.ndarray]] = weakref.WeakKeyDictionary()
_prefix_lock = threading.Lock()


def _tombstone_prefixes(conn: Connection, generation) -> np.ndarray:
    """The first 8 bytes of every tombstone, sorted; reloaded only when an erasure added tombstones."""
    with _prefix_lock:
        cached = _prefix_cache.get(conn.engine)
    if cached is not None and cached[0] == generation:
        return cached[1]
    column = erasure_tombstones.c.fingerprint
    raw = b"".join(bytes(head) for head in conn.execute(select(func.substr(column, 1, 8))).scalars())
    prefixes = np.sort(np.frombuffer(raw, dtype=">u8").astype(np.uint64))
    with _prefix_lock:
        _prefix_cache[conn.engine] = (generation, prefixes)
    return prefixes


def _maybe_tombstones(prefixes: np.ndarray, fingerprints: list[bytes]) -> list[bytes]:
    """Fingerprints whose first 8 bytes are a tombstone's: the only ones worth asking the warehouse about."""
    if not prefixes.size or not fingerprints:
        return []
    heads = np.frombuffer(b"".join(fp[:8] for fp in fingerprints), dtype=">u8").astype(np.uint64)
    at = np.minimum(np.searchsorted(prefixes, heads), prefixes.size - 1)
    return [fp for fp, hit in zip(fingerprints, prefixes[at] == heads) if hit]


def erased_positions(
    conn: Connection, chunk: Sequence[CanonicalRecord], batch_id: str | None = None, staged: bool = True
) -> set[int]:
    """Positions in `chunk` that an erasure tombstone suppresses (decision `erased`).

    Call it inside the chunk's transaction, before its writes (see `_tombstoned`
    for what it costs; the tombstone prefixes are loaded once per process and
    reloaded only after an erasure added tombstones). A line the canonical rung
    staged withheld (it named an erased subject then) is suppressed too; lines
    not read back from staging (`staged` False) are never withheld, and are not
    decoded to look. With
    `batch_id`, the staged `canonical_records` rows of suppressed lines
    are deleted in the same transaction, so a re-crawl of an erased subject
    leaves no staged copy behind.
    """
    erased = _tombstoned(
        conn,
        chunk,
        lambda key, catalogue, record: core.record_fingerprints(
            key, catalogue, record.natural_key, record.canonical_url, json_text.decoded(record.payload), record.hashes
        ),
    )
    if staged:
        erased |= {position for position, record in enumerate(chunk) if core.WITHHELD in record.hash_errors}
    if erased and batch_id is not None:
        lines = sorted({chunk[p].line_no for p in erased})
        conn.execute(
            delete(canonical_records).where(
                canonical_records.c.batch_id == batch_id, canonical_records.c.line_no.in_(lines)
            )
        )
    return erased


def erased_raw_lines(conn: Connection, lines: Sequence[bytes]) -> set[int]:
    """Positions in `lines` (raw lines on their way to quarantine) that name a subject under an erasure tombstone.

    Their bytes must not be stored again: a re-crawl, or the same batch
    materialised again, would otherwise bring back what an erasure removed
    from the quarantine. Matched as `core.raw_line_fingerprints` reads them;
    same lock and screening as `erased_positions`.
    """
    return _tombstoned(conn, lines, core.raw_line_fingerprints)


def _tombstoned(conn: Connection, items: Sequence, fingerprints_of) -> set[int]:
    """Positions of `items` with a fingerprint (`fingerprints_of(key, catalogue, item)`) that is a tombstone.

    Takes the erasure lock shared (PostgreSQL) and reads the tiny tombstone
    catalogue (one SELECT); with no tombstone, that is all. Otherwise the
    fingerprints are screened in memory against the 8-byte prefixes of every
    tombstone, and the few that pass are confirmed with one SELECT.
    """
    lock_for_ingestion(conn)
    catalogue = load_catalogue(conn)
    if not catalogue or not items:
        return set()
    key = checked_key(conn, catalogue)
    positions: dict[bytes, list[int]] = defaultdict(list)
    for position, item in enumerate(items):
        for fp in fingerprints_of(key, catalogue, item):
            positions[fp].append(position)
    candidates = _maybe_tombstones(_tombstone_prefixes(conn, catalogue.generation), list(positions))
    return {p for fp in existing_fingerprints(conn, candidates) for p in positions[fp]}
