"""The duplicate-class policy, replayed in file order."""

from datetime import UTC, datetime

import pytest

from dedup_pipeline.core.exact import DuplicatePolicy, StoredRow, plan_chunk
from dedup_pipeline.core.records import CanonicalRecord

T1 = datetime(2026, 11, 1, tzinfo=UTC)
T2 = datetime(2026, 11, 2, tzinfo=UTC)


def rec(line, key, digest):
    return CanonicalRecord(line_no=line, canonical_url=key, natural_key=key, payload={}, hashes={"v": digest})


def decisions(plan):
    return [(r.line_no, d.value) for r, d in plan.decisions]


def test_new_exact_and_changed_in_file_order():
    plan = plan_chunk(
        [rec(1, "k1", "a"), rec(2, "k1", "a"), rec(3, "k2", "a"), rec(4, "k1", "b")], "v", {}, {}, (T1, "b1")
    )
    assert decisions(plan) == [(1, "new"), (2, "exact_duplicate"), (3, "exact_duplicate"), (4, "changed")]
    # the last occurrence wins, the earlier version of the key goes to history
    assert plan.inserts["k1"].line_no == 4 and plan.first_inserted["k1"].line_no == 1  # first seen at line 1
    assert [(old.line_no, new.line_no) for old, new in plan.chunk_superseded] == [(1, 4)]


def test_against_stored_rows():
    stored = {"k1": StoredRow(7, "a", (T1, "b1", 3))}
    plan = plan_chunk([rec(1, "k1", "b"), rec(2, "k2", "a"), rec(3, "k3", "c")], "v", stored, {"a": {"k1"}}, (T2, "b2"))
    assert decisions(plan) == [(1, "changed"), (2, "new"), (3, "new")]
    assert plan.updates["k1"][1].record_id == 7 and plan.stored_superseded == [stored["k1"]]
    # "a" left the table with k1's old version, so k2 may now store it
    assert set(plan.inserts) == {"k2", "k3"}


def test_an_older_batch_never_overwrites_newer_content():
    stored = {"k1": StoredRow(7, "b", (T2, "b2", 1))}
    plan = plan_chunk([rec(5, "k1", "a")], "v", stored, {}, (T1, "b1"))
    assert decisions(plan) == [(5, "stale")] and not plan.updates


def test_a_newer_recrawl_of_the_stored_content_dates_the_row_to_its_batch():
    stored = {"k1": StoredRow(7, "a", (T1, "b1", 3)), "k2": StoredRow(8, "c", (T2, "b2", 1))}
    plan = plan_chunk([rec(4, "k1", "a"), rec(5, "k2", "c")], "v", stored, {"a": {"k1"}, "c": {"k2"}}, (T2, "b2"))
    assert decisions(plan) == [(4, "exact_duplicate"), (5, "exact_duplicate")]
    # k1 was stored by an older batch: its row moves to this one; k2 by this very batch: nothing to write
    assert plan.recrawls == {"k1": (plan.decisions[0][0], stored["k1"])}
    assert not (plan.inserts or plan.updates or plan.stored_superseded)
    # an older batch replayed afterwards is stale against the moved row, as in landing order
    moved = {"k1": StoredRow(7, "a", (T2, "b2", 4))}
    older = plan_chunk([rec(9, "k1", "x")], "v", moved, {}, (T1, "b0"))
    assert decisions(older) == [(9, "stale")] and not older.updates


def test_replaying_the_same_batch_plans_nothing():
    first = plan_chunk([rec(1, "k", "a"), rec(2, "k", "b")], "v", {}, {}, (T1, "b1"))
    assert decisions(first) == [(1, "new"), (2, "changed")]
    stored = {"k": StoredRow(1, "b", (T1, "b1", 2))}
    replay = plan_chunk([rec(1, "k", "a"), rec(2, "k", "b")], "v", stored, {"b": {"k"}}, (T1, "b1"))
    assert decisions(replay) == [(1, "stale"), (2, "exact_duplicate")]
    assert not (
        replay.inserts or replay.updates or replay.recrawls or replay.chunk_superseded or replay.stored_superseded
    )


