"""Least privilege on the real PostgreSQL: connect as each role and prove what it can and cannot do.

Each test gets its own database and its own role names (roles are global to
the server, and other test sessions may run at the same time). Login roles
are made here with random passwords; nothing is stored.
"""

from __future__ import annotations

import json
import secrets
import uuid

import pytest
from psycopg import sql
from sqlalchemy import create_engine, func, select, text
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ProgrammingError

from dedup_pipeline.core.erasure import PERSONAL_FIELDS, Subject
from dedup_pipeline.core.hashing import HASH_RULES, content_hash
from dedup_pipeline.environment import TOMBSTONE_KEY_ENV
from dedup_pipeline.ladder.erasure import erase_subject
from dedup_pipeline.ladder.retention import RetentionSettings, prune_retention
from dedup_pipeline.metrics import prometheus_text
from dedup_pipeline.store.roles import RoleNames, grant_roles, roles_sql
from dedup_pipeline.store.schema import dedup_decisions
from dedup_pipeline.store.warehouse import ANALYZE_FLOOR, Warehouse, analyze, analyze_grown
from dedup_pipeline_tests.erasure_helpers import T0, run_ladder
from dedup_pipeline_tests.helpers import PG_ADMIN_URL, fresh_database, listing, write_batch
from dedup_pipeline_tests.store.test_statistics import (
    add_rows,
    counted_and_live,
    wait_for_live_rows,
    without_autovacuum,
)

pytestmark = pytest.mark.postgres

PERSONAL_TABLES = [
    "record_hashes",
    "record_history",
    "dedup_decisions",
    "quarantine",
    "canonical_records",
    "near_index",
    "erasure_tombstones",
    "erasure_scopes",
    "erasure_requests",
]


class Database:
    def __init__(self, admin, name: str, names: RoleNames):
        self.admin, self.name, self.names = admin, name, names
        self.url = make_url(PG_ADMIN_URL).set(database=name)
        self.logins: dict[str, URL] = {}
        self.engines = []

    def login(self, group: str) -> Warehouse:
        """A warehouse connected as a new LOGIN role that is a member of `group` only."""
        role, password = f"{group}_login", secrets.token_urlsafe(18)
        with self.admin.connect() as conn:
            conn.connection.driver_connection.execute(
                sql.SQL("CREATE ROLE {} LOGIN PASSWORD {} IN ROLE {}").format(
                    sql.Identifier(role), sql.Literal(password), sql.Identifier(group)
                )
            )
        self.logins[group] = role
        warehouse = Warehouse(self.url.set(username=role, password=password).render_as_string(hide_password=False))
        self.engines.append(warehouse)
        return warehouse


@pytest.fixture
def database(tmp_path, monkeypatch):
    monkeypatch.setenv(TOMBSTONE_KEY_ENV, secrets.token_hex(32))
    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    tag = uuid.uuid4().hex[:10]
    names = RoleNames(f"t{tag}_writer", f"t{tag}_analyst", f"t{tag}_eraser", f"t{tag}_monitor")
    db = None
    try:
        with fresh_database("dedup_roles") as name:
            db = Database(admin, name, names)
            owner = Warehouse(db.url.render_as_string(hide_password=False)).create_schema()
            grant_roles(owner.engine, names)
            grant_roles(owner.engine, names)  # idempotent: a second run (after an upgrade) changes nothing
            db.owner = owner
            try:
                yield db
            finally:
                for warehouse in db.engines + [owner]:
                    warehouse.dispose()
    finally:  # roles are global to the server: dropped once their database is gone
        with admin.connect() as conn:
            for role in [*(db.logins.values() if db else ()), *names.all()]:
                conn.connection.driver_connection.execute(
                    sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(role))
                )
        admin.dispose()


def denied(warehouse: Warehouse, statement: str) -> bool:
    try:
        with warehouse.engine.begin() as conn:
            conn.execute(text(statement))
    except ProgrammingError as exc:
        if "permission denied" in str(exc):
            return True
        raise
    return False


def crawl(warehouse, tmp_path, key="a", landed=T0, n=6):
    folder = tmp_path / "landing"
    write_batch(
        folder, key, [listing(i, seller_id="s-X" if i == 1 else "s-1") for i in range(n)] + ["not json"], landed=landed
    )
    return run_ladder(warehouse, folder, key)


def test_group_roles_cannot_log_in_and_the_sql_holds_no_credential(database):
    with database.admin.connect() as conn:
        rows = conn.execute(
            text("SELECT rolname, rolcanlogin, rolpassword IS NULL FROM pg_authid WHERE rolname = ANY(:names)"),
            {"names": database.names.all()},
        ).all()
    assert sorted(rows) == sorted((name, False, True) for name in database.names.all())
    assert not any("PASSWORD" in statement.upper() for statement in roles_sql(database.owner.engine, database.names))


