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

import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from dedup_pipeline.core.lsh import band_keys
from dedup_pipeline.core.minhash import (
    empty_mask,
    minhash_signatures_from_texts,
    signature_from_bytes,
    signature_to_bytes,
)
from dedup_pipeline.core.near import NearDupParams, verify_pairs
from dedup_pipeline.core.records import TEXT_FIELDS
from dedup_pipeline.core.simhash import block_bounds, hamming_distance, simhash_fingerprints
from dedup_pipeline.ladder.settings import NearSettings
from dedup_pipeline.store import near as index
from dedup_pipeline.store.schema import near_rung_runs
from dedup_pipeline.store.warehouse import Warehouse, analyze_grown, record_rung_run


def near_text(payload: dict) -> str:
    """The text compared for near duplicates: title and description."""
    return " ".join(str(payload[f]) for f in TEXT_FIELDS if payload.get(f))


@dataclass
class Sketches:
    """Per record: the stored sketch bytes, LSH bucket keys (one per band) and whether it can be indexed."""

    blobs: list[bytes]
    buckets: np.ndarray
    indexable: np.ndarray

    def subset(self, positions: Sequence[int]) -> Sketches:
        """The sketches of the records at `positions`, in that order."""
        return Sketches([self.blobs[i] for i in positions], self.buckets[positions], self.indexable[positions])


def sketch(texts: Sequence[str], params: NearDupParams) -> Sketches:
    """MinHash signatures and their band keys, or SimHash fingerprints and their pigeonhole blocks."""
    if params.method == "simhash":
        shingles = [params.normaliser.shingle_bytes(t) for t in texts]
        fingerprints = simhash_fingerprints(shingles)
        blocks = [
            ((fingerprints >> np.uint64(low)) & np.uint64((1 << width) - 1)).astype(np.int64)
            for low, width in block_bounds(params.simhash_max_distance)
        ]
        buckets = np.stack(blocks, axis=1) if texts else np.empty((0, len(blocks)), dtype=np.int64)
        blobs = [int(fp).to_bytes(8, "little") for fp in fingerprints]
        return Sketches(blobs, buckets, np.array([len(s) > 0 for s in shingles], dtype=bool))
    signatures = minhash_signatures_from_texts(texts, params.normaliser, params.num_perm, params.seed)
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
    verify: str = "auto"
    max_bucket_size: int | None = None
    sketched: int = 0
    candidate_pairs: int = 0
    pairs: int = 0
    capped_buckets: set = field(default_factory=set)  # (band, bucket) keys whose candidates were capped
    near_duplicates: set = field(default_factory=set)
    clusters: dict = field(default_factory=dict)  # cluster id -> size, for clusters this batch touched

    def as_metadata(self) -> dict:
        """Figures for the asset (ids and counts only). The largest clusters table comes from `defs.plots`."""
        sizes = Counter(self.clusters.values())
        return {
            "batch_id": self.batch_id,
            "method": self.method,
            "verify": self.verify,
            "sketched": self.sketched,
            "candidate_pairs": self.candidate_pairs,
            "pairs": self.pairs,
            "near_duplicates": len(self.near_duplicates),
            "clusters_touched": len(self.clusters),
            "largest_cluster": max(self.clusters.values(), default=0),
            "cluster_sizes": {str(size): count for size, count in sorted(sizes.items())},
            "max_bucket_size": self.max_bucket_size if self.max_bucket_size is not None else "none",
            "capped_buckets": len(self.capped_buckets),
            "capped_bucket_keys": [
                f"{band}:{bucket}" for band, bucket in sorted(self.capped_buckets)[:CAPPED_KEYS_SHOWN]
            ],
        }


#: Capped bucket keys listed in the metadata (the count is always complete).
CAPPED_KEYS_SHOWN = 20


def cluster_batch(warehouse: Warehouse, batch_id: str, settings: NearSettings, run_id: str | None = None) -> NearReport:
    """Sketch, index, link and cluster the batch's new and changed records.

    ``settings.max_bucket_size`` caps the partners a record meets per LSH
    bucket (see `store.near.candidate_partners`; None: no cap); the capped
    buckets are counted in the report. The run's figures are kept in
    `near_rung_runs` under ``run_id`` (the Dagster run; a fresh id when not
    given).
    """
    params, max_bucket_size = settings.params, settings.max_bucket_size
    report = NearReport(batch_id, params.method, params.verify, max_bucket_size)
    identity = params.identity()
    with warehouse.engine.begin() as conn:
        index.claim_index(conn, identity)
    after = 0
    while True:
        with warehouse.engine.connect() as conn:
            rows = index.records_to_index(conn, batch_id, after, settings.chunk_size)
        if not rows:
            break
        after = rows[-1].record_id
        sketches = sketch([near_text(row.payload) for row in rows], params)
        with warehouse.engine.begin() as conn:
            index.lock_clusters(conn)
            # The rows were read before the lock: one that another worker has changed (and indexed) since, or an
            # erasure removed, is left to them, never indexed by content it no longer holds.
            current = index.current_contents(conn, [row.record_id for row in rows])
            keep = [i for i, row in enumerate(rows) if current.get(row.record_id) == bytes(row.content_hash)]
            rows, sketches = [rows[i] for i in keep], sketches.subset(keep)
            index.plan_for_cached_tables(conn)
            index.replace_sketches(conn, identity, rows, sketches.blobs, sketches.buckets, sketches.indexable)
            _link_and_cluster(conn, [row.record_id for row in rows], params, batch_id, report, max_bucket_size)
        report.sketched += len(rows)
        with warehouse.engine.begin() as conn:
            analyze_grown(conn, {table: () for table in index.INDEX_TABLES})
    with warehouse.engine.begin() as conn:
        record_rung_run(conn, near_rung_runs, batch_id, run_id or f"local-{uuid.uuid4().hex}", report.as_metadata())
    return report


