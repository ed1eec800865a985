"""Moving many rows in one statement: COPY on PostgreSQL, executemany on SQLite.

`copy_rows` appends rows to a table. `staging_table` gives a per-connection
temporary table that a chunk is copied into before one set-based
INSERT ... SELECT or UPDATE ... FROM moves it into place, so a chunk costs a
handful of statements whatever its size.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from sqlalchemy import JSON, Column, Connection, MetaData, Table
from sqlalchemy.schema import CreateTable

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