def test_a_login_is_never_taken_for_a_group_role(database):
    """Breaks: `grant-roles --writer postgres` (or any login's name) revoked that login's rights on every table."""
    login = database.login(database.names.analyst)
    own = database.owner.engine.url.username
    for taken in (own, database.logins[database.names.analyst]):
        names = RoleNames(taken, *database.names.all()[1:])
        with pytest.raises(ValueError, match=f"{taken} can log in"):
            grant_roles(database.owner.engine, names)
    with database.owner.engine.connect() as conn:  # the owner kept every right
        assert conn.execute(text("SELECT has_table_privilege('records', 'TRUNCATE')")).scalar_one()
    login.dispose()


def test_writer_runs_the_ladder_and_retention_but_cannot_touch_tombstones(database, tmp_path):
    writer = database.login(database.names.writer)
    writer.create_schema()  # every run does this; on an existing schema it needs no DDL right
    report = crawl(writer, tmp_path)
    assert report.decisions["new"] == 6
    prune_retention(writer, RetentionSettings())
    assert denied(
        writer,
        "INSERT INTO erasure_tombstones (fingerprint, kind, scope, key_id, erasure_id, created_at) "
        "VALUES ('\\x00', 'field', 'x', 'k', 1, now())",
    )
    assert denied(writer, "DELETE FROM erasure_tombstones")
    assert denied(writer, "UPDATE erasure_scopes SET key_id = 'x'")
    assert denied(writer, "SELECT * FROM erasure_requests")
    assert denied(writer, "TRUNCATE records")
    # It can read tombstones: an erasure by the operator holds against the writer's next crawl.
    eraser = database.login(database.names.eraser)
    erase_subject(eraser, Subject.parse("field", "s-X", field="seller_id"), "T-1")
    again = crawl(writer, tmp_path, key="b", landed=T0 + 86400)
    assert again.decisions["erased"] == 1 and again.decisions["exact_duplicate"] == 5


def test_analyst_reads_records_and_clusters_but_no_hash_log_or_tombstone(database, tmp_path):
    crawl(database.owner, tmp_path)
    erase_subject(database.owner, Subject.parse("field", "s-X", field="seller_id"), "T-2")
    analyst = database.login(database.names.analyst)
    with analyst.engine.connect() as conn:
        rows = conn.execute(text("SELECT natural_key, payload ->> 'title' FROM analyst_records ORDER BY 1")).all()
        assert len(rows) == 5 and all(title.startswith("Product") for _, title in rows)
        for table in ("near_duplicate_links", "near_duplicate_clusters", "crawl_batches"):
            conn.execute(select(func.count()).select_from(text(table))).scalar_one()
    assert denied(analyst, "SELECT content_hash FROM records")  # a hash over personal fields
    assert denied(analyst, "SELECT * FROM records")
    assert denied(analyst, "SELECT natural_key FROM records")  # records only through analyst_records
    for table in PERSONAL_TABLES:
        assert denied(analyst, f"SELECT count(*) FROM {table}"), table
    assert denied(analyst, "UPDATE records SET natural_key = 'x'")
    assert denied(analyst, "DELETE FROM near_duplicate_links")


def test_analyst_can_neither_read_a_personal_field_nor_rebuild_a_stored_digest(database, tmp_path):
    folder = tmp_path / "landing"
    people = {"seller_id": "s-77", "seller_email": "jane@example.org", "seller_phone": "+33 1 23 45 67 89"}
    write_batch(folder, "a", [listing(i, **people, author="Jane Roe") for i in range(20)], landed=T0)
    run_ladder(database.owner, folder, "a")
    with database.owner.engine.connect() as conn:
        stored = {
            (version, digest.hex())
            for version, digest in conn.execute(text("SELECT hash_version, content_hash FROM record_hashes"))
        }
        stored |= {(v, d.hex()) for v, d in conn.execute(text("SELECT hash_version, content_hash FROM records"))}
        full = [payload for (payload,) in conn.execute(text("SELECT payload FROM records"))]
    # What the analyst must not be able to do, the owner can: every stored digest is rebuilt from the payload.
    assert {(v, content_hash(p, v)[0]) for p in full for v in HASH_RULES} == stored and len(stored) == 40

    analyst = database.login(database.names.analyst)
    for statement in (
        "SELECT payload FROM records",
        "SELECT payload ->> 'seller_id' FROM records",
        "SELECT count(*) FROM records WHERE payload ->> 'seller_email' = 'jane@example.org'",
        "SELECT content_hash FROM records",
        "SELECT content_hash FROM record_hashes",
    ):
        assert denied(analyst, statement), statement
    with analyst.engine.connect() as conn:
        seen = [payload for (payload,) in conn.execute(text("SELECT payload FROM analyst_records"))]
        assert (
            conn.execute(
                text("SELECT count(*) FROM analyst_records WHERE payload ?| :fields"), {"fields": list(PERSONAL_FIELDS)}
            ).scalar_one()
            == 0
        )
    assert len(seen) == 20 and all(p["title"] and p["price"] and p["url"] for p in seen)
    assert not any(value in json.dumps(seen) for value in (*people.values(), "Jane Roe"))
    rebuilt = set()
    for payload in seen:
        for version in HASH_RULES:
            try:
                rebuilt.add((version, content_hash(payload, version)[0]))
            except ValueError:  # content/2 without its personal identity field cannot be hashed at all
                pass
    assert not rebuilt & stored


