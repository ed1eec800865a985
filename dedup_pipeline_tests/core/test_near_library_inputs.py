"""The library's entry points take any sequence of strings and refuse anything else in one clear line."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from dedup_pipeline.core.near import cluster_near_duplicates, near_duplicate_links, to_lean_minhashes

TEXTS = [
    "Sleeve Pink iCC2010PNK for iPad",
    "Sleeve Pink iCC2010PNK for iPad",
    "Router model WRT54GL fast",
    "Camera model DSC-W55 zoom",
]


@pytest.mark.parametrize("method", ["minhash", "simhash"])
def test_a_series_or_an_array_is_read_by_position(method):
    """Breaks: a pandas Series failed deep inside ("truth value ... ambiguous"), or under SimHash was read by its
    index labels, giving other clusters for the same texts."""
    want = cluster_near_duplicates(TEXTS, method=method)
    assert want == [0, 0, 2, 3]
    assert cluster_near_duplicates(pd.Series(TEXTS, index=[3, 2, 1, 0]), method=method) == want
    assert cluster_near_duplicates(np.array(TEXTS), method=method) == want
    assert cluster_near_duplicates(iter(TEXTS), method=method) == want


@pytest.mark.parametrize(
    "texts, says",
    [
        ("Sleeve Pink", "texts is one string"),
        (["a text", None], "item 1 is NoneType"),
        ([b"bytes"], "item 0 is bytes"),
        (["a text", float("nan")], "item 1 is float"),
    ],
)
def test_what_is_not_a_sequence_of_strings_is_refused_in_one_line(texts, says):
    for call in (cluster_near_duplicates, near_duplicate_links, to_lean_minhashes):
        with pytest.raises(TypeError, match=says):
            call(texts)


@pytest.mark.parametrize(
    "call, args",
    [
        ("threshold_recall", (2, 26, 3)),
        ("threshold_recall", (-1, 26, 3)),
        ("threshold_warning", (0, 26, 3)),
        ("lowest_threshold", (0, 3)),
    ],
)
def test_the_banding_helpers_refuse_what_has_no_meaning(call, args):
    """Breaks: threshold_recall(2, 26, 3) answered -9.4e21, lowest_threshold(0, 3) divided by zero."""
    from dedup_pipeline.core import near

    with pytest.raises(ValueError, match="must be"):
        getattr(near, call)(*args)


@pytest.mark.parametrize(
    "options, refused",
    [({"method": "simhash", "num_perm": 64}, "num_perm"), ({"simhash_max_distance": 6}, "simhash_max_distance")],
)
def test_the_library_refuses_a_setting_its_method_does_not_read(options, refused):
    with pytest.raises(ValueError, match=f"^{refused}: "):
        cluster_near_duplicates(["a b c d", "a b c e"], **options)
