"""Rung 4: near-duplicate clusters over the survivors of the exact rung, incremental and persistent.

Each chunk of the batch's new or changed records is sketched (MinHash or
SimHash) outside any transaction. A first transaction stores the chunk's
index rows and commits, so that every worker querying after it sees them; a
second finds the chunk's candidates in the whole index with one statement,
verifies them, links each record to its nearest earlier near duplicates and
merges the clusters they join (`store.near_graph`), locking only the rows
and clusters it changes. A crash between the two leaves rows marked not
linked, which a re-run picks up with the records whose sketch is missing or
stale. A record whose content changed but whose text did not (a new price)
keeps its sketch, links and cluster.
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np
from sqlalchemy.exc import OperationalError

from dedup_pipeline.core.lsh import band_keys, fold_to_int32
from dedup_pipeline.core.minhash import empty_mask, minhash_signatures_from_texts, pack_bbit
from dedup_pipeline.core.near import NearDupParams, near_text, sketch_config
from dedup_pipeline.core.simhash import BITS, block_bounds, simhash_fingerprints
from dedup_pipeline.ladder.progress import ChunkProgress, ProgressLog
from dedup_pipeline.ladder.settings import NearSettings
from dedup_pipeline.store import near as index
from dedup_pipeline.store import near_graph as graph
from dedup_pipeline.store.schema import REBUILD_RUN_PREFIX, near_rung_runs
from dedup_pipeline.store.tombstones import lock_for_ingestion
from dedup_pipeline.store.warehouse import Warehouse, analyze_grown, record_rung_run


@dataclass
class Sketches:
    """Per record: the compact signature stored, its band keys (int32, one per band) and whether it can be indexed."""

    signatures: np.ndarray  # (n, width) uint8
    keys: np.ndarray  # (n, bands) int32
    indexable: np.ndarray  # bool


def sketch(texts: Sequence[str], params: NearDupParams) -> Sketches:
    """b-bit MinHash signatures and their band keys, or SimHash fingerprints and their pigeonhole blocks."""
    if params.method == "simhash":
        shingles = [params.normaliser.shingle_bytes(t) for t in texts]
        fingerprints = simhash_fingerprints(shingles)
        blocks = [
            ((fingerprints >> np.uint64(low)) & np.uint64((1 << width) - 1)).astype(np.int64)
            for low, width in block_bounds(params.simhash_max_distance)
        ]
        keys = np.stack(blocks, axis=1) if texts else np.empty((0, len(blocks)), dtype=np.int64)
        return Sketches(
            fingerprints.astype("<u8").view(np.uint8).reshape(len(texts), 8),
            fold_to_int32(keys),
            np.array([len(s) > 0 for s in shingles], dtype=bool),
        )
    signatures = minhash_signatures_from_texts(texts, params.normaliser, params.num_perm, params.seed)
    return Sketches(
        pack_bbit(signatures), fold_to_int32(band_keys(signatures, params.bands, params.rows)), ~empty_mask(signatures)
    )


@dataclass
class NearReport:
    batch_id: str
    params: NearDupParams  # the settings the batch was linked with (the index's sketch settings adopted)
    max_candidates: int | None = None
    sketched: int = 0
    kept_sketches: int = 0  # records with new content and the same text: their sketch, links and cluster stay
    already_indexed: int = 0  # a batch run again: its records were indexed and linked by an earlier run
    candidate_pairs: int = 0
    pairs: int = 0
    apart_by_codes: int = 0  # pairs similar enough, kept apart by `require_shared_code`
    capped: set = field(default_factory=set)  # records of the batch that met `max_candidates` others (boilerplate?)
    near_duplicates: set = field(default_factory=set)
    clusters: dict = field(default_factory=dict)  # cluster id -> size, for clusters this batch touched
    chunk_retries: int = 0

    @property
    def method(self) -> str:
        return self.params.method

    @property
    def bands_rows(self) -> tuple[int, int]:
        return self.params.bands, self.params.rows

    @cached_property
    def threshold_warning(self) -> str | None:
        """The threshold is too far below the one the bands were built for (`NearDupParams.threshold_warning`)."""
        return self.params.threshold_warning()

    def as_metadata(self) -> dict:
        """Figures for the asset (ids and counts only). The largest clusters table comes from `defs.plots`."""
        sizes = Counter(self.clusters.values())
        params = self.params
        if params.method == "minhash":
            settings = {
                "verify": params.verify,
                "threshold": params.threshold,
                "bands_rows": "x".join(map(str, self.bands_rows)),
            }
        else:  # SimHash links by Hamming distance alone: no threshold, banding or verification mode applies
            distance = params.simhash_max_distance
            settings = {"simhash_max_distance": distance, "similarity_floor": round(1 - distance / BITS, 4)}
        return {
            "batch_id": self.batch_id,
            "method": self.method,
            **settings,
            "sketched": self.sketched,
            "kept_sketches": self.kept_sketches,
            "already_indexed": self.already_indexed,
            "candidate_pairs": self.candidate_pairs,
            "pairs": self.pairs,
            "require_shared_code": params.require_shared_code,
            "pairs_apart_by_codes": self.apart_by_codes,
            "near_duplicates": len(self.near_duplicates),
            "clusters_touched": len(self.clusters),
            "largest_cluster": max(self.clusters.values(), default=0),
            "cluster_sizes": {str(size): count for size, count in sorted(sizes.items())},
            "max_candidates": self.max_candidates if self.max_candidates is not None else "none",
            "capped_records": len(self.capped),
            "capped_record_ids": sorted(self.capped)[:CAPPED_SHOWN],
            "chunk_retries": self.chunk_retries,
            **({"threshold_warning": self.threshold_warning} if self.threshold_warning else {}),
        }


#: Capped record ids listed in the metadata (the count is always complete).
CAPPED_SHOWN = 20
#: A chunk's linking transaction that lost a lock cycle to another worker's (PostgreSQL detects it) runs again.
CHUNK_ATTEMPTS = 5


def _order(row) -> tuple[int, int, int]:
    return index.order_of(row.first_landed_at, row.first_seen_at, row.natural_key)


def cluster_batch(
    warehouse: Warehouse,
    batch_id: str,
    settings: NearSettings,
    run_id: str | None = None,
    progress: ProgressLog | None = None,
) -> NearReport:
    """Sketch, index, link and cluster the batch's new and changed records.

    ``settings.max_candidates`` caps the candidates a record meets (None: no
    cap); the records capped are counted in the report. ``settings.max_links``
    bounds the links a record keeps. The run's figures are kept in
    `near_rung_runs` under ``run_id`` (the Dagster run; a fresh id when not
    given). `progress`, if given, hears how far it got as it goes (records and rate: how many records
    the batch brings to the index is only known once they are read).
    """
    params, max_candidates, max_links = settings.params, settings.max_candidates, settings.max_links
    done = ChunkProgress("near", None, progress)
    with warehouse.engine.begin() as conn:
        params = index.adopt_index_settings(conn, params, settings.from_index)
        index.claim_index(conn, params.identity(), graph.band_count(params), sketch_config(params))
        index.save_link_settings(conn, params, max_links, max_candidates)
    report = NearReport(batch_id, params, max_candidates)
    bands = graph.band_count(params)
    after = 0
    while True:
        with warehouse.engine.connect() as conn:
            rows = index.records_to_index(conn, batch_id, after, settings.chunk_size, bands)
        if not rows:
            break
        after = rows[-1].record_id
        texts = {row.record_id: near_text(row.payload) for row in rows}
        sketches = sketch([texts[row.record_id] for row in rows], params)
        _index_chunk(warehouse, rows, sketches, texts, params, batch_id, report, max_links, max_candidates)
        with warehouse.engine.begin() as conn:
            analyze_grown(conn, {table: () for table in index.INDEX_TABLES}, index.STATISTICS_TARGET)
        done.advance(len(rows))
    done.finish()
    if after == 0:  # nothing to index: say whether the batch's records are in the index already (a run again)
        with warehouse.engine.connect() as conn:
            report.already_indexed = index.indexed_in_batch(conn, batch_id)
    with warehouse.engine.begin() as conn:
        report.clusters = index.cluster_sizes(conn, report.clusters)  # a cluster merged into another since is gone
        record_rung_run(conn, near_rung_runs, batch_id, run_id or f"local-{uuid.uuid4().hex}", report.as_metadata())
    return report


def rebuild_index(warehouse: Warehouse, settings: NearSettings) -> list[NearReport]:
    """Drop the near-duplicate index (an earlier layout's tables too), its links and clusters, and build it again
    with `settings`: every stored record sketched, linked and clustered, batch by batch in landing order.

    The records and every other table are left as they are; the batches' figures in `near_rung_runs` gain a
    `rebuild-...` run each.
    """
    with warehouse.engine.begin() as conn:
        index.drop_index(conn)
    with warehouse.engine.connect() as conn:
        batches = index.batches_in_landing_order(conn)
    run_id = f"{REBUILD_RUN_PREFIX}{uuid.uuid4().hex}"
    return [cluster_batch(warehouse, batch, settings, run_id) for batch in batches]


def lean_minhashes(warehouse: Warehouse, batch_id: str | None = None, chunk_size: int = 2000):
    """(record id, natural key, ``datasketch.LeanMinHash``) for every stored record (or those dated to `batch_id`).

    The index keeps compact b-bit signatures; the full 32-bit sketches datasketch takes are made again from the
    stored records under the settings the rung last linked with, so each equals the sketch the rung computed
    (:func:`dedup_pipeline.core.near.to_lean_minhashes`). Memory is bounded by `chunk_size`. A warehouse whose
    index is SimHash fingerprints has no MinHash sketch to give: ValueError, at the call.
    """
    with warehouse.engine.connect() as conn:
        params = index.link_settings(conn)[0]
    if params.method != "minhash":
        raise ValueError(f"the warehouse's near-duplicate index is {params.method}, not MinHash: no sketch to export")
    return _lean_minhashes(warehouse, params, batch_id, chunk_size)


def _lean_minhashes(warehouse: Warehouse, params: NearDupParams, batch_id: str | None, chunk_size: int):
    from dedup_pipeline.core.near import to_lean_minhashes

    after = 0
    while True:
        with warehouse.engine.connect() as conn:
            rows = index.records_after(conn, after, chunk_size, batch_id)
        if not rows:
            return
        after = rows[-1][0]
        sketches = to_lean_minhashes([near_text(payload) for _, _, payload in rows], params)
        yield from ((rid, key, sketch) for (rid, key, _), sketch in zip(rows, sketches))


def _index_chunk(warehouse, rows, sketches: Sketches, texts, params, batch_id, report, max_links, max_candidates):
    bands = sketches.keys.shape[1]
    with warehouse.engine.begin() as conn:
        lock_for_ingestion(conn)
        # The rows were read outside this transaction: one that another worker has changed (and indexed) since, or
        # an erasure removed, is left to them, never indexed by content it no longer holds.
        current = index.current_contents(conn, [row.record_id for row in rows])
        fresh = [p for p, row in enumerate(rows) if current.get(row.record_id) == bytes(row.content_hash)]
        orders = {p: _order(rows[p]) for p in fresh}
        same_text, to_link, changed_text = {}, [], []
        for p in fresh:
            row = rows[p]
            if row.indexed_hash is not None and _redated(row, orders[p]):
                changed_text.append(row.record_id)  # landed earlier than indexed: linked again, by its true age
            elif row.indexed_hash is not None and _same_sketch(row, sketches, p, bands):
                same_text[row.record_id] = bytes(row.content_hash)
                if row.linked:
                    continue
            elif row.indexed_hash is not None:
                changed_text.append(row.record_id)
            to_link.append(p)
        index.update_digests(conn, same_text)
        mine = index.IndexRows(
            ids=np.array([rows[p].record_id for p in to_link], dtype=np.int64),
            signatures=sketches.signatures[to_link],
            order=np.array([orders[p] for p in to_link], dtype=np.int64).reshape(-1, 3),
            keys=sketches.keys[to_link],
            indexable=sketches.indexable[to_link],
        )
        unwritten = [i for i, p in enumerate(to_link) if rows[p].record_id not in same_text]
        index.write_rows(conn, mine.subset(unwritten), [bytes(rows[to_link[i]].content_hash) for i in unwritten])
    relinked = set(mine.ids.tolist())
    report.kept_sketches += len([rid for rid in same_text if rid not in relinked])
    report.sketched += len(to_link)
    if not to_link:
        return

    def chunk_texts(ids: list[int]) -> dict[int, str]:
        known = {rid: texts[rid] for rid in ids if rid in texts}
        missing = [rid for rid in ids if rid not in known]
        if missing:
            with warehouse.engine.connect() as other:
                known.update(index.load_texts(other, missing))
        return known

    for attempt in range(CHUNK_ATTEMPTS):
        try:
            with warehouse.engine.begin() as conn:
                lock_for_ingestion(conn)
                index.plan_for_cached_tables(conn)
                if changed_text:
                    graph.remove_records(
                        conn, changed_text, params, chunk_texts, max_links, max_candidates, keep_rows=True
                    )
                outcome = graph.link_records(conn, mine, params, chunk_texts, batch_id, max_links, max_candidates)
                index.mark_linked(conn, mine.ids.tolist())
            break
        except OperationalError as exc:  # a deadlock between two workers' lock orders: PostgreSQL ended one
            if getattr(exc.orig, "sqlstate", None) != "40P01" or attempt == CHUNK_ATTEMPTS - 1:
                raise
            report.chunk_retries += 1
    report.candidate_pairs += outcome.candidate_pairs
    report.pairs += outcome.pairs
    report.apart_by_codes += outcome.apart_by_codes
    report.capped.update(outcome.capped)
    report.near_duplicates |= outcome.linked
    report.clusters.update(outcome.clusters)


def _redated(row, order: tuple[int, int, int]) -> bool:
    """Is the record's index row dated otherwise than it landed (`order`: a batch that ran late brought it first)?"""
    return (row.indexed_landed_us, row.indexed_seen_us, row.indexed_key_order) != order


def _same_sketch(row, sketches: Sketches, p: int, bands: int) -> bool:
    """Does the stored index row hold the sketch just made (the text did not change)?"""
    if row.indexed_signature is None or bytes(row.indexed_signature) != sketches.signatures[p].tobytes():
        return False
    stored = [getattr(row, f"ib{b}") for b in range(bands)]
    if not sketches.indexable[p]:
        return all(value is None for value in stored)
    return stored == sketches.keys[p].astype(np.int64).tolist()


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
