"""Applies `roles.sql`: least-privilege roles on a PostgreSQL warehouse (`dedup-pipeline grant-roles`).

The SQL names roles, the database and columns; those are identifiers, not
values, so they are validated and quoted here; the only literals formatted into SQL are field names
checked to be plain names (`_text_array`). Tables that a later feature adds and that erasure sweeps (they
name records by id, natural key or digest) get the erasure operator's
SELECT, DELETE grant generated from the schema, and tables with JSON reports
(which erasure redacts) SELECT, UPDATE, so erasure keeps working.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources

from sqlalchemy import Engine, text

from dedup_pipeline.core.erasure import PERSONAL_FIELDS
from dedup_pipeline.store.erasure import redacted_tables, swept_tables
from dedup_pipeline.store.schema import records

_ROLE_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")
_FIELD_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")
_PLACEHOLDER = re.compile(r"\$\{([a-z_]+)\}")
#: Columns of `records` the analysts' view leaves out: the digest, a hash over personal fields, and the payload,
#: which the view gives without `ANALYST_HIDDEN_FIELDS`.
ANALYST_HIDDEN_COLUMNS = frozenset({"content_hash", "payload"})
#: Top-level payload fields the analysts' view leaves out: the personal fields. `seller_id` is one, and it is part
#: of the `content/2` identity (`content/1` hashes every field), so a digest cannot be rebuilt from the view.
ANALYST_HIDDEN_FIELDS = PERSONAL_FIELDS


@dataclass(frozen=True)
class RoleNames:
    writer: str = "dedup_writer"
    analyst: str = "dedup_analyst"
    eraser: str = "dedup_eraser"
    monitor: str = "dedup_monitor"

    def all(self) -> list[str]:
        return [self.writer, self.analyst, self.eraser, self.monitor]

    def __post_init__(self) -> None:
        for name in self.all():
            if not _ROLE_NAME.fullmatch(name):
                raise ValueError(f"role names are lower-case identifiers ([a-z_][a-z0-9_]*), got {name!r}")
        if len(set(self.all())) != len(self.all()):
            raise ValueError("the four roles need four different names")


def roles_sql(engine: Engine, names: RoleNames = RoleNames()) -> list[str]:
    """The statements `grant_roles` runs, identifiers quoted for this database."""
    quote = engine.dialect.identifier_preparer.quote
    columns = [c.name for c in records.columns if c.name not in ANALYST_HIDDEN_COLUMNS]
    identifiers = {
        "writer": quote(names.writer),
        "analyst": quote(names.analyst),
        "eraser": quote(names.eraser),
        "monitor": quote(names.monitor),
        "database": quote(engine.url.database),
        "analyst_record_columns": ", ".join(quote(c) for c in columns),
        "analyst_hidden_fields": _text_array(ANALYST_HIDDEN_FIELDS),
    }
    script = resources.files("dedup_pipeline.store").joinpath("roles.sql").read_text()
    statements = [_PLACEHOLDER.sub(lambda m: identifiers[m.group(1)], s) for s in _split(script)]
    statements += [f"GRANT SELECT, DELETE ON {quote(table.name)} TO {quote(names.eraser)}" for table in swept_tables()]
    statements += [
        f"GRANT SELECT, UPDATE ON {quote(table.name)} TO {quote(names.eraser)}" for table in redacted_tables()
    ]
    return statements


def _text_array(names: tuple[str, ...]) -> str:
    """A PostgreSQL text[] literal of field names, each checked to be a plain name (no quote can get in)."""
    for name in names:
        if not _FIELD_NAME.fullmatch(name):
            raise ValueError(f"hidden field names are lower-case identifiers, got {name!r}")
    return "ARRAY[" + ", ".join(f"'{name}'" for name in names) + "]::text[]"


def _split(script: str) -> list[str]:
    """Statements of the script: ';' ends one, except inside a $$ ... $$ body."""
    body = "\n".join(line for line in script.splitlines() if not line.lstrip().startswith("--"))
    statements, current, in_dollar = [], [], False
    for piece in re.split(r"(\$\$|;)", body):
        if piece == "$$":
            in_dollar = not in_dollar
        if piece == ";" and not in_dollar:
            statement = "".join(current).strip()
            if statement:
                statements.append(statement)
            current = []
        else:
            current.append(piece)
    if "".join(current).strip():
        raise ValueError("roles.sql ends without ';'")
    return statements


def grant_roles(engine: Engine, names: RoleNames = RoleNames()) -> list[str]:
    """Create the roles if missing and (re)apply their grants, in one transaction. Returns the role names."""
    if engine.dialect.name != "postgresql":
        raise RuntimeError("roles exist on PostgreSQL only; the embedded SQLite warehouse is a local file")
    with engine.begin() as conn:
        # The statements revoke before they grant: on a login (this one, or anyone's), they would strip its rights.
        logins = conn.execute(
            text(
                "SELECT rolname FROM pg_roles WHERE rolname = ANY(:names) AND (rolcanlogin OR rolname = current_user)"
            ),
            {"names": names.all()},
        ).scalars()
        if taken := sorted(logins):
            raise ValueError(
                f"{', '.join(taken)} can log in (or is this session's role): the four roles are group roles of "
                "their own, which logins are then granted; choose other names"
            )
        for statement in roles_sql(engine, names):
            conn.execute(text(statement))
    return names.all()
