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


def ladder_resources(url, folder, seen_set=None, checks=None, near_dup=None, **ladder) -> dict:
    """The ladder's resources: the warehouse at `url`, the landing folder `folder` (its files taken at once), no
    seen-set unless one is given, `checks` (a resource, or a dict of its fields) for the checks resource, the
    near rung's resource if given, the rest for the ladder resource."""
    return {
        "warehouse": WarehouseResource(database_url=url),
        "landing": LandingResource(folder=str(folder), settle_seconds=0),
        "ladder": LadderResource(**ladder),
        "near_dup": near_dup or NearDupResource(),
        "seen_set": seen_set or SeenSetResource(kind="none"),
        "checks": checks if isinstance(checks, ChecksResource) else ChecksResource(**(checks or {})),
    }