def test_eraser_erases_but_cannot_add_records_or_remove_tombstones(database, tmp_path):
    crawl(database.owner, tmp_path)
    eraser = database.login(database.names.eraser)
    report = erase_subject(eraser, Subject.parse("field", "s-X", field="seller_id"), "T-3")
    # Tombstones: the field and the two digests; for the quarantine only, the row's URL (four variants) and key.
    assert report.removed["records"] == 1 and report.removed["record_hashes"] == 2 and report.tombstones_added == 3 + 5
    assert denied(
        eraser,
        "INSERT INTO records (natural_key, canonical_url, url_version, hash_version, content_hash, payload,"
        " first_seen_at, last_crawled_at, first_batch_id, last_batch_id, last_landed_at, last_line_no)"
        " VALUES ('k', 'u', 'url/1', 'content/1', '\\x00', '{}', now(), now(), 'b', 'b', now(), 1)",
    )
    assert denied(eraser, "UPDATE records SET payload = '{}'")
    assert report.removed["dedup_decisions (redacted)"] >= 1  # it empties the subject's decision rows, no more:
    assert denied(eraser, "DELETE FROM dedup_decisions")  # the audit trail keeps every line
    assert denied(eraser, "UPDATE dedup_decisions SET decision = 'new'")
    assert denied(eraser, "DELETE FROM quarantine")
    assert denied(eraser, "DELETE FROM erasure_tombstones")
    assert denied(eraser, "TRUNCATE erasure_tombstones")
    with database.owner.engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM erasure_tombstones")).scalar_one() == report.tombstones_added


def test_monitor_exports_the_counters_and_reads_nothing_else(database, tmp_path):
    crawl(database.owner, tmp_path)
    monitor = database.login(database.names.monitor)
    monitor.create_schema()  # what `dedup-pipeline metrics` does first: no DDL or write on an existing schema
    with monitor.engine.connect() as conn:
        assert "scraper_records_seen_total 7.0" in prometheus_text(conn)
    for table in ("records", *PERSONAL_TABLES, "near_duplicate_links", "near_duplicate_clusters", "crawl_batches"):
        assert denied(monitor, f"SELECT count(*) FROM {table}"), table
    assert denied(monitor, "UPDATE exact_rung_runs SET stats = '{}'")
    assert denied(monitor, "DELETE FROM near_rung_runs")


def test_under_the_writer_role_statistics_are_left_to_autovacuum_without_a_warning(database):
    # PostgreSQL lets only an owner analyse a table; the writer owns nothing, so the rungs must not try.
    without_autovacuum(database.owner)
    add_rows(database.owner, 0, ANALYZE_FLOOR + 2000)
    wait_for_live_rows(database.owner, ANALYZE_FLOOR + 2000)
    writer = database.login(database.names.writer)
    notices = []
    with writer.engine.begin() as conn:
        conn.connection.driver_connection.add_notice_handler(lambda notice: notices.append(notice.message_primary))
        assert analyze_grown(conn, {dedup_decisions: ()}) == []
        analyze(conn, dedup_decisions)
    assert notices == []  # PostgreSQL would have warned "only table or database owner can analyze it"
    assert counted_and_live(database.owner)[0] <= 0  # never analysed
    with database.owner.engine.begin() as conn:
        assert analyze_grown(conn, {dedup_decisions: ()}) == ["dedup_decisions"]


def test_grant_roles_names_on_the_command_line_are_the_role_names_fields():
    """Must hold: one flag per `RoleNames` field, its help naming the field's default, and a flag left out keeps it."""
    import dataclasses

    from dedup_pipeline.cli import build_parser
    from dedup_pipeline.cli.erasure import ROLES, role_names

    defaults = {f.name: f.default for f in dataclasses.fields(RoleNames)}
    assert list(ROLES) == list(defaults)
    grant = build_parser()._subparsers._group_actions[0].choices["grant-roles"]
    helps = {a.dest: a.help for a in grant._actions if a.dest in ROLES}
    assert all(f"(default {defaults[role]})" in helps[role] for role in ROLES), helps
    args = build_parser().parse_args(["grant-roles", "--analyst", "bi_readers"])
    assert RoleNames(**role_names(args)) == RoleNames(analyst="bi_readers")
