"""`heap.settle`: the objects alive now leave the garbage collector's full collections; garbage does not."""

from __future__ import annotations

import gc
import weakref

import pytest

from dedup_pipeline import heap


class _Node:
    def __init__(self) -> None:
        self.other = self


@pytest.fixture
def unfrozen():
    """Give this test process its collector back as it was: frozen objects walked again, its thresholds."""
    thresholds = gc.get_threshold()
    yield thresholds
    gc.unfreeze()
    gc.set_threshold(*thresholds)


def _tracked(value) -> bool:
    """Whether a collection would walk `value` (objects in the permanent generation are not listed)."""
    return any(o is value for o in gc.get_objects())


def test_settle_freezes_what_is_alive_and_collects_the_garbage_first(unfrozen):
    """Breaks: `settle` freezes garbage (a cycle nobody holds would then live as long as the process) or does
    not freeze what is alive (full collections keep walking the imports' objects)."""
    kept = [[] for _ in range(1_000)]
    garbage = _Node()
    gone = weakref.ref(garbage)
    del garbage
    before = gc.get_freeze_count()

    heap.settle()

    assert gone() is None, "a cycle nobody held was frozen instead of collected"
    assert gc.get_freeze_count() >= before + len(kept)
    assert not _tracked(kept) and not any(_tracked(inner) for inner in kept[:10])
    later = []
    assert _tracked(later), "what comes after a settle is collected as usual"


def test_a_settled_object_is_still_freed_when_its_last_reference_goes(unfrozen):
    """Breaks: a frozen object outlives its last reference (freezing would then leak every settled value)."""
    value = _Node()
    value.other = None  # no cycle: reference counting frees it
    freed = weakref.ref(value)
    heap.settle()
    del value
    assert freed() is None


def test_a_settled_process_collects_its_youngest_generation_less_often(unfrozen):
    """Breaks: `settle` leaves Python's default young threshold (700), a young collection every 700 containers."""
    heap.settle()
    assert gc.get_threshold() == (heap.YOUNG_THRESHOLD, *unfrozen[1:])


_FIRST_SUITE = """
import gc
import pandas as pd
from dedup_pipeline.quality.expectations import Expect, validate

suite = [Expect("ExpectColumnValuesToNotBeNull", {"column": "a"})]
before = gc.get_freeze_count()
first = validate(pd.DataFrame({"a": [1, 2]}), "probe", suite)
after = gc.get_freeze_count()
second = validate(pd.DataFrame({"a": [3, None]}), "probe", suite)
print(before, after > 100_000, gc.get_freeze_count() == after, first.success, second.success)
"""


def test_a_runs_process_settles_once_it_has_imported_great_expectations(tmp_path):
    """Breaks: the suites leave Great Expectations' objects in every full collection, or settle again at every
    suite (freezing each run's live objects with them)."""
    import subprocess
    import sys

    script = tmp_path / "first_suite.py"
    script.write_text(_FIRST_SUITE)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, check=True, timeout=300)
    assert done.stdout.split() == ["0", "True", "True", "True", "False"]
