"""Settings of the ladder's rungs, as plain data: the only holders of their defaults.

The Dagster resources (`dedup_pipeline.defs.resources`) read their defaults from here and build these
objects; core, store and the rungs take them as they are.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dedup_pipeline.core.exact import DuplicatePolicy
from dedup_pipeline.core.hashing import HASH_RULES
from dedup_pipeline.core.near import DEFAULT_MAX_CANDIDATES, DEFAULT_MAX_LINKS, NearDupParams
from dedup_pipeline.core.records import DEFAULT_NATURAL_KEY

#: Records per chunk and per set-based statement in the canonical, exact and near rungs (memory is bounded by it):
#: a transaction each in the exact and near rungs; the canonical rung rewrites a batch in one transaction.
CHUNK_SIZE = 2000
#: Longest landing line read as a record (bytes, without its newline): a longer one is quarantined, and never
#: held in memory whole.
MAX_LINE_BYTES = 2 << 20  # a megabyte-long field still fits (see the nasty corpus)


@dataclass(frozen=True)
class LadderSettings:
    """How a batch moves down the ladder.

    - ``chunk_size``: records per chunk and per set-based statement (`CHUNK_SIZE`); memory is bounded by it.
    - ``natural_key``: fields that identify "the same thing" (the canonical URL by default).
    - ``hash_versions``: versions computed for every record; the active one is computed whether listed or not,
      and one the rehash migration retired is not (`retired_hash_versions`).
    - ``policy``: what to do per duplicate class.
    - ``canonical_workers``: processes that canonicalise a large batch's chunks (0: one per CPU; 1: inline).
    - ``max_line_bytes``: longest landing line read as a record; a longer one is quarantined with its length.
    """

    chunk_size: int = CHUNK_SIZE
    natural_key: tuple[str, ...] = DEFAULT_NATURAL_KEY
    hash_versions: tuple[str, ...] = tuple(HASH_RULES)
    policy: DuplicatePolicy = field(default_factory=DuplicatePolicy)
    canonical_workers: int = 0
    max_line_bytes: int = MAX_LINE_BYTES

    def __post_init__(self) -> None:
        if self.chunk_size < 1:
            raise ValueError("chunk_size must be at least 1")
        if self.max_line_bytes < 64:
            raise ValueError("max_line_bytes must be at least 64 (a record needs a url)")
        if self.canonical_workers < 0:
            raise ValueError("canonical_workers must be 0 (one per CPU) or more")
        unknown = set(self.hash_versions) - set(HASH_RULES)
        if unknown:
            raise ValueError(f"unknown hash versions {sorted(unknown)}; known: {sorted(HASH_RULES)}")


@dataclass(frozen=True)
class NearSettings:
    """How the near rung runs, and what its runaway-cluster check allows.

    - ``params``: the sketch, verification and representative settings (`NearDupParams`).
    - ``chunk_size``: records sketched and linked per transaction.
    - ``max_candidates``: a record meets at most this many (the first stored) of the records sharing a band key
      with it; None: no cap. Above the largest real clusters measured (hundreds), so that the cap only meets
      boilerplate: a capped record's links depend on what was indexed before it (docs/near.md).
    - ``max_links``: links a record keeps, to its nearest earlier-landed near duplicates.
    - ``from_index``: the sketch settings (`SKETCH_SETTINGS`) an index that exists gives, in place of
      ``params``' own: those a run's config leaves empty (`NearDupResource.settings`); here, bands and rows,
      which ``params`` chose for its threshold. An index keeps the settings it was built with (bands and rows
      whatever the threshold, which then only filters verified pairs); a run that names other ones is refused.
    - ``max_cluster_share``: the runaway-cluster check fails when one cluster holds more of a batch.
    - ``min_records_for_cluster_check``: smaller batches pass that check.
    """

    params: NearDupParams = field(default_factory=NearDupParams)
    chunk_size: int = CHUNK_SIZE
    max_candidates: int | None = DEFAULT_MAX_CANDIDATES
    max_links: int = DEFAULT_MAX_LINKS
    from_index: frozenset[str] = frozenset({"bands", "rows"})
    max_cluster_share: float = 0.2
    min_records_for_cluster_check: int = 50

    def __post_init__(self) -> None:
        if self.chunk_size < 1:
            raise ValueError("chunk_size must be at least 1")
        if self.max_candidates is not None and self.max_candidates < 1:
            raise ValueError("max_candidates must be at least 1 (or None for no cap)")
        if self.max_links < 1:
            raise ValueError("max_links must be at least 1")
        if not 0.0 < self.max_cluster_share <= 1.0:
            raise ValueError("max_cluster_share must be in (0, 1]")
