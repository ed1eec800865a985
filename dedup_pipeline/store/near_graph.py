"""Links and clusters on the near-duplicate index: link records, merge their clusters, take records out.

Shared by the near rung (a chunk at a time), erasure and the rehash retire
step. The result does not depend on the order records were linked in:

- a record's links are its `max_links` most similar earlier-landed near
  duplicates (ties to the oldest), wherever they were found: a record
  linked before an older one (a late batch, another worker) gains its link
  when the older one comes, and loses the farthest of its links if it has
  more;
- a cluster is a connected component of every verified pair (not only of
  the links kept), its id the smallest record id in it, its representative
  the oldest member by the order of first landing (or the longest text).

Locks, row by row in id order: `link_records` takes the index rows of the records whose links change, then
the clusters merged (`store.near.locked_roots`); `remove_records` takes the removed records' clusters first. A
deadlock between two workers' chunks is retried by the rung (`ladder.near`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
from sqlalchemy import Connection

from dedup_pipeline.core.clustering import cluster_records
from dedup_pipeline.core.lsh import candidate_pairs as pairs_in_memory
from dedup_pipeline.core.lsh import sorted_unique
from dedup_pipeline.core.minhash import bbit_jaccard_pairs
from dedup_pipeline.core.near import NearDupParams, keep_shared_codes, verify_pairs
from dedup_pipeline.core.simhash import BITS, hamming_distance
from dedup_pipeline.store import near as index

#: A text by record id, for the exact Jaccard of the pairs that need it (the rung passes its chunk's texts).
Texts = Callable[[list[int]], Mapping[int, str]]


@dataclass
class LinkOutcome:
    """What linking a set of records found: counts, the records of the set that have near duplicates, clusters."""

    candidate_pairs: int = 0
    pairs: int = 0
    apart_by_codes: int = 0  # pairs similar enough that name different codes (`require_shared_code`)
    capped: set = field(default_factory=set)
    linked: set = field(default_factory=set)
    links_added: int = 0  # links stored, less the links of the same records that made way for them (`max_links`)
    clusters: dict = field(default_factory=dict)  # cluster id -> size, for clusters holding one of the records


def stored_texts(conn: Connection) -> Texts:
    """Texts read from the stored payloads, as they are needed."""
    return lambda ids: index.load_texts(conn, ids)


def signature_width(params: NearDupParams) -> int:
    return 8 if params.method == "simhash" else params.num_perm


def band_count(params: NearDupParams) -> int:
    return params.simhash_max_distance + 1 if params.method == "simhash" else params.bands


def _similarities(params: NearDupParams, rows: index.IndexRows, left: np.ndarray, right: np.ndarray) -> np.ndarray:
    if params.method == "simhash":
        fingerprints = rows.signatures.copy().view("<u8").ravel()
        return 1.0 - hamming_distance(fingerprints[left], fingerprints[right]).astype(np.float64) / BITS
    return bbit_jaccard_pairs(rows.signatures, left, right)


def verified(
    params: NearDupParams, rows: index.IndexRows, left: np.ndarray, right: np.ndarray, texts: Texts
) -> tuple[list[tuple[int, int, float]], int]:
    """The pairs of positions in `rows` that are near duplicates, with their similarity, and how many pairs
    similar enough the shared-code rule kept apart."""
    if not left.size:
        return [], 0
    read: dict[int, str] = {}

    def texts_at(positions: Sequence[int]) -> dict[int, str]:  # each text read once, and only where needed
        missing = [p for p in positions if p not in read]
        if missing:
            by_id = texts([int(rows.ids[p]) for p in missing])
            read.update({p: by_id.get(int(rows.ids[p]), "") for p in missing})
        return {p: read[p] for p in positions}

    def shingles(positions: np.ndarray) -> dict[int, list[bytes]]:  # only the pairs whose estimate is too close
        return {p: params.normaliser.shingle_bytes(text) for p, text in texts_at(positions.tolist()).items()}

    estimates = _similarities(params, rows, left, right)
    if params.method == "simhash":
        keep = estimates >= 1.0 - params.simhash_max_distance / BITS
        found = list(zip(left[keep].tolist(), right[keep].tolist(), estimates[keep].tolist()))
    else:
        found = verify_pairs(rows.signatures, left, right, params, shingles, estimates=estimates)
    kept = keep_shared_codes(found, params, texts_at)
    return kept, len(found) - len(kept)


def _positions(ids: np.ndarray, pairs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct pairs of record ids as (left, right) positions in `ids`, left < right; pairs naming a record
    not in `ids` (gone since the candidates were read) are dropped."""
    if not len(pairs):
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    order = np.argsort(ids, kind="stable")
    found = np.searchsorted(ids[order], pairs).clip(0, max(ids.size - 1, 0))
    positions = order[found]
    present = (ids[positions] == pairs).all(axis=1)
    a, b = positions[present, 0], positions[present, 1]
    code = sorted_unique(np.minimum(a, b) * ids.size + np.maximum(a, b))
    return code // ids.size, code % ids.size


