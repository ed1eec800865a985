"""Moving many rows in one statement: COPY on PostgreSQL, executemany on SQLite.

`copy_rows` appends rows to a table. `staging_table` gives a per-connection
temporary table that a chunk is copied into before one set-based
INSERT ... SELECT or UPDATE ... FROM moves it into place, so a chunk costs a
handful of statements whatever its size.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
from sqlalchemy import JSON, BigInteger, Column, Connection, Integer, MetaData, SmallInteger, Table
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


# PostgreSQL's binary COPY framing: signature, flags, header-extension length ... rows ... trailer.
_BINARY_HEADER = b"PGCOPY\n\xff\r\n\0" + bytes(8)
_BINARY_TRAILER = b"\xff\xff"


def _pg_int_width(column_type) -> int:
    for kind, width in ((BigInteger, 8), (SmallInteger, 2), (Integer, 4)):  # subclasses before Integer
        if isinstance(column_type, kind):
            return width
    raise TypeError(f"not an integer column type: {column_type!r}")


def copy_int_columns(conn: Connection, table: Table, columns: Mapping[str, np.ndarray]) -> None:
    """Append rows given column-wise as integer arrays of one length.

    On PostgreSQL the whole set is framed with numpy as one binary COPY
    (each row: field count, then length and big-endian value per field), so
    no Python code runs per row; the LSH index writes 26 such rows per record.
    Elsewhere it is :func:`copy_rows`.
    """
    names = list(columns)
    arrays = [np.asarray(columns[name]) for name in names]
    count = len(arrays[0]) if arrays else 0
    widths = [_pg_int_width(table.c[name].type) for name in names]
    if count == 0:
        return
    if conn.dialect.name != "postgresql":
        copy_rows(conn, table, names, zip(*(array.tolist() for array in arrays)))
        return
    layout = [("fields", ">i2")]
    for i, width in enumerate(widths):
        layout += [(f"length{i}", ">i4"), (f"value{i}", f">i{width}")]
    rows = np.empty(count, dtype=np.dtype(layout))
    rows["fields"] = len(names)
    for i, (width, array) in enumerate(zip(widths, arrays)):
        rows[f"length{i}"] = width
        rows[f"value{i}"] = array
    cursor = conn.connection.driver_connection.cursor()
    quoted = ", ".join(f'"{name}"' for name in names)
    with cursor.copy(f'COPY "{table.name}" ({quoted}) FROM STDIN (FORMAT BINARY)') as copy:
        copy.write(_BINARY_HEADER + rows.tobytes() + _BINARY_TRAILER)


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
