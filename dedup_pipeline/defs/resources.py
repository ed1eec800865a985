"""Resources: where the warehouse and the landing folder are, how the ladder behaves, how strict the checks are."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Optional

import dagster as dg
from pydantic import Field

from dedup_pipeline.core.hashing import HASH_RULES
from dedup_pipeline.core.near import DEFAULT_THRESHOLD, NearDupParams, make_params
from dedup_pipeline.core.exact import DuplicatePolicy
from dedup_pipeline.landing import DEFAULT_SETTLE_SECONDS, landing_dir
from dedup_pipeline.ladder.near import (
    DEFAULT_MAX_BUCKET_SIZE, DEFAULT_MAX_CLUSTER_SHARE, DEFAULT_MIN_RECORDS_FOR_CLUSTER_CHECK,
)
from dedup_pipeline.ladder.settings import LadderSettings
from dedup_pipeline.quality.collapse import CollapseRules
from dedup_pipeline.store.seen_set import SeenSet, seen_set_from_env
from dedup_pipeline.store.warehouse import Warehouse, default_database_url


@lru_cache(maxsize=8)
def _warehouse(url: str) -> Warehouse:
    # One engine (connection pool) per process and URL; the schema is created once.
    return Warehouse(url).create_schema()


class WarehouseResource(dg.ConfigurableResource):
    """The warehouse database. Unset means $DEDUP_DATABASE_URL, else a local SQLite file."""

    database_url: Optional[str] = Field(
        default=None,
        description="SQLAlchemy URL, e.g. postgresql+psycopg://user@host:5432/db. "
        "Leave empty to use $DEDUP_DATABASE_URL or the embedded SQLite warehouse.",
    )

    def get(self) -> Warehouse:
        return _warehouse(self.database_url or default_database_url())


class LandingResource(dg.ConfigurableResource):
    """The landing folder crawlers drop batch files into."""

    folder: Optional[str] = Field(default=None, description="Folder path; empty means $DEDUP_LANDING_DIR or .dedup/landing.")
    settle_seconds: float = Field(
        default=DEFAULT_SETTLE_SECONDS, description="A file modified more recently than this is still being written and is left alone."
    )

    def path(self) -> Path:
        return Path(self.folder).resolve() if self.folder else landing_dir()


class LadderResource(dg.ConfigurableResource):
    """How records move down the ladder (see the README, 'Duplicate classes')."""

    chunk_size: int = Field(default=2000, description="Records per transaction and per set-based statement.")
    natural_key: list[str] = Field(default=["canonical_url"], description="Fields that identify the same thing.")
    hash_versions: list[str] = Field(default=list(HASH_RULES), description="Hash versions computed per record.")
    on_changed: str = Field(default="upsert", description="'upsert' (keep old content in history) or 'keep_first'.")
    keep_history: bool = Field(default=True, description="Keep superseded content in record_history.")
    min_collapse_rate: float = Field(default=0.01, description="Collapse-rate check fails below this.")
    max_collapse_rate: float = Field(default=0.95, description="Collapse-rate check fails above this.")
    min_records_for_check: int = Field(default=100, description="Smaller batches pass the collapse-rate check.")
    canonical_workers: int = Field(
        default=0,
        description="Processes that canonicalise a batch of 20,000 lines or more: 0 is one per CPU, 1 keeps it in the step's process.",
    )

    def settings(self) -> LadderSettings:
        return LadderSettings(
            chunk_size=self.chunk_size,
            natural_key=tuple(self.natural_key),
            hash_versions=tuple(self.hash_versions),
            policy=DuplicatePolicy(on_changed=self.on_changed, keep_history=self.keep_history),
            canonical_workers=self.canonical_workers,
        )


class NearDupResource(dg.ConfigurableResource):
    """Near-duplicate detection settings. Changing a sketch setting needs a new index (it is refused otherwise)."""

    method: str = Field(default="minhash", description="'minhash' (MinHash + LSH) or 'simhash'.")
    threshold: float = Field(default=DEFAULT_THRESHOLD, description="Estimated Jaccard similarity that links two records.")
    num_perm: int = Field(default=128, description="MinHash permutations.")
    shingle: Optional[str] = Field(
        default=None, description="'word' or 'char' n-grams; empty means the method's default (MinHash word, SimHash char)."
    )
    ngram: Optional[int] = Field(
        default=None, description="n-gram size; empty means the method's default (MinHash 3, SimHash 4)."
    )
    simhash_max_distance: int = Field(default=3, description="SimHash: differing bits that still count as near.")
    verify: str = Field(
        default="auto",
        description="MinHash: 'estimate' (signatures), 'exact' (Jaccard of the shingles, from the payloads), or 'auto' "
        "(the estimate, and the exact Jaccard where the estimate is within two standard errors of the threshold)."
    )
    representative: str = Field(default="oldest", description="Cluster representative: 'oldest' or 'longest'.")
    chunk_size: int = Field(default=2000, description="Records sketched and linked per transaction.")
    max_bucket_size: Optional[int] = Field(
        default=DEFAULT_MAX_BUCKET_SIZE,
        description="A record meets at most this many (oldest) members of each LSH bucket; empty means no cap.",
    )
    max_cluster_share: float = Field(
        default=DEFAULT_MAX_CLUSTER_SHARE, description="Runaway-cluster check fails when one cluster holds more of a batch."
    )
    min_records_for_cluster_check: int = Field(
        default=DEFAULT_MIN_RECORDS_FOR_CLUSTER_CHECK, description="Smaller batches pass the runaway-cluster check."
    )

    def params(self) -> NearDupParams:
        text = {k: v for k, v in (("shingle", self.shingle), ("ngram", self.ngram)) if v is not None}
        return make_params(
            self.threshold, self.method, num_perm=self.num_perm, simhash_max_distance=self.simhash_max_distance,
            verify=self.verify, representative=self.representative, **text,
        )


class SeenSetResource(dg.ConfigurableResource):
    """The exact rung's fast path. It only says "maybe seen"; the warehouse's UNIQUE index decides."""

    kind: str = Field(default="auto", description="'auto' (Redis if $DEDUP_REDIS_URL is set, else Bloom), 'redis', 'bloom' or 'none'.")
    ttl_seconds: Optional[int] = Field(default=None, description="Redis key TTL; empty means $DEDUP_SEEN_TTL_SECONDS or 30 days.")
    bloom_capacity: Optional[int] = Field(
        default=None,
        description="Digests the Bloom filter is sized for (per hash version); empty means $DEDUP_BLOOM_CAPACITY or 10,000,000.",
    )
    bloom_error_rate: Optional[float] = Field(
        default=None,
        description="The Bloom filter's false-positive rate at capacity; empty means $DEDUP_BLOOM_ERROR_RATE or 0.001.",
    )

    def get(self) -> SeenSet:
        return seen_set_from_env(
            self.kind, ttl_seconds=self.ttl_seconds, bloom_capacity=self.bloom_capacity, bloom_error_rate=self.bloom_error_rate
        )


class ChecksResource(dg.ConfigurableResource):
    """How strict the asset checks are (the `checks` resource, editable in the launchpad): collapse-rate history,
    the quarantine bound, the seen-set's fill. The collapse-rate band itself is on the `ladder` resource."""

    history_window: int = Field(default=20, description="Earlier batches the collapse rate is compared against.")
    min_history: int = Field(default=3, description="Batches of history needed before the trailing median is used.")
    collapse_ratio: float = Field(
        default=0.25, description="Collapse-rate check fails (error) below this fraction of the trailing median."
    )
    jump_delta: float = Field(default=0.30, description="Warn when the rate is more than this above the trailing median...")
    jump_mads: float = Field(default=5.0, description="...and more than this many robust deviations (1.4826 x MAD) above it.")
    max_quarantine_rate: float = Field(default=0.05, description="Quarantine-rate check fails above this share of a batch's lines.")
    min_lines_for_quarantine_check: int = Field(default=20, description="Smaller batches pass the quarantine-rate check.")
    max_seen_set_fill: float = Field(
        default=0.9, description="Seen-set check warns when a Bloom filter holds more than this share of its capacity."
    )

    def collapse_rules(self, band_low: float, band_high: float, min_records: int) -> CollapseRules:
        return CollapseRules(
            band_low=band_low, band_high=band_high, min_records=min_records, window=self.history_window,
            min_history=self.min_history, collapse_ratio=self.collapse_ratio, jump_delta=self.jump_delta,
            jump_mads=self.jump_mads,
        )


def default_resources() -> dict:
    return {
        "warehouse": WarehouseResource(), "landing": LandingResource(), "ladder": LadderResource(),
        "near_dup": NearDupResource(), "seen_set": SeenSetResource(), "checks": ChecksResource(),
    }
