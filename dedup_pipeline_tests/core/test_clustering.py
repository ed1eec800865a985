"""Union-find clustering: deterministic, stable ids, representative rules."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dedup_pipeline.core.clustering import Cluster, cluster_labels, cluster_records, connected_components


def test_connected_components_roots_are_smallest_members():
    roots = connected_components(7, [5, 1, 3, 6], [4, 2, 1, 4])
    assert roots.tolist() == [0, 1, 1, 1, 4, 4, 4]


def test_cluster_records_basic():
    clusters = cluster_records([10, 20, 30, 40, 50], [(20, 40, 0.9), (40, 50, 0.8)])
    assert clusters == [
        Cluster(cluster_id=10, representative=10, members=(10,)),
        Cluster(cluster_id=20, representative=20, members=(20, 40, 50)),
        Cluster(cluster_id=30, representative=30, members=(30,)),
    ]


def test_representative_rules():
    ids = [7, 3, 9, 5]
    links = [(7, 3), (3, 9), (9, 5)]
    lengths = {7: 100, 3: 40, 9: 100, 5: 10}
    (oldest,) = cluster_records(ids, links, "oldest")
    assert oldest.representative == 3 and oldest.cluster_id == 3
    (longest,) = cluster_records(ids, links, "longest", lengths)
    assert longest.representative == 7  # 7 and 9 tie on length: the smaller id wins
    assert longest.cluster_id == 3  # the id does not depend on the rule
    # lengths aligned with ids work too
    assert cluster_records(ids, links, "longest", [100, 40, 100, 10])[0].representative == 7
    with pytest.raises(ValueError):
        cluster_records(ids, links, "longest")  # needs lengths
    with pytest.raises(ValueError):
        cluster_records(ids, links, "newest")


def test_labels_point_at_representatives():
    labels = cluster_labels(6, [(4, 2), (2, 5)], "longest", [1, 1, 3, 1, 9, 9])
    assert labels.tolist() == [0, 1, 4, 3, 4, 4]
    assert cluster_labels(3, [], "oldest").tolist() == [0, 1, 2]
    with pytest.raises(ValueError):
        cluster_labels(3, [(0, 3)])


def test_unknown_or_duplicate_ids_are_refused():
    with pytest.raises(ValueError):
        cluster_records([1, 2], [(1, 3)])
    with pytest.raises(ValueError):
        cluster_records([1, 1], [])


@settings(max_examples=60, deadline=None)
@given(
    ids=st.sets(st.integers(0, 10**12), min_size=1, max_size=30),
    data=st.data(),
    rule=st.sampled_from(["oldest", "longest"]),
)
def test_same_result_under_any_input_order(ids, data, rule):
    ids = sorted(ids)
    links = data.draw(st.lists(st.tuples(st.sampled_from(ids), st.sampled_from(ids)), max_size=40))
    lengths = {i: data.draw(st.integers(0, 5)) for i in ids}
    expected = cluster_records(ids, links, rule, lengths)
    rng = random.Random(len(ids) * 1000 + len(links))
    shuffled_ids = rng.sample(ids, len(ids))
    shuffled_links = rng.sample([(b, a) if rng.random() < 0.5 else (a, b) for a, b in links], len(links))
    assert cluster_records(shuffled_ids, shuffled_links, rule, lengths) == expected
    # every id in exactly one cluster, ids are the smallest member, representatives are members
    assert sorted(i for c in expected for i in c.members) == ids
    for c in expected:
        assert c.cluster_id == min(c.members) and c.representative in c.members
        if rule == "longest":
            best = max(lengths[m] for m in c.members)
            assert c.representative == min(m for m in c.members if lengths[m] == best)
