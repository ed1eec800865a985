"""What the rung tests share: a batch run down the whole ladder, and a row count."""

from __future__ import annotations

from sqlalchemy import func, select

from dedup_pipeline.core.near import NearDupParams
from dedup_pipeline.ladder.canonical import canonicalise_batch
from dedup_pipeline.ladder.exact import deduplicate_batch
from dedup_pipeline.ladder.near import cluster_batch
from dedup_pipeline.ladder.raw import ingest_raw_batch
from dedup_pipeline.ladder.settings import LadderSettings, NearSettings
from dedup_pipeline.landing import find_batch
from dedup_pipeline_tests.helpers import new_run_id

DAY = 86400.0
#: The rungs' settings unless a test says otherwise: small chunks, so a batch of a few dozen lines spans several.
SETTINGS = LadderSettings(chunk_size=7)


def run_batch(warehouse, folder, key, settings=SETTINGS):
    raw = ingest_raw_batch(warehouse, find_batch(folder, key), settings.max_line_bytes)
    canonical = canonicalise_batch(warehouse, key, settings)
    exact = deduplicate_batch(warehouse, key, new_run_id(key), settings)
    near = cluster_batch(warehouse, key, NearSettings(params=NearDupParams(threshold=0.5)))
    return raw, canonical, exact, near


def count(warehouse, table):
    with warehouse.engine.connect() as conn:
        return conn.execute(select(func.count()).select_from(table)).scalar_one()
