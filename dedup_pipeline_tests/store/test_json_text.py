"""JSON columns through orjson: the values of the `json` module, never a lossy shortcut."""

from __future__ import annotations

import json
import math
from datetime import UTC

import pytest
from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy import insert, select

from dedup_pipeline.store import json_text
from dedup_pipeline.store.bulk import copy_rows
from dedup_pipeline.store.schema import exact_rung_runs
from dedup_pipeline.store.warehouse import utcnow

# Values orjson alone gets wrong (silently) or refuses, each paired with what `json` makes of it.
AWKWARD = [
    12345678901234567890123,  # beyond 64 bits: orjson reads it as a float
    -(2**63) - 1,
    2**64,
    {"price": [1, {"minor": 10**30}]},  # nested
    1e300,  # a large float that is a float
    -0.0,
    '\u00e9t\u00e9 \U0001f600 \x1f "quoted" \\',
]

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


def same(a, b) -> bool:
    """Equal, with types: 1 and 1.0 (or True) differ in a warehouse row."""
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True) and type(a) is type(b)


@pytest.mark.parametrize("value", AWKWARD)
def test_awkward_values_round_trip_as_the_json_module_reads_them(value):
    text = json_text.dumps(value)
    assert same(json_text.loads(text), json.loads(text))
    assert same(json_text.loads(text.encode()), value)
    assert same(json_text.loads(memoryview(text.encode())), value)


@given(json_values)
def test_any_json_value_decodes_exactly_as_json_loads_does(value):
    text = json.dumps(value, ensure_ascii=False)
    assert same(json_text.loads(text), json.loads(text))
    assert same(json_text.loads(json_text.dumps(value)), json.loads(text))


@pytest.mark.parametrize("value", [math.nan, [1, {"a": math.inf}], -math.inf])
def test_nan_and_infinity_are_not_written_as_null(value):
    # orjson would write null; the json module writes a token every database refuses, so the error stays loud.
    assert "null" not in json_text.dumps(value)
    assert json_text.dumps(value) == json.dumps(value, separators=(",", ":"))


def test_values_orjson_cannot_encode_are_written_by_the_json_module():
    from decimal import Decimal

    with pytest.raises(TypeError, match="Decimal"):
        json_text.dumps({"price": Decimal("1.5")})  # as json.dumps: never a silent float
    assert json_text.dumps({"n": 10**40}) == '{"n":' + str(10**40) + "}"


def test_types_json_refuses_or_writes_its_own_way_are_left_to_it():
    from datetime import datetime
    from enum import Enum

    class Kind(str, Enum):
        EXACT = "exact"

    with pytest.raises(TypeError, match="datetime"):
        json_text.dumps({"at": datetime(2026, 11, 30, tzinfo=UTC)})  # orjson would write a string
    value = {"kind": Kind.EXACT, 1: True}
    assert json_text.dumps(value) == json.dumps(value, separators=(",", ":"))


def test_json_columns_keep_huge_integers_through_both_write_paths(warehouse):
    stats = {"huge": 12345678901234567890123, "negative": -(2**70), "ratio": 0.25, "text": "caf\u00e9"}
    now = utcnow()
    with warehouse.engine.begin() as conn:
        conn.execute(insert(exact_rung_runs).values(batch_id="a", run_id="r", finished_at=now, stats=stats))
        copy_rows(conn, exact_rung_runs, ("batch_id", "run_id", "finished_at", "stats"), [("b", "r", now, stats)])
    with warehouse.engine.connect() as conn:
        stored = conn.execute(select(exact_rung_runs.c.stats).order_by(exact_rung_runs.c.batch_id)).scalars().all()
    assert stored == [stats, stats]
    assert all(type(row["huge"]) is int and type(row["ratio"]) is float for row in stored)
