"""Moving many rows in one statement: COPY on PostgreSQL, executemany on SQLite.

`copy_rows` appends rows to a table. `staging_table` gives a per-connection
temporary table that a chunk is copied into before one set-based
INSERT ... SELECT or UPDATE ... FROM moves it into place, so a chunk costs a
handful of statements whatever its size. `insert_rows` and `update_rows` run
one INSERT or UPDATE over many rows sent as arrays, for the smaller writes
that need no staging table.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

from sqlalchemy import JSON, Column, Connection, Insert, MetaData, Table, Update, bindparam, func, literal, select
from sqlalchemy.schema import CreateTable
from sqlalchemy.types import TypeEngine

from dedup_pipeline.store import json_text

_temp_metadata = MetaData()


def _copy_value(value: Any) -> Any:
    """psycopg COPY takes bytes, str, numbers and datetimes as they are; JSON goes as text."""
    if isinstance(value, (dict, list)):
        return json_text.dumps(value)
    return value


def _json_encoded(rows: Iterable[Sequence[Any]], positions: list[int]) -> Iterator[list[Any]]:
    """The rows with the values at `positions` (the JSON columns) encoded; the others are left untouched."""
    for row in rows:
        row = list(row)
        for i in positions:
            row[i] = _copy_value(row[i])
        yield row


def copy_rows(
    conn: Connection, table: Table, columns: Sequence[str], rows: Iterable[Sequence[Any]], json_as_text: bool = False
) -> None:
    """Append `rows` (tuples in `columns` order) to `table` in one bulk operation.

    Values of JSON columns are encoded here, unless `json_as_text` says the
    rows hold them as JSON text already (a worker process encoded them).
    """
    json_positions = (
        [] if json_as_text else [i for i, name in enumerate(columns) if isinstance(table.c[name].type, JSON)]
    )
    rows = list(_json_encoded(rows, json_positions) if json_positions else rows)
    if not rows:
        return
    names = ", ".join(f'"{name}"' for name in columns)
    if conn.dialect.name == "postgresql":
        cursor = conn.connection.driver_connection.cursor()
        with cursor.copy(f'COPY "{table.name}" ({names}) FROM STDIN') as copy:
            for row in rows:
                copy.write_row(row)
        return
    placeholders = ", ".join("?" for _ in columns)
    conn.connection.driver_connection.cursor().executemany(
        f'INSERT INTO "{table.name}" ({names}) VALUES ({placeholders})', rows
    )


def _unnested(types: Mapping[str, TypeEngine], rows: Sequence[Sequence[Any]]):
    """PostgreSQL: `rows` (tuples in `types` order) as a table to select from or join, each column one array
    parameter: one statement however many rows, cheap to send and to plan."""
    from sqlalchemy.dialects.postgresql import ARRAY

    arrays = [literal(list(values), ARRAY(kind)) for kind, values in zip(types.values(), zip(*rows))]
    return func.unnest(*arrays).table_valued(*types).render_derived()


def insert_rows(conn: Connection, statement: Insert, rows: Sequence[Mapping[str, Any]]) -> int:
    """Run an INSERT (ON CONFLICT clauses included) for every row (dicts with the same keys, columns of the
    statement's table): one INSERT ... SELECT over the rows' arrays on PostgreSQL, one execution a row elsewhere.
    Returns the rows inserted (an ON CONFLICT DO NOTHING skips some)."""
    if not rows:
        return 0
    counted = {"preserve_rowcount": True}  # SQLAlchemy keeps an INSERT's row count only when asked
    if conn.dialect.name != "postgresql":
        return conn.execute(statement, list(rows), execution_options=counted).rowcount
    names = list(rows[0])
    types = {name: statement.table.c[name].type for name in names}
    source = _unnested(types, [[row[name] for name in names] for row in rows])
    inserted = statement.from_select(names, select(*(source.c[name] for name in names)))
    return conn.execute(inserted, execution_options=counted).rowcount


def update_rows(
    conn: Connection, build: Callable[[Mapping[str, Any]], Update], types: Mapping[str, TypeEngine], rows: Sequence
) -> None:
    """Run the UPDATE `build(v)` for every row (tuples in `types` order), where `v[name]` is the row's value:
    one UPDATE ... FROM the rows' arrays on PostgreSQL, one execution a row elsewhere. Each target row must
    match at most one of `rows` (PostgreSQL would apply only one of them)."""
    if not rows:
        return
    if conn.dialect.name == "postgresql":
        conn.execute(build(_unnested(types, rows).c))
        return
    values = {name: bindparam(name, type_=kind) for name, kind in types.items()}
    conn.execute(build(values), [dict(zip(types, row)) for row in rows])


def staging_table(
    conn: Connection, like: Table, name: str, columns: Sequence[str], extra: Sequence[Column] = ()
) -> Table:
    """A temporary table with some of `like`'s columns, created once per connection and emptied per use.

    PostgreSQL drops its rows at commit (ON COMMIT DELETE ROWS); SQLite's are
    deleted here before use. Either way a chunk never sees another chunk's rows.
    """
    table = _temp_metadata.tables.get(name)
    if table is None:
        table = Table(
            name,
            _temp_metadata,
            *[Column(c, like.c[c].type) for c in columns],
            *[Column(c.name, c.type) for c in extra],
            prefixes=["TEMPORARY"],
            postgresql_on_commit="DELETE ROWS",
        )
    conn.execute(CreateTable(table, if_not_exists=True))
    if conn.dialect.name != "postgresql":
        conn.execute(table.delete())
    return table


#: Values per IN list when a statement is repeated over parts: SQLite binds each value as a parameter.
IN_CHUNK = 5000


def chunked(values: Sequence[Any], size: int = IN_CHUNK) -> list[Sequence[Any]]:
    return [values[start : start + size] for start in range(0, len(values), size)]


def delete_in(conn: Connection, table: Table, columns: Sequence, values: Iterable[Any]) -> int:
    """Delete the rows of `table` where any of `columns` holds one of `values`, IN_CHUNK values a statement.

    One statement per column, so that each can use that column's index (an OR of the two conditions is
    planned as a scan of the whole table). Returns how many rows went.
    """
    return sum(
        conn.execute(table.delete().where(in_values(conn, column, part))).rowcount
        for part in chunked(sorted(set(values)))
        for column in columns
    )


def in_values(conn: Connection, column, values: Sequence[Any]):
    """`column IN values` as one array parameter on PostgreSQL (cheap to send and plan), a plain IN elsewhere."""
    if conn.dialect.name == "postgresql":
        from sqlalchemy import any_, literal
        from sqlalchemy.dialects.postgresql import ARRAY

        return column == any_(literal(list(values), ARRAY(column.type)))
    return column.in_(list(values))
