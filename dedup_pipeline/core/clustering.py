"""Deterministic clustering of verified near-duplicate links.

Clusters are the connected components of the links (union-find). Nothing
depends on the order of the records or of the links:

* the cluster id is the smallest record id in the cluster, so it stays the
  same whichever rule picks the representative and however the input is
  ordered (it only changes when clusters merge);
* the representative is chosen by a rule:

  - ``"oldest"``: the smallest record id (ids grow with insertion time, or
    are positions in the input), or the oldest by ``ages`` where given (the
    warehouse gives the order of first landing, the same in any run order);
  - ``"longest"``: the record with the longest text, ties to the smallest id.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

RULES = ("oldest", "longest")
#: The rule a cluster's representative is chosen by unless told otherwise.
DEFAULT_RULE = "oldest"


@dataclass(frozen=True)
class Cluster:
    """One cluster: its stable id, its representative and its sorted members."""

    cluster_id: int
    representative: int
    members: tuple[int, ...]


def connected_components(n: int, left: Iterable[int], right: Iterable[int]) -> np.ndarray:
    """Root of each position ``0..n-1``; the root is the smallest position in the component."""
    parent = list(range(n))

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]  # path halving
            x = parent[x]
        return x

    for a, b in zip(left, right):
        ra, rb = find(int(a)), find(int(b))
        if ra < rb:
            parent[rb] = ra
        elif rb < ra:
            parent[ra] = rb
    return np.fromiter((find(x) for x in range(n)), dtype=np.int64, count=n)


def _representatives(
    roots: np.ndarray, rule: str, lengths: np.ndarray | None, ages: np.ndarray | None = None
) -> np.ndarray:
    """Representative position of each position's component, by ``rule``.

    ``ages`` (a rank per position, smaller is older) replaces the position as
    what "oldest" means and as the tie-break of "longest".
    """
    if rule not in RULES:
        raise ValueError(f"rule must be one of {RULES}, got {rule!r}")
    if rule == "oldest" and ages is None:
        return roots
    if rule == "longest" and lengths is None:
        raise ValueError('rule "longest" needs lengths')
    positions = np.arange(roots.size) if ages is None else np.asarray(ages, dtype=np.int64)
    longest = -np.asarray(lengths, dtype=np.int64) if rule == "longest" else np.zeros(roots.size, dtype=np.int64)
    # Within each component: longest first (for "longest"), then oldest.
    order = np.lexsort((positions, longest, roots))
    first = np.r_[True, roots[order][1:] != roots[order][:-1]]
    best = np.empty(roots.size, dtype=np.int64)
    best[roots[order][first]] = order[first]
    return best[roots]


def cluster_labels(
    n: int,
    links: Iterable[Sequence],
    rule: str = DEFAULT_RULE,
    lengths: Sequence[int] | np.ndarray | None = None,
) -> np.ndarray:
    """Label of each position ``0..n-1``: the position of its cluster's representative.

    ``links`` are ``(i, j)`` or ``(i, j, similarity)`` position pairs.
    """
    links = list(links)
    left = [link[0] for link in links]
    right = [link[1] for link in links]
    if links and (min(min(left), min(right)) < 0 or max(max(left), max(right)) >= n):
        raise ValueError("link refers to a position outside 0..n-1")
    roots = connected_components(n, left, right)
    return _representatives(roots, rule, None if lengths is None else np.asarray(lengths))


def cluster_records(
    ids: Sequence[int],
    links: Iterable[Sequence],
    rule: str = DEFAULT_RULE,
    lengths: Mapping[int, int] | Sequence[int] | None = None,
    ages: Mapping[int, Sequence[int]] | None = None,
) -> list[Cluster]:
    """Clusters of record ``ids`` (singletons included), sorted by cluster id.

    ``links`` are ``(id_a, id_b)`` or ``(id_a, id_b, similarity)`` over
    ``ids``; ``lengths`` (text lengths, needed by ``"longest"``) is a mapping
    from id or a sequence aligned with ``ids``. ``ages`` (id -> a sortable
    key, smaller is older; the warehouse's order of first landing) says which
    record is oldest; without it the smallest id is.
    """
    sorted_ids = sorted(set(ids))
    if len(sorted_ids) != len(ids):
        raise ValueError("ids must be unique")
    position = {record_id: p for p, record_id in enumerate(sorted_ids)}
    try:
        pairs = [(position[link[0]], position[link[1]]) for link in links]
    except KeyError as missing:
        raise ValueError(f"link refers to unknown id {missing}") from None
    length_array = None
    if lengths is not None:
        by_id = lengths if isinstance(lengths, Mapping) else dict(zip(ids, lengths))
        length_array = np.array([by_id[record_id] for record_id in sorted_ids], dtype=np.int64)
    roots = connected_components(len(sorted_ids), [a for a, _ in pairs], [b for _, b in pairs])
    age_ranks = None
    if ages is not None:
        by_age = sorted(range(len(sorted_ids)), key=lambda p: (tuple(ages[sorted_ids[p]]), sorted_ids[p]))
        age_ranks = np.empty(len(sorted_ids), dtype=np.int64)
        age_ranks[by_age] = np.arange(len(sorted_ids))
    representatives = _representatives(roots, rule, length_array, age_ranks)
    members: dict[int, list[int]] = {}
    for p, root in enumerate(roots.tolist()):
        members.setdefault(root, []).append(sorted_ids[p])
    return [
        Cluster(
            cluster_id=sorted_ids[root],
            representative=sorted_ids[int(representatives[root])],
            members=tuple(group),
        )
        for root, group in sorted(members.items())
    ]
