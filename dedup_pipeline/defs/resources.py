"""Resources: where the warehouse and the landing folder are, how the ladder behaves, how strict the checks are.

Each setting's default is held once, by the settings object the resource builds (`LadderSettings`,
`NearSettings` and `NearDupParams`, `CollapseRules`, `DuplicatePolicy`); the fields below read it from there. The
checks' quarantine and seen-set bounds, the landing alert's delay and the seen-set's kind, which no settings
object holds, have their defaults in their fields.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Optional

import dagster as dg
from pydantic import Field

from dedup_pipeline import environment
from dedup_pipeline.core.exact import DuplicatePolicy
from dedup_pipeline.core.near import SKETCH_SETTINGS, NearDupParams, make_params
from dedup_pipeline.ladder.canonical import PARALLEL_FLOOR
from dedup_pipeline.ladder.settings import LadderSettings, NearSettings
from dedup_pipeline.landing import DEFAULT_SETTLE_SECONDS, landing_dir
from dedup_pipeline.quality.collapse import CollapseRules
from dedup_pipeline.store.seen_set import SeenSet, seen_set_from_env
from dedup_pipeline.store.warehouse import Warehouse, default_database_url


@lru_cache(maxsize=8)
def _warehouse(url: str, tombstone_key: str | None) -> Warehouse:
    # One engine (connection pool) per process, URL and key; the schema is created once.
    return Warehouse(url, tombstone_key=tombstone_key).create_schema()


class WarehouseResource(dg.ConfigurableResource):
    """The warehouse database. Unset means $DEDUP_DATABASE_URL, else a local SQLite file."""

    database_url: Optional[str] = Field(
        default=None,
        description="SQLAlchemy URL, e.g. postgresql+psycopg://user@host:5432/db. "
        "Leave empty to use $DEDUP_DATABASE_URL or the embedded SQLite warehouse.",
    )
    tombstone_key: Optional[str] = Field(
        default=None,
        repr=False,
        description=f"The secret the erasure tombstones are keyed with. A secret: give it only as "
        f"{{env: {environment.TOMBSTONE_KEY_ENV}}}, never as a value. Empty means ${environment.TOMBSTONE_KEY_ENV}, "
        "else a key file beside the embedded SQLite warehouse (a PostgreSQL warehouse refuses to erase without one).",
    )

    def get(self) -> Warehouse:
        return _warehouse(self.database_url or default_database_url(), self.tombstone_key or None)


class LandingResource(dg.ConfigurableResource):
    """The landing folder crawlers drop batch files into."""

    folder: Optional[str] = Field(
        default=None,
        description="Folder path; empty means $DEDUP_LANDING_DIR, else the data folder's landing/ "
        "($DEDUP_DATA_DIR, else .dedup).",
    )
    settle_seconds: float = Field(
        default=DEFAULT_SETTLE_SECONDS,
        description="A file modified more recently than this is still being written and is left alone.",
    )
    alert_after_seconds: float = Field(
        default=600.0,
        description="The landing sensor raises an alert for a file set aside (no batch name, or two files for one "
        "batch) that has sat in the folder longer than this.",
    )

    def path(self) -> Path:
        return Path(self.folder).resolve() if self.folder else landing_dir()


class LadderResource(dg.ConfigurableResource):
    """How records move down the ladder (see docs/exact.md, duplicate classes)."""

    chunk_size: int = Field(
        default=LadderSettings.chunk_size, description="Records per transaction and per set-based statement."
    )
    natural_key: list[str] = Field(
        default=list(LadderSettings.natural_key), description="Fields that identify the same thing."
    )
    hash_versions: list[str] = Field(
        default=list(LadderSettings.hash_versions),
        description="Hash versions computed per record; the active one always, a retired one never.",
    )
    on_changed: str = Field(
        default=DuplicatePolicy.on_changed,
        description="'upsert' (keep old content in history) or 'keep_first'; $DEDUP_ON_CHANGED when set.",
    )
    keep_history: bool = Field(
        default=DuplicatePolicy.keep_history, description="Keep superseded content in record_history."
    )
    canonical_workers: int = Field(
        default=LadderSettings.canonical_workers,
        description=f"Processes that canonicalise a batch of {PARALLEL_FLOOR:,} lines or more: "
        "0 is one per CPU, 1 keeps it in the step's process.",
    )
    max_line_bytes: int = Field(
        default=LadderSettings.max_line_bytes,
        description="Longest landing line read as a record (bytes); a longer one is quarantined with its length.",
    )

    def settings(self) -> LadderSettings:
        return LadderSettings(
            chunk_size=self.chunk_size,
            natural_key=tuple(self.natural_key),
            hash_versions=tuple(self.hash_versions),
            policy=DuplicatePolicy(on_changed=self.on_changed, keep_history=self.keep_history),
            canonical_workers=self.canonical_workers,
            max_line_bytes=self.max_line_bytes,
        )


class NearDupResource(dg.ConfigurableResource):
    """Near-duplicate detection settings. A sketch setting left empty is the index's (the one it was built with),
    else its default; naming another one needs a new index (it is refused otherwise)."""

    method: Optional[str] = Field(
        default=None, description="'minhash' (MinHash + LSH) or 'simhash'; empty means the index's, else minhash."
    )
    threshold: float = Field(
        default=NearDupParams.threshold, description="Estimated Jaccard similarity that links two records."
    )
    num_perm: Optional[int] = Field(
        default=None, description=f"MinHash permutations; empty means the index's, else {NearDupParams.num_perm}."
    )
    bands: Optional[int] = Field(
        default=None,
        description="MinHash LSH bands (with rows); empty means the index's, or for a new index the ones chosen for "
        "the threshold. A threshold far below the one the bands were built for loses candidates (a warning says so).",
    )
    rows: Optional[int] = Field(default=None, description="MinHash LSH rows per band (with bands).")
    shingle: Optional[str] = Field(
        default=None,
        description="'auto' (by the text's length), 'word' or 'char' n-grams; empty means the index's, else the "
        "method's default (MinHash auto, SimHash char).",
    )
    ngram: Optional[int] = Field(
        default=None,
        description="n-gram size; empty means the index's, else the method's default (MinHash 3, SimHash 4).",
    )
    marks: Optional[str] = Field(
        default=None,
        description="A script's combining marks (vowel signs, harakat): 'keep' them in their words (text/3) or "
        "'strip' them as punctuation (text/2); empty means the index's, else keep.",
    )
    simhash_max_distance: Optional[int] = Field(
        default=None,
        description="SimHash: differing bits that still count as near; empty means the index's, else "
        f"{NearDupParams.simhash_max_distance}.",
    )
    verify: str = Field(
        default=NearDupParams.verify,
        description="MinHash: 'estimate' (signatures), 'exact' (Jaccard of the shingles, from the payloads), or 'auto' "
        "(the estimate, and the exact Jaccard where the estimate is within two standard errors of the threshold).",
    )
    representative: str = Field(
        default=NearDupParams.representative, description="Cluster representative: 'oldest' or 'longest'."
    )
    require_shared_code: bool = Field(
        default=NearDupParams.require_shared_code,
        description="Keep apart two records whose texts both name codes (tokens mixing letters and digits, such as "
        "model and part numbers) but none in common, however similar the rest.",
    )
    chunk_size: int = Field(default=NearSettings.chunk_size, description="Records sketched and linked per transaction.")
    max_candidates: Optional[int] = Field(
        default=NearSettings.max_candidates,
        description="A record meets at most this many (first stored) records sharing a band with it; empty: no cap.",
    )
    max_links: int = Field(
        default=NearSettings.max_links,
        description="Links a record keeps: to its nearest earlier-landed near duplicates.",
    )
    max_cluster_share: float = Field(
        default=NearSettings.max_cluster_share,
        description="Runaway-cluster check fails when one cluster holds more of a batch.",
    )
    min_records_for_cluster_check: int = Field(
        default=NearSettings.min_records_for_cluster_check,
        description="Smaller batches are not judged by the runaway-cluster check (a warning, never a pass).",
    )

    def params(self) -> NearDupParams:
        """The settings given, and the defaults for the sketch settings left empty (a run takes the index's)."""
        given = {name: getattr(self, name) for name in SKETCH_SETTINGS if getattr(self, name) is not None}
        return make_params(
            self.threshold,
            given.pop("method", None),
            verify=self.verify,
            representative=self.representative,
            require_shared_code=self.require_shared_code,
            **given,
        )

    def settings(self) -> NearSettings:
        return NearSettings(
            params=self.params(),
            chunk_size=self.chunk_size,
            max_candidates=self.max_candidates,
            max_links=self.max_links,
            from_index=frozenset(name for name in SKETCH_SETTINGS if getattr(self, name) is None),
            max_cluster_share=self.max_cluster_share,
            min_records_for_cluster_check=self.min_records_for_cluster_check,
        )


class SeenSetResource(dg.ConfigurableResource):
    """The exact rung's fast path. It only says "maybe seen"; the warehouse's UNIQUE index decides."""

    kind: str = Field(
        default="auto", description="'auto' (Redis if a Redis URL is set, else Bloom), 'redis', 'bloom' or 'none'."
    )
    redis_url: Optional[str] = Field(
        default=None, description=f"Redis URL of the seen-set; empty means ${environment.REDIS_URL_ENV} (none: Bloom)."
    )
    ttl_seconds: Optional[int] = Field(
        default=None,
        description=f"Redis key TTL; empty means ${environment.SEEN_TTL_ENV} "
        f"or {environment.DEFAULT_TTL_SECONDS // 86400} days.",
    )
    bloom_capacity: Optional[int] = Field(
        default=None,
        description="Digests the Bloom filter is sized for (per hash version); empty means "
        f"${environment.BLOOM_CAPACITY_ENV} or {environment.DEFAULT_BLOOM_CAPACITY:,}.",
    )
    bloom_error_rate: Optional[float] = Field(
        default=None,
        description="The Bloom filter's false-positive rate at capacity; empty means "
        f"${environment.BLOOM_ERROR_RATE_ENV} or {environment.DEFAULT_BLOOM_ERROR_RATE:g}.",
    )

    def get(self) -> SeenSet:
        return seen_set_from_env(
            self.kind,
            ttl_seconds=self.ttl_seconds,
            bloom_capacity=self.bloom_capacity,
            bloom_error_rate=self.bloom_error_rate,
            redis_url=self.redis_url,
        )


class ChecksResource(dg.ConfigurableResource):
    """How strict the asset checks are (the `checks` resource, editable in the launchpad): the collapse-rate band
    and history, the quarantine bound, the seen-set's fill."""

    min_collapse_rate: float = Field(
        default=CollapseRules.band_low, description="Collapse-rate check fails below this."
    )
    max_collapse_rate: float = Field(
        default=CollapseRules.band_high, description="Collapse-rate check fails above this."
    )
    min_records_for_check: int = Field(
        default=CollapseRules.min_records,
        description="Smaller batches are not judged by the collapse-rate check (a warning, never a pass).",
    )
    history_window: int = Field(
        default=CollapseRules.window, description="Earlier batches the collapse rate is compared against."
    )
    min_history: int = Field(
        default=CollapseRules.min_history, description="Batches of history needed before the trailing median is used."
    )
    collapse_ratio: float = Field(
        default=CollapseRules.collapse_ratio,
        description="Collapse-rate check fails (error) below this fraction of the trailing median.",
    )
    jump_delta: float = Field(
        default=CollapseRules.jump_delta,
        description="Warn when the rate is more than this above the trailing median...",
    )
    jump_mads: float = Field(
        default=CollapseRules.jump_mads,
        description="...and more than this many robust deviations (1.4826 x MAD) above it.",
    )
    max_quarantine_rate: float = Field(
        default=0.05, description="Quarantine-rate check fails above this share of a batch's lines."
    )
    min_lines_for_quarantine_check: int = Field(
        default=20,
        description="A smaller batch within max_quarantine_rate passes the quarantine-rate check; one over it is not "
        "judged (a warning), unless mostly quarantined.",
    )
    blocking_quarantine_rate: float = Field(
        default=0.5,
        description="Quarantine-rate check fails with an error and blocks the warehouse write above this share of "
        "a batch's lines, whatever its size: a batch that is mostly broken lines is a broken file or crawler.",
    )
    max_seen_set_fill: float = Field(
        default=0.9, description="Seen-set check warns when a Bloom filter holds more than this share of its capacity."
    )

    def collapse_rules(self) -> CollapseRules:
        return CollapseRules(
            band_low=self.min_collapse_rate,
            band_high=self.max_collapse_rate,
            min_records=self.min_records_for_check,
            window=self.history_window,
            min_history=self.min_history,
            collapse_ratio=self.collapse_ratio,
            jump_delta=self.jump_delta,
            jump_mads=self.jump_mads,
        )


#: The resource fields whose value may come from the environment, and how Dagster reads the variable.
_ENV_VAR_TYPES = {"seen_set.ttl_seconds": dg.EnvVar.int}


def environment_config() -> dict[str, dict]:
    """Per resource, its fields set from the environment as `dg.EnvVar`s, so the launchpad names the variable
    a value comes from (`environment.resource_variables`: only the variables that are set)."""
    config: dict[str, dict] = {}
    for field, name in environment.resource_variables().items():
        resource, attribute = field.split(".")
        config.setdefault(resource, {})[attribute] = _ENV_VAR_TYPES.get(field, dg.EnvVar)(name)
    return config


def default_resources() -> dict:
    env = environment_config()
    return {
        "warehouse": WarehouseResource(**env.get("warehouse", {})),
        "landing": LandingResource(**env.get("landing", {})),
        "ladder": LadderResource(**env.get("ladder", {})),
        "near_dup": NearDupResource(),
        "seen_set": SeenSetResource(**env.get("seen_set", {})),
        "checks": ChecksResource(),
    }
