"""No personal field value leaks into anything the pipeline writes besides the records themselves.

A crawl whose personal fields (seller id and name, e-mail and phone extras, a
nested author) each carry a unique marker runs through the real code
location in process: the whole ladder with its checks, twice, then an erasure
and the retention job. Then everything written is searched for the markers:
every column of every table in the warehouse, every event of every run
(logs, asset metadata, check results), captured stdout/stderr and Python
logging (with the decision logger on), and every file in the data folder.

By design, a record's personal data lives in its payload: `records.payload`,
`record_history.payload` and `canonical_records.payload` (the staged copy),
and `quarantine.raw_line` keeps the raw bytes of a bad line so an operator
can see why it failed. Those four columns are excluded explicitly below, and
checked to hold the markers before the erasure, which proves the search finds
them. Quarantine is protected instead: analysts cannot read it (roles.sql),
retention deletes it after DEDUP_QUARANTINE_RETENTION_DAYS, and erasure
deletes the lines that hold a subject. An erase_subject run's config names
the subject (it must): that is in the run record, never in its events (which
are searched), and the retention job deletes finished erasure runs.
"""

from __future__ import annotations

import json
import logging
import secrets
import uuid
from datetime import datetime

import dagster as dg
import pytest
from sqlalchemy import MetaData, select

from dedup_pipeline.definitions import defs
from dedup_pipeline.defs.partitions import crawl_batches_partitions
from dedup_pipeline.environment import TOMBSTONE_KEY_ENV
from dedup_pipeline.store.warehouse import Warehouse
from dedup_pipeline_tests.helpers import listing, write_batch

pytestmark = [pytest.mark.postgres, pytest.mark.parametrize("warehouse_url", ["postgresql"], indirect=True)]

#: Where personal data lives by design (see the module docstring).
BY_DESIGN = {
    ("records", "payload"),
    ("record_history", "payload"),
    ("canonical_records", "payload"),
    ("quarantine", "raw_line"),
}
T0 = 1_700_000_000


def markers() -> dict[str, str]:
    tag = uuid.uuid4().hex[:12]
    return {
        name: f"PII{tag}{name.upper()}"
        for name in (
            "seller",
            "seller_name",
            "email",
            "phone",
            "author_name",
            "author_email",
            "contact",
            "bad_url",
            "broken",
        )
    }


def personal_records(m: dict[str, str]) -> tuple[list, list]:
    person = dict(
        seller_id=m["seller"],
        seller_name=m["seller_name"],
        seller_email=f"{m['email']}@example.org",
        seller_phone=f"+44 {m['phone']}",
        author={"name": m["author_name"], "email": f"{m['author_email']}@example.com"},
        contact=f"mailto:{m['contact']}@example.net",
    )
    day1 = [listing(n) for n in range(8)]
    day1 += [
        listing(50, **person),  # stored
        listing(51, **person, currency=None),  # content/2 cannot hash it: an error row
        listing(52, **{**person, "seller_id": {"id": m["seller"]}}),  # content/2: seller_id not text
        listing(53, **person, url=f"ftp://example.org/{m['bad_url']}"),  # quarantined: not http(s)
        '{"url": "https://shop.example.com/p/54", "seller_id": "' + m["broken"] + '", "title": ',  # malformed JSON
    ]
    day2 = [listing(50, **person, crawl_id="again", proxy_ip="10.9.9.9")]  # exact duplicate
    day2 += [listing(51, **person, currency=None, price="99.00")]  # changed: history
    day2 += [listing(n, crawl_id="again") for n in range(8)]
    return day1, day2


def run_job(name: str, instance, **kwargs) -> dg.ExecuteInProcessResult:
    result = defs.resolve_job_def(name).execute_in_process(instance=instance, raise_on_error=False, **kwargs)
    assert result.success, [
        (e.message, e.step_failure_data.error.to_string() if e.is_step_failure else "")
        for e in result.all_events
        if e.is_failure
    ]
    return result


def text_of(value) -> str:
    if value is None:
        return ""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).decode("utf-8", errors="replace")
    if isinstance(value, (dict, list)):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, datetime):
        return value.isoformat()
    return str(value)


