"""dedup_pipeline: keep a warehouse of scraped web records free of duplicates.

The library API, for crawlers and notebooks (no Dagster needed):

- ``canonical_url(url, strict=False, version="url/2") -> str``: the canonical form of a URL, without userinfo
  (strict: UrlError if none; ``version="url/1"`` for the older rules, which keep userinfo);
- ``content_hash(record, version="content/2") -> (hex digest, version)``;
- ``cluster_near_duplicates(texts, threshold=..., method="minhash") -> list[int]``;
- ``first_time_seen(url) -> bool``: fetch-time URL dedup for crawlers (Redis, `url/2`, TTL).
"""

from dedup_pipeline.core.hashing import content_hash
from dedup_pipeline.core.url import canonical_url

__all__ = ["canonical_url", "content_hash", "cluster_near_duplicates", "first_time_seen"]


def __getattr__(name: str):
    # Near-duplicate clustering pulls in numpy; load it only when asked for.
    if name == "cluster_near_duplicates":
        from dedup_pipeline.core.near import cluster_near_duplicates

        return cluster_near_duplicates
    if name == "first_time_seen":
        from dedup_pipeline.crawler import first_time_seen

        return first_time_seen
    raise AttributeError(f"module 'dedup_pipeline' has no attribute {name!r}")
