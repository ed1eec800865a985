"""What the quality tests share: batches run down the rungs, and a sliding crawl with a known collapse rate."""

from __future__ import annotations

from dedup_pipeline.core.near import NearDupParams
from dedup_pipeline.ladder.canonical import canonicalise_batch
from dedup_pipeline.ladder.exact import deduplicate_batch
from dedup_pipeline.ladder.near import cluster_batch
from dedup_pipeline.ladder.raw import ingest_raw_batch
from dedup_pipeline.ladder.settings import LadderSettings, NearSettings
from dedup_pipeline.landing import find_batch
from dedup_pipeline_tests.helpers import listing, new_run_id, write_batch

DAY = 86400.0


SETTINGS = LadderSettings(chunk_size=50)


def run_rungs(warehouse, folder, key, run_id=None, near=True):
    raw = ingest_raw_batch(warehouse, find_batch(folder, key))
    canonical = canonicalise_batch(warehouse, key, SETTINGS)
    exact = deduplicate_batch(warehouse, key, run_id or new_run_id(key), SETTINGS)
    clusters = cluster_batch(warehouse, key, NearSettings(params=NearDupParams(threshold=0.5))) if near else None
    return raw, canonical, exact, clusters


def sliding_batches(folder, count, leak_in=None, per_batch=120, step=80):
    """Batch k holds listings [80k, 80k+120): 40 of them seen in batch k-1 (collapse rate 1/3)."""
    keys = []
    for k in range(count):
        extra = (lambda n, k=k: {"view_count": 1000 * k + n}) if k == leak_in else (lambda n: {})
        lines = [listing(n, **extra(n)) for n in range(step * k, step * k + per_batch)]
        keys.append(f"2026-11-{k + 1:02d}")
        write_batch(folder, keys[-1], lines, landed=1_700_000_000 + k * DAY)
    return keys