def warehouse_leaks(warehouse: Warehouse, needles: list[str]) -> tuple[list, set]:
    """(leaks outside the by-design columns, by-design columns that hold a marker)."""
    reflected = MetaData()
    reflected.reflect(warehouse.engine)
    leaks, held = [], set()
    with warehouse.engine.connect() as conn:
        for table in reflected.sorted_tables:
            for row in conn.execute(select(table)).mappings():
                for column, value in row.items():
                    found = [n for n in needles if n in text_of(value)]
                    if not found:
                        continue
                    if (table.name, column) in BY_DESIGN:
                        held.add((table.name, column))
                    else:
                        leaks.append((table.name, column, found))
    return leaks, held


def event_leaks(instance, run_ids: list[str], needles: list[str]) -> list:
    leaks = []
    for run_id in run_ids:
        for record in instance.all_logs(run_id):
            text = dg.serialize_value(record)
            leaks += [(run_id, record.dagster_event_type, n) for n in needles if n in text]
    return leaks


def test_no_personal_value_is_written_outside_the_records(warehouse_url, tmp_path, monkeypatch, capfd, caplog):
    m = markers()
    needles = list(m.values())
    data_dir, landing = tmp_path / "data", tmp_path / "landing"
    for name, value in {
        "DEDUP_DATABASE_URL": warehouse_url,
        "DEDUP_DATA_DIR": str(data_dir),
        "DEDUP_LANDING_DIR": str(landing),
        TOMBSTONE_KEY_ENV: secrets.token_hex(32),
    }.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("DEDUP_REDIS_URL", raising=False)  # the Bloom seen-set, whose file is searched too
    caplog.set_level(logging.DEBUG)
    logging.getLogger("dedup_pipeline.decisions").setLevel(logging.INFO)  # the decision events, on
    day1, day2 = personal_records(m)
    write_batch(landing, "day1", day1, landed=T0)
    write_batch(landing, "day2", day2, landed=T0 + 86400)
    instance = dg.DagsterInstance.ephemeral()
    instance.add_dynamic_partitions(crawl_batches_partitions.name, ["day1", "day2"])

    ladder_runs = [run_job("dedup_ladder", instance, partition_key=key).run_id for key in ("day1", "day2")]
    warehouse = Warehouse(warehouse_url)
    leaks, held = warehouse_leaks(warehouse, needles)
    assert leaks == []
    assert held == BY_DESIGN  # positive control: the search does find the markers where they are meant to be

    def erase(field: str, value: str) -> dg.ExecuteInProcessResult:
        return run_job(
            "erase_subject",
            instance,
            run_config={
                "ops": {
                    "erase_data_subject": {
                        "config": {"kind": "field", "field": field, "value": value, "request_id": "DSR-1"}
                    }
                }
            },
        )

    by_id = erase("seller_id", m["seller"])
    assert by_id.output_for_node("erase_data_subject")["records"] == 2  # listings 50 and 51 (and 51's history)
    # Listing 52 holds the id as {"id": ...}, which the seller_id field path does not name; the request's
    # second identifier (the seller's name) reaches it.
    by_name = erase("seller_name", m["seller_name"])
    assert by_name.output_for_node("erase_data_subject")["records"] == 1
    ladder_runs.append(run_job("dedup_ladder", instance, partition_key="day1").run_id)  # re-crawl after erasure
    retention = run_job("prune_retention", instance, run_config={"ops": {"prune_expired_rows": {"config": {}}}})

    leaks, held = warehouse_leaks(warehouse, needles)
    assert leaks == []
    # Only the malformed line is left: it cannot be parsed, and it names the seller by a value the request
    # did not name. Retention deletes it after DEDUP_QUARANTINE_RETENTION_DAYS.
    assert held == {("quarantine", "raw_line")}
    assert event_leaks(instance, [*ladder_runs, retention.run_id], needles) == []
    # The erasure runs' config names the subject (see above); their events must not.
    assert event_leaks(instance, [by_id.run_id, by_name.run_id], needles) == []

    out, err = capfd.readouterr()
    assert [n for n in needles if n in out + err] == []
    assert [n for n in needles if n in caplog.text] == []
    assert any("dedup_decision" in r.getMessage() for r in caplog.records)  # the decision logger did write
    for path in data_dir.rglob("*"):
        if path.is_file():
            assert [n for n in needles if n.encode() in path.read_bytes()] == [], path
