"""What the in-process Dagster tests share: the ladder's resources over a test warehouse and landing folder."""

from __future__ import annotations

from dedup_pipeline.defs.resources import (
    ChecksResource,
    LadderResource,
    LandingResource,
    NearDupResource,
    SeenSetResource,
    WarehouseResource,
)


def ladder_resources(url, folder, seen_set=None, checks=None, **ladder) -> dict:
    """The ladder's resources: the warehouse at `url`, the landing folder `folder` (its files taken at once), no
    seen-set unless one is given, `checks` (a dict) for the checks resource, the rest for the ladder resource."""
    return {
        "warehouse": WarehouseResource(database_url=url),
        "landing": LandingResource(folder=str(folder), settle_seconds=0),
        "ladder": LadderResource(**ladder),
        "near_dup": NearDupResource(),
        "seen_set": seen_set or SeenSetResource(kind="none"),
        "checks": ChecksResource(**(checks or {})),
    }
