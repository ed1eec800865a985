"""Settings of the ladder, as plain data so that core, store and the Dagster layer share them."""

from __future__ import annotations

from dataclasses import dataclass, field

from dedup_pipeline.core.hashing import HASH_RULES
from dedup_pipeline.core.exact import DuplicatePolicy
from dedup_pipeline.core.records import DEFAULT_NATURAL_KEY


@dataclass(frozen=True)
class LadderSettings:
    """How a batch moves down the ladder.

    - ``chunk_size``: records per transaction and per set-based statement; memory is bounded by it.
    - ``natural_key``: fields that identify "the same thing" (the canonical URL by default).
    - ``hash_versions``: versions computed for every record (the active one is always required).
    - ``policy``: what to do per duplicate class.
    - ``canonical_workers``: processes that canonicalise a large batch's chunks (0: one per CPU; 1: inline).
    """

    chunk_size: int = 2000
    natural_key: tuple[str, ...] = DEFAULT_NATURAL_KEY
    hash_versions: tuple[str, ...] = tuple(HASH_RULES)
    policy: DuplicatePolicy = field(default_factory=DuplicatePolicy)
    canonical_workers: int = 0

    def __post_init__(self) -> None:
        if self.chunk_size < 1:
            raise ValueError("chunk_size must be at least 1")
        if self.canonical_workers < 0:
            raise ValueError("canonical_workers must be 0 (one per CPU) or more")
        unknown = set(self.hash_versions) - set(HASH_RULES)
        if unknown:
            raise ValueError(f"unknown hash versions {sorted(unknown)}; known: {sorted(HASH_RULES)}")
