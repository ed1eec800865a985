"""Rung 4: near-duplicate clusters over the survivors of the exact rung, incremental and persistent.

Each chunk of the batch's new or changed records is sketched (MinHash or
SimHash) outside any transaction. Then, in one transaction per chunk, under
a lock that serialises this short database part between workers: the
sketches and LSH buckets are stored, candidates from every earlier batch are
found by a bucket join, verified, linked, and the touched clusters are
recomputed. A crash leaves either the whole chunk or nothing, and a re-run
picks up exactly the records whose sketch is missing or stale.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from dedup_pipeline.core.clustering import cluster_records
from dedup_pipeline.core.minhash import empty_mask, minhash_signatures, signature_from_bytes, signature_to_bytes
from dedup_pipeline.core.lsh import band_keys
from dedup_pipeline.core.neardup import NearDupParams
from dedup_pipeline.core.records import TEXT_FIELDS
from dedup_pipeline.core.simhash import block_bounds, hamming_distance, simhash_fingerprints
from dedup_pipeline.store import neardup as index
from dedup_pipeline.store.warehouse import Warehouse


def near_text(payload: dict) -> str:
    """The text compared for near duplicates: title and description."""
    return " ".join(str(payload[f]) for f in TEXT_FIELDS if payload.get(f))


@dataclass
class Sketches:
    """Per record: the stored sketch bytes, LSH bucket keys (one per band) and whether it can be indexed."""

    blobs: list[bytes]
    buckets: np.ndarray
    indexable: np.ndarray


def sketch(texts: Sequence[str], params: NearDupParams) -> Sketches:
    """MinHash signatures and their band keys, or SimHash fingerprints and their pigeonhole blocks."""
    shingles = [params.normaliser.shingle_bytes(t) for t in texts]
    if params.method == "simhash":
        fingerprints = simhash_fingerprints(shingles)
        blocks = [
            ((fingerprints >> np.uint64(low)) & np.uint64((1 << width) - 1)).astype(np.int64)
            for low, width in block_bounds(params.simhash_max_distance)
        ]
        buckets = np.stack(blocks, axis=1) if texts else np.empty((0, len(blocks)), dtype=np.int64)
        blobs = [int(fp).to_bytes(8, "little") for fp in fingerprints]
        return Sketches(blobs, buckets, np.array([len(s) > 0 for s in shingles], dtype=bool))
    signatures = minhash_signatures(shingles, params.num_perm, params.seed)
    return Sketches(
        [signature_to_bytes(sig) for sig in signatures],
        band_keys(signatures, params.bands, params.rows),
        ~empty_mask(signatures),
    )


def verified_similarity(blob_a: bytes, blob_b: bytes, params: NearDupParams) -> float | None:
    """The similarity of two stored sketches if they are near duplicates, else None.

    MinHash: estimated Jaccard, at least the threshold. SimHash: 1 - Hamming/64,
    with at most `simhash_max_distance` differing bits.
    """
    if params.method == "simhash":
        distance = hamming_distance(int.from_bytes(blob_a, "little"), int.from_bytes(blob_b, "little"))
        return 1.0 - distance / 64 if distance <= params.simhash_max_distance else None
    a, b = signature_from_bytes(blob_a), signature_from_bytes(blob_b)
    score = float(np.count_nonzero(a == b)) / a.size
    return score if score >= params.threshold else None


@dataclass
class NearReport:
    batch_id: str
    method: str
    sketched: int = 0
    candidate_pairs: int = 0
    pairs: int = 0
    near_duplicates: set = field(default_factory=set)
    clusters: dict = field(default_factory=dict)  # cluster id -> size, for clusters this batch touched

    def as_metadata(self) -> dict:
        sizes = Counter(self.clusters.values())
        largest = sorted(self.clusters.items(), key=lambda item: (-item[1], item[0]))[:10]
        table = "\n".join(["| cluster id | records |", "|---:|---:|"] + [f"| {c} | {n} |" for c, n in largest])
        return {
            "batch_id": self.batch_id, "method": self.method, "sketched": self.sketched,
            "candidate_pairs": self.candidate_pairs, "pairs": self.pairs,
            "near_duplicates": len(self.near_duplicates), "clusters_touched": len(self.clusters),
            "largest_cluster": max(self.clusters.values(), default=0),
            "cluster_sizes": {str(size): count for size, count in sorted(sizes.items())},
            "largest_clusters": _markdown(table) if largest else "no clusters",
        }


def _markdown(text: str):
    import dagster as dg  # only the Dagster layer renders markdown; keep core imports light

    return dg.MetadataValue.md(text)


def cluster_batch(warehouse: Warehouse, batch_id: str, params: NearDupParams, chunk_size: int = 2000) -> NearReport:
    """Sketch, index, link and cluster the batch's new and changed records."""
    report = NearReport(batch_id, params.method)
    identity = params.identity()
    with warehouse.engine.begin() as conn:
        index.claim_index(conn, identity)
    after = 0
    while True:
        with warehouse.engine.connect() as conn:
            rows = index.records_to_index(conn, batch_id, after, chunk_size)
        if not rows:
            return report
        after = rows[-1].record_id
        sketches = sketch([near_text(row.payload) for row in rows], params)
        with warehouse.engine.begin() as conn:
            index.lock_clusters(conn)
            index.replace_sketches(conn, identity, rows, sketches.blobs, sketches.buckets, sketches.indexable)
            _link_and_cluster(conn, [row.record_id for row in rows], params, batch_id, report)
        report.sketched += len(rows)


def _link_and_cluster(conn, ids: list[int], params: NearDupParams, batch_id: str, report: NearReport) -> None:
    rule = params.representative
    pairs = index.candidate_partners(conn, ids)
    report.candidate_pairs += len(pairs)
    blobs = index.load_sketches(conn, [x for pair in pairs for x in pair])
    links = {}
    for a, b in pairs:
        score = verified_similarity(blobs[a], blobs[b], params)
        if score is not None:
            links[(min(a, b), max(a, b))] = score
    link_rows = [(a, b, s) for (a, b), s in sorted(links.items())]
    index.add_links(conn, link_rows, params.method, batch_id)
    report.pairs += len(link_rows)
    mine = set(ids)
    report.near_duplicates |= {x for a, b, _ in link_rows for x in (a, b) if x in mine}

    members = index.component_members(conn, mine | {x for pair in links for x in pair})
    all_links = index.links_among(conn, members)
    members |= {x for a, b, _ in all_links for x in (a, b)}
    lengths = index.text_lengths(conn, members) if rule == "longest" else None
    clusters = [c for c in cluster_records(sorted(members), all_links, rule, lengths) if len(c.members) > 1]
    assignment = {rid: (c.cluster_id, rid == c.representative) for c in clusters for rid in c.members}
    index.replace_clusters(conn, members, assignment)
    report.clusters.update({c.cluster_id: len(c.members) for c in clusters if mine & set(c.members)})