def test_keep_first_policy_ignores_changes():
    stored = {"k1": StoredRow(7, "a", (T1, "b1", 1))}
    plan = plan_chunk(
        [rec(1, "k1", "b")], "v", stored, {"a": {"k1"}}, (T2, "b2"), DuplicatePolicy(on_changed="keep_first")
    )
    assert decisions(plan) == [(1, "change_ignored")] and not plan.updates


def test_erased_positions_are_suppressed():
    plan = plan_chunk([rec(1, "k1", "a"), rec(2, "k2", "b")], "v", {}, {}, (T1, "b1"), erased={0})
    assert decisions(plan) == [(1, "erased"), (2, "new")] and set(plan.inserts) == {"k2"}


def test_a_recrawl_then_a_change_of_the_same_key_in_one_chunk_is_one_update():
    """The unchanged re-crawl would date the row, the change rewrites it: one update, from the last occurrence."""
    stored = {"k1": StoredRow(7, "a", (T1, "b1", 3))}
    plan = plan_chunk([rec(1, "k1", "a"), rec(2, "k1", "b")], "v", stored, {}, (T2, "b2"))
    assert decisions(plan) == [(1, "exact_duplicate"), (2, "changed")]
    assert not plan.recrawls and plan.updates["k1"][0].line_no == 2 and plan.stored_superseded == [stored["k1"]]


def test_content_a_key_leaves_stays_stored_while_another_row_holds_it():
    """During a rehash overlap two rows may hold one digest: one of them changing leaves it stored."""
    stored = {"kb": StoredRow(8, "d", (T1, "b1", 2))}
    shared = plan_chunk([rec(1, "kb", "e"), rec(2, "kc", "d")], "v", stored, {"d": {"ka", "kb"}}, (T2, "b2"))
    assert decisions(shared) == [(1, "changed"), (2, "exact_duplicate")] and set(shared.inserts) == set()
    alone = plan_chunk([rec(1, "kb", "e"), rec(2, "kc", "d")], "v", stored, {"d": {"kb"}}, (T2, "b2"))
    assert decisions(alone) == [(1, "changed"), (2, "new")] and set(alone.inserts) == {"kc"}


def test_an_older_batch_run_after_the_rows_first_one_dates_their_first_version_to_it():
    """Out of landing order: a key stored from b2 that b1 (landed before) also brought was first seen in b1."""
    stored = {
        "k1": StoredRow(7, "a", (T2, "b2", 1), first=(T2, "b2")),  # b1 crawls it unchanged, twice
        "k2": StoredRow(8, "b", (T2, "b2", 2), first=(T2, "b2")),  # b1 has older content: stale
        "k3": StoredRow(9, "c", (T2, "b2", 3), first=(T1, "b0")),  # first stored before b1: stays
        "k4": StoredRow(10, "d", (T2, "b2", 4), first=(T2, "b2")),  # b1 has content k5 holds: k5's duplicate
    }
    chunk = [rec(1, "k1", "a"), rec(2, "k2", "x"), rec(3, "k3", "c"), rec(4, "k4", "e"), rec(5, "k1", "a")]
    plan = plan_chunk(chunk, "v", stored, {"a": {"k1"}, "b": {"k2"}, "c": {"k3"}, "d": {"k4"}, "e": {"k5"}}, (T1, "b1"))
    assert decisions(plan) == [
        (1, "exact_duplicate"),
        (2, "stale"),
        (3, "exact_duplicate"),
        (4, "exact_duplicate"),
        (5, "exact_duplicate"),
    ]
    assert {key: (record.line_no, row) for key, (record, row) in plan.antedated.items()} == {
        "k1": (1, stored["k1"]),
        "k2": (2, stored["k2"]),
    }
    assert not (plan.inserts or plan.updates or plan.recrawls or plan.stored_superseded)


def test_policy_validates_its_options():
    with pytest.raises(ValueError):
        DuplicatePolicy(on_changed="delete")
