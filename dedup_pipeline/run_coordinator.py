"""The production instance's run coordinator: Dagster's run queue, each partition's run tagged with its crawl source.

deploy/dagster.yaml allows one run at a time per value of the `dedup/source` tag, so that a source's batches
run in landing order. The landing sensor and the catch-up schedule tag their runs themselves; a run launched
any other way (a backfill from the UI or `dagster job backfill`, the launchpad, `dagster job launch`) carries
only its `dagster/partition` tag. Every run, however launched, is submitted to the instance's run coordinator
before it waits in the queue (`DagsterInstance.submit_run`; the daemon's backfill loop submits each run of an
asset or job backfill the same way), so that is where the tag is added, before the daemon's dequeue applies the
limits. Every process that loads the instance (webserver, daemon, code server, run workers, the `dagster` CLI)
must be able to import this module.
"""

from __future__ import annotations

import dagster as dg
from dagster._core.storage.tags import PARTITION_NAME_TAG

from dedup_pipeline.landing import SOURCE_TAG, batch_source


class SourceTaggingRunCoordinator(dg.QueuedRunCoordinator):
    """A `QueuedRunCoordinator` that tags each run of a partition `dedup/source=<batch_source(partition)>`.

    The tag is added in the run storage before the run is queued. A run that already carries a `dedup/source`
    tag keeps it (the sensor's, or an operator's for batches whose keys name no landing date, such as
    `shop-a-day1`), and a run without a partition is queued untouched. Configured like its parent
    (`module`/`class` under `run_coordinator`); the limits stay under `concurrency: runs:`.
    """

    def submit_run(self, context: dg.SubmitRunContext) -> dg.DagsterRun:
        run = context.dagster_run
        partition = run.tags.get(PARTITION_NAME_TAG)
        if partition is not None and SOURCE_TAG not in run.tags:
            self._instance.add_run_tags(run.run_id, {SOURCE_TAG: batch_source(partition)})
            context = context._replace(dagster_run=self._instance.get_run_by_id(run.run_id))
        return super().submit_run(context)
