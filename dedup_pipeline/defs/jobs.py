"""Jobs users launch from the UI or the command line."""

import dagster as dg

from dedup_pipeline.defs.assets import ladder_assets

dedup_ladder_job = dg.define_asset_job(
    "dedup_ladder",
    selection=dg.AssetSelection.assets(*ladder_assets),
    description="The whole dedup ladder for one crawl batch: "
    "raw -> canonical -> exact dedup -> near-duplicate clusters.",
)