def verify_candidates(conn, pairs: Sequence[tuple[int, int]], params: NearDupParams) -> dict[tuple[int, int], float]:
    """The verified links (a < b) -> similarity among candidate pairs of record ids.

    MinHash goes through the library's :func:`verify_pairs`: estimated Jaccard
    of the stored signatures and, where ``verify`` asks for it, the Jaccard of
    the shingles, recomputed from the stored payloads of just the records of
    those pairs (one SELECT for the chunk).
    SimHash: Hamming distance of the stored fingerprints, as in the library.
    """
    ids = sorted({x for pair in pairs for x in pair})
    if not ids:
        return {}
    blobs = index.load_sketches(conn, ids)
    if params.method == "simhash":
        scores = ((a, b, verified_similarity(blobs[a], blobs[b], params)) for a, b in pairs)
        return {(min(a, b), max(a, b)): s for a, b, s in scores if s is not None}
    position = {rid: i for i, rid in enumerate(ids)}
    signatures = np.stack([signature_from_bytes(blobs[rid]) for rid in ids])

    def shingles(rows: np.ndarray) -> dict[int, list[bytes]]:  # only for the pairs that need the exact Jaccard
        payloads = index.load_payloads(conn, [ids[row] for row in rows.tolist()])
        return {row: params.normaliser.shingle_bytes(near_text(payloads[ids[row]])) for row in rows.tolist()}

    unique = sorted({(min(a, b), max(a, b)) for a, b in pairs})
    left = np.array([position[a] for a, _ in unique], dtype=np.int64)
    right = np.array([position[b] for _, b in unique], dtype=np.int64)
    return {(ids[i], ids[j]): s for i, j, s in verify_pairs(signatures, left, right, params, shingles)}


def _link_and_cluster(
    conn, ids: list[int], params: NearDupParams, batch_id: str, report: NearReport, max_bucket_size: int | None
) -> None:
    rule = params.representative
    pairs, capped = index.candidate_partners(conn, ids, max_bucket_size)
    report.candidate_pairs += len(pairs)
    report.capped_buckets.update(capped)
    links = verify_candidates(conn, pairs, params)
    link_rows = [(a, b, s) for (a, b), s in sorted(links.items())]
    index.add_links(conn, link_rows, params.method, batch_id)
    report.pairs += len(link_rows)
    mine = set(ids)
    report.near_duplicates |= {x for a, b, _ in link_rows for x in (a, b) if x in mine}

    clusters = index.recluster(conn, index.component_members(conn, mine | {x for pair in links for x in pair}), rule)
    report.clusters.update({c.cluster_id: len(c.members) for c in clusters if mine & set(c.members)})


_CLUSTERS_SHOWN = 10


@dataclass
class RunawayVerdict:
    """Whether any cluster swallowed more than `max_share` of a batch's records (ids and counts only)."""

    batch_records: int
    max_share: float
    min_records: int
    largest: list  # (cluster id, members from this batch, members in all), largest first

    @property
    def offenders(self) -> list:
        if self.batch_records < self.min_records:
            return []
        return [row for row in self.largest if row[1] / self.batch_records > self.max_share]

    @property
    def passed(self) -> bool:
        return not self.offenders

    def as_metadata(self) -> dict:
        share = self.largest[0][1] / self.batch_records if self.largest and self.batch_records else 0.0
        rows = "\n".join(
            [
                "| cluster id | records of this batch | share of batch | records in all batches |",
                "|---:|---:|---:|---:|",
            ]
            + [f"| {cid} | {n} | {n / self.batch_records:.1%} | {size} |" for cid, n, size in self.largest]
        )
        return {
            "batch_records": self.batch_records,
            "max_cluster_share": self.max_share,
            "min_records_for_check": self.min_records,
            "largest_share": share,
            "offending_clusters": [cid for cid, _, _ in self.offenders],
            "offending_sizes": [n for _, n, _ in self.offenders],
            "largest_clusters": rows if self.largest else "no clusters",
        }

    def description(self) -> str:
        if self.batch_records < self.min_records:
            return f"batch of {self.batch_records} records is under {self.min_records}: too small to judge"
        if self.offenders:
            worst = ", ".join(f"cluster {cid}: {n} records" for cid, n, _ in self.offenders)
            return (
                f"{len(self.offenders)} cluster(s) hold more than {self.max_share:.0%} of the batch's "
                f"{self.batch_records} records ({worst})"
            )
        return f"no cluster holds more than {self.max_share:.0%} of the batch's {self.batch_records} records"


def runaway_clusters(warehouse: Warehouse, batch_id: str, settings: NearSettings) -> RunawayVerdict:
    """Judge the batch's largest clusters against `settings.max_cluster_share` of its records (new or changed in
    the batch); batches under `settings.min_records_for_cluster_check` pass."""
    max_share, min_records = settings.max_cluster_share, settings.min_records_for_cluster_check
    shown = max(_CLUSTERS_SHOWN, int(1 / max_share) + 1)  # every offender fits in the list
    with warehouse.engine.connect() as conn:
        total, largest = index.batch_cluster_shares(conn, batch_id, shown)
    return RunawayVerdict(total, max_share, min_records, largest)