def _age_ranks(rows: index.IndexRows) -> np.ndarray:
    """Each position's rank from oldest (0): first landing, first seen, key order, then id."""
    order = np.lexsort((rows.ids, rows.order[:, 2], rows.order[:, 1], rows.order[:, 0]))
    ranks = np.empty(order.size, dtype=np.int64)
    ranks[order] = np.arange(order.size)
    return ranks


def link_records(
    conn: Connection,
    mine: index.IndexRows,
    params: NearDupParams,
    texts: Texts,
    batch_id: str,
    max_links: int,
    max_candidates: int | None,
) -> LinkOutcome:
    """Find the near duplicates of `mine` (index rows already stored) in the whole index; link and cluster them."""
    out = LinkOutcome()
    bands, width = band_count(params), signature_width(params)
    pairs, capped = index.candidate_pairs(conn, mine.ids[mine.indexable].tolist(), bands, max_candidates)
    out.capped.update(capped)
    mine_ids = set(mine.ids.tolist())
    others = set(pairs[:, 1].tolist()) - mine_ids if pairs.size else set()
    rows = mine.concat(index.load_rows(conn, others, width, bands))
    left, right = _positions(rows.ids, pairs)
    out.candidate_pairs = left.size
    found, out.apart_by_codes = verified(params, rows, left, right, texts)
    out.pairs = len(found)
    if not found:
        return out
    # Each link goes from the later record (its owner) to the earlier one; an owner keeps its nearest.
    age = _age_ranks(rows)
    left, right = np.array([f[0] for f in found]), np.array([f[1] for f in found])
    sims = np.array([f[2] for f in found])
    later = np.where(age[left] > age[right], left, right)
    earlier = np.where(age[left] > age[right], right, left)
    order = np.lexsort((age[earlier], -sims, later))  # per owner: most similar first, then the oldest
    first = np.r_[0, np.flatnonzero(np.diff(later[order])) + 1]
    place = np.arange(order.size) - np.repeat(first, np.diff(np.r_[first, order.size]))
    kept = order[place < max_links]
    links = list(zip(rows.ids[earlier[kept]].tolist(), rows.ids[later[kept]].tolist(), sims[kept].tolist()))
    owners = sorted_unique(rows.ids[later]).tolist()
    index.lock_rows(conn, owners)
    out.links_added = index.add_links(conn, links, params.method, batch_id)
    out.links_added -= index.prune_links(conn, owners, max_links)
    ends = sorted_unique(np.concatenate((rows.ids[left], rows.ids[right])))
    out.linked = set(ends[np.isin(ends, mine.ids)].tolist())
    edges = list(zip(rows.ids[left].tolist(), rows.ids[right].tolist()))
    out.clusters = merge_clusters(conn, edges, rows, params.representative, texts)
    return out


def _best(rule: str, candidates: list[int], ages: Mapping[int, tuple], lengths: Mapping[int, int] | None) -> int:
    if rule == "longest":
        return min(candidates, key=lambda rid: (-lengths.get(rid, 0), ages[rid], rid))
    return min(candidates, key=lambda rid: (ages[rid], rid))


def _ages_and_lengths(
    conn: Connection, ids: set[int], rows: index.IndexRows, rule: str, texts: Texts, bands: int
) -> tuple[dict[int, tuple], dict[int, int] | None]:
    held = np.isin(rows.ids, np.fromiter(ids, np.int64, len(ids)))
    ages = {rid: tuple(order) for rid, order in zip(rows.ids[held].tolist(), rows.order[held].tolist())}
    missing = ids - set(ages)
    if missing:
        extra = index.load_rows(conn, missing, rows.signatures.shape[1], bands)
        ages.update({int(rid): tuple(order) for rid, order in zip(extra.ids.tolist(), extra.order.tolist())})
    ages.update({rid: (1 << 62, 1 << 62, rid) for rid in ids - set(ages)})  # not indexed: never the oldest
    lengths = {rid: len(text) for rid, text in texts(sorted(ids)).items()} if rule == "longest" else None
    return ages, lengths


