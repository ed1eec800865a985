"""Moving many rows in one statement: COPY on PostgreSQL, executemany on SQLite.

`copy_rows` appends rows to a table. `staging_table` gives a per-connection
temporary table that a chunk is copied into before one set-based
INSERT ... SELECT or UPDATE ... FROM moves it into place, so a chunk costs a
handful of statements whatever its size.
"""

from __future__ import annotations

import json
from typing import Any, Iterable, Sequence

from sqlalchemy import Column, Connection, MetaData, Table
from sqlalchemy.schema import CreateTable

_temp_metadata = MetaData()


def _copy_value(value: Any) -> Any:
    """psycopg COPY takes bytes, str, numbers and datetimes as they are; JSON goes as text."""
    if isinstance(value, (dict, list)):
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    return value


def copy_rows(conn: Connection, table: Table, columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
    """Append `rows` (tuples in `columns` order) to `table` in one bulk operation."""
    rows = list(rows)
    if not rows:
        return
    if conn.dialect.name == "postgresql":
        cursor = conn.connection.driver_connection.cursor()
        names = ", ".join(f'"{name}"' for name in columns)
        with cursor.copy(f'COPY "{table.name}" ({names}) FROM STDIN') as copy:
            for row in rows:
                copy.write_row([_copy_value(v) for v in row])
        return
    placeholders = ", ".join("?" for _ in columns)
    names = ", ".join(f'"{name}"' for name in columns)
    conn.connection.driver_connection.cursor().executemany(
        f'INSERT INTO "{table.name}" ({names}) VALUES ({placeholders})',
        [[_copy_value(v) for v in row] for row in rows],
    )


def staging_table(conn: Connection, like: Table, name: str, columns: Sequence[str], extra: Sequence[Column] = ()) -> Table:
    """A temporary table with some of `like`'s columns, created once per connection and emptied per use.

    PostgreSQL drops its rows at commit (ON COMMIT DELETE ROWS); SQLite's are
    deleted here before use. Either way a chunk never sees another chunk's rows.
    """
    table = _temp_metadata.tables.get(name)
    if table is None:
        table = Table(
            name, _temp_metadata,
            *[Column(c, like.c[c].type) for c in columns], *[Column(c.name, c.type) for c in extra],
            prefixes=["TEMPORARY"],
            postgresql_on_commit="DELETE ROWS",
        )
    conn.execute(CreateTable(table, if_not_exists=True))
    if conn.dialect.name != "postgresql":
        conn.execute(table.delete())
    return table


def in_values(conn: Connection, column, values: Sequence[Any]):
    """`column IN values` as one array parameter on PostgreSQL (cheap to send and plan), a plain IN elsewhere."""
    if conn.dialect.name == "postgresql":
        from sqlalchemy import any_, literal
        from sqlalchemy.dialects.postgresql import ARRAY

        return column == any_(literal(list(values), ARRAY(column.type)))
    return column.in_(list(values))
