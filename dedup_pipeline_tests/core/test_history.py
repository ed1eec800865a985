"""Where a late batch's versions go in a key's history (dedup_pipeline.core.history), pure."""

from __future__ import annotations

from dedup_pipeline.core.history import Version, file_late_versions
from dedup_pipeline.core.records import CanonicalRecord

V = "content/1"


def _record(line: int, digest: str) -> CanonicalRecord:
    return CanonicalRecord(line, "https://a.example/p", "https://a.example/p", {"d": digest}, {V: digest})


def _filed(chain, late, batch):
    plan = file_late_versions(chain, late, (batch, f"b{batch}"), V)
    return [(record.hashes[V], by) for record, by in plan.inserts], plan.moves, plan.current_copy


def test_a_version_older_than_every_stored_one_is_superseded_by_the_first():
    chain = [Version("v1", (1, "b1", 0), 10, "b2"), Version("v2", (2, "b2", 0), last=(2, "b2", 1))]
    assert _filed(chain, [_record(1, "v0")], 0) == ([("v0", "b1")], {}, None)


def test_a_version_between_two_moves_the_earlier_ones_row_to_it():
    chain = [Version("v0", (0, "b0", 0), 10, "b2"), Version("v2", (2, "b2", 0), last=(2, "b2", 1))]
    assert _filed(chain, [_record(1, "v1")], 1) == ([("v1", "b2")], {10: "b1"}, None)


def test_the_content_of_the_next_version_brings_that_version_earlier():
    chain = [Version("v0", (0, "b0", 0), 10, "b2"), Version("v2", (2, "b2", 0), last=(2, "b2", 1))]
    assert _filed(chain, [_record(1, "v2")], 1) == ([], {10: "b1"}, None)


def test_the_content_of_the_version_before_is_a_recrawl():
    chain = [Version("v0", (0, "b0", 0), 10, "b2"), Version("v2", (2, "b2", 0), last=(2, "b2", 1))]
    assert _filed(chain, [_record(1, "v0")], 1) == ([], {}, None)


def test_a_version_inside_an_unchanged_recrawl_splits_the_current_content():
    """b0 and b2 hold the same content, b1 (late) another: in landing order b0's crawl was superseded by b1."""
    chain = [Version("v0", (0, "b0", 0), last=(2, "b2", 1))]
    assert _filed(chain, [_record(1, "v1")], 1) == ([("v1", "b2")], {}, ("b1", True))


def test_a_batch_already_in_the_chain_files_nothing_again():
    chain = [Version("v0", (0, "b0", 0), 10, "b1"), Version("v1", (1, "b1", 0), last=(1, "b1", 1))]
    assert _filed(chain, [_record(1, "v9")], 0) == ([], {}, None)


def test_two_versions_of_a_key_in_one_late_batch_go_in_line_order():
    chain = [Version("v1", (1, "b1", 0), last=(1, "b1", 1))]
    assert _filed(chain, [_record(3, "v0a"), _record(9, "v0b")], 0) == ([("v0a", "b0"), ("v0b", "b1")], {}, None)