def merge_clusters(
    conn: Connection, edges: list[tuple[int, int]], rows: index.IndexRows, rule: str, texts: Texts
) -> dict[int, int]:
    """Join the clusters of both ends of every edge (verified pairs); returns cluster id -> size for those touched."""
    nodes = {x for edge in edges for x in edge}
    current = index.locked_roots(conn, nodes)
    roots = {x: current[x][0] if x in current else x for x in nodes}
    parent: dict[int, int] = {}

    def find(x: int) -> int:
        while parent.get(x, x) != x:
            parent[x] = parent.get(parent[x], parent[x])
            x = parent[x]
        return x

    for a, b in edges:
        ra, rb = find(roots[a]), find(roots[b])
        if ra != rb:
            parent[max(ra, rb)] = min(ra, rb)
    existing = {cid for cid, _ in current.values()}
    components: dict[int, set[int]] = {}
    for root in set(roots.values()):
        components.setdefault(find(root), set()).add(root)
    reps = index.cluster_representatives(conn, existing)
    moves, members, candidates = {}, {}, {}
    for new, group in components.items():
        for root in group & existing:
            if root != new:
                moves[root] = new
            candidates.setdefault(new, []).append(reps[root])
    for x in nodes - set(current):  # records in no cluster yet join their component's
        new = find(x)
        members[x] = new
        candidates.setdefault(new, []).append(x)
    everyone = {rid for group in candidates.values() for rid in group}
    ages, lengths = _ages_and_lengths(conn, everyone, rows, rule, texts, rows.keys.shape[1])
    chosen = {new: _best(rule, group, ages, lengths) for new, group in candidates.items()}
    index.relabel_clusters(conn, moves)
    index.add_members(conn, members)
    index.set_representatives(conn, chosen)
    return index.cluster_sizes(conn, components)


@dataclass
class Removal:
    """What taking records out of the index did: rows removed per table, how many clusters the records were in,
    and the links the records that linked to them stored when they linked again (net of those they gave up)."""

    removed: dict[str, int]
    clusters: int = 0
    links_added: int = 0


def remove_records(
    conn: Connection,
    ids,
    params: NearDupParams,
    texts: Texts,
    max_links: int,
    max_candidates: int | None,
    keep_rows: bool = False,
) -> Removal:
    """Take records out of the index's links and clusters (and, unless `keep_rows`, out of the index).

    The clusters they were in are recomputed over the members that stay, from
    those members' own signatures (a cluster may split, or get another
    representative), and the records that linked to them find their nearest
    others again. Erasure, the rehash retire step and the near rung (a record
    whose text changed, `keep_rows`) go through this.
    """
    ids = sorted(set(ids))
    if not ids:
        return Removal({"near_duplicate_links": 0, "near_duplicate_clusters": 0, "near_index": 0})
    bands, width = band_count(params), signature_width(params)
    index.plan_for_cached_tables(conn)
    removed_links, lost_owners = index.detach_links(conn, ids)
    current = index.locked_roots(conn, ids)
    clusters = {cid for cid, _ in current.values()}
    survivors = {rid for group in index.cluster_members(conn, clusters).values() for rid in group} - set(ids)
    counts = {"near_duplicate_links": removed_links, "near_duplicate_clusters": len(current), "near_index": 0}
    if keep_rows:
        index.replace_clusters(conn, ids, {})
    else:
        counts["near_index"] = index.remove_rows(conn, ids)["near_index"]
    if survivors:
        recluster(conn, survivors, params, texts)
    removal = Removal(counts, len(clusters))
    stay = sorted(lost_owners - set(ids))
    if stay:
        rows = index.load_rows(conn, stay, width, bands)
        removal.links_added = link_records(conn, rows, params, texts, "relink", max_links, max_candidates).links_added
    return removal


def remove_from_index(conn: Connection, ids, representative: str | None = None) -> Removal:
    """:func:`remove_records` with the settings the rung last linked with and the stored texts (erasure, retire)."""
    params, max_links, max_candidates = index.link_settings(conn, representative)
    return remove_records(conn, ids, params, stored_texts(conn), max_links, max_candidates)


def recluster(conn: Connection, members: set[int], params: NearDupParams, texts: Texts) -> None:
    """Recompute the clusters of `members` (whole clusters, their removed records gone) from their signatures."""
    bands, width = band_count(params), signature_width(params)
    rows = index.load_rows(conn, members, width, bands)
    usable = np.flatnonzero(rows.indexable)
    pairs = usable[pairs_in_memory(rows.keys[usable])] if usable.size > 1 else np.zeros((0, 2), np.int64)
    found, _ = verified(params, rows, pairs[:, 0], pairs[:, 1], texts)
    links = [(int(rows.ids[i]), int(rows.ids[j])) for i, j, _ in found]
    ids = sorted(members)
    ages = {rid: tuple(order) for rid, order in zip(rows.ids.tolist(), rows.order.tolist())}
    ages.update({rid: (1 << 62, 1 << 62, rid) for rid in members - set(ages)})
    lengths = {rid: len(text) for rid, text in texts(ids).items()} if params.representative == "longest" else None
    clusters = [c for c in cluster_records(ids, links, params.representative, lengths, ages) if len(c.members) > 1]
    index.replace_clusters(
        conn, ids, {rid: (c.cluster_id, rid == c.representative) for c in clusters for rid in c.members}
    )
