"""The instance's run coordinator: Dagster's run queue, each run tagged with the lane it belongs to.

deploy/dagster.yaml (and the checkout's dagster.yaml, for `make dev`) allows one run at a time per value of the
`dedup/source` tag, so that a source's batches run in landing order, and one run of a rehash migration at a time
(`dedup/migration`). The landing sensor and the catch-up schedule tag their runs themselves, and the rehash jobs
carry their tag; a run launched any other way (a backfill from the UI or `dagster job backfill`, the launchpad,
`dagster job launch`, an asset's own page) carries only its `dagster/partition` tag, if that. Every run, however
launched, is submitted to the instance's run coordinator before it waits in the queue
(`DagsterInstance.submit_run`; the daemon's backfill loop submits each run of an asset or job backfill the same
way), so that is where the tag is added, before the daemon's dequeue applies the limits. Every process that loads
the instance (webserver, daemon, code server, run workers, the `dagster` CLI) must be able to import this module.
"""

from __future__ import annotations

import dagster as dg
from dagster._core.storage.tags import PARTITION_NAME_TAG

from dedup_pipeline.defs.pools import ensure_pool_limits
from dedup_pipeline.defs.rehash import MIGRATION_TAG, migration_lane
from dedup_pipeline.landing import SOURCE_TAG, batch_source


def lane_tags(run: dg.DagsterRun) -> dict[str, str]:
    """The lane tag `run` lacks: `dedup/migration=<target>` for a run of a rehash migration's assets,
    `dedup/source=<batch_source(partition)>` for any other run of a partition, none for the rest.

    A run that carries `dedup/migration` (the rehash jobs', the switch's) is a migration's and gets no source.
    """
    if MIGRATION_TAG in run.tags:
        return {}
    target = migration_lane(run)
    if target is not None:
        return {MIGRATION_TAG: target}
    partition = run.tags.get(PARTITION_NAME_TAG)
    if partition is not None and SOURCE_TAG not in run.tags:
        return {SOURCE_TAG: batch_source(partition)}
    return {}


class LaneTaggingRunCoordinator(dg.QueuedRunCoordinator):
    """A `QueuedRunCoordinator` that tags each run with its lane (`lane_tags`) before it is queued.

    The tag is added in the run storage. A tag the run already carries is kept (the sensor's `dedup/source`, or
    an operator's for batches whose keys name no landing date, such as `shop-a-day1`), and a run of neither kind
    is queued untouched. It also sets the `warehouse` pool's limit to the instance's default where the run's
    steps would, and fail to on PostgreSQL (`defs.pools`). Configured like its parent (`module`/`class` under
    `run_coordinator`); the limits stay under `concurrency:`.
    """

    def submit_run(self, context: dg.SubmitRunContext) -> dg.DagsterRun:
        ensure_pool_limits(self._instance)  # before the run's steps would (`defs.pools`)
        run = context.dagster_run
        tags = lane_tags(run)
        if tags:
            self._instance.add_run_tags(run.run_id, tags)
            context = context._replace(dagster_run=self._instance.get_run_by_id(run.run_id))
        return super().submit_run(context)
