"""The run-failure alert: one clear line per failed run, with job, partition, failed steps and the error.

It goes to the sensor's log in the UI (Automation > ladder_failure_alert >
tick logs) and to the `dedup_pipeline.alerts` Python logger, which the daemon
writes to its output; point that logger at a handler (mail, chat webhook) to
page someone. Runs end up here after the steps' own retries (`RetryPolicy` on
the rungs) and the instance's run retries have been used up.
"""

import logging
from typing import Sequence

import dagster as dg

from dedup_pipeline.defs.sensors import automation_status

log = logging.getLogger("dedup_pipeline.alerts")
PARTITION_TAG = "dagster/partition"


def failure_alert(run: dg.DagsterRun, step_failures: Sequence[dg.DagsterEvent], run_message: str = "") -> str:
    """`ALERT dedup run failed: job=... partition=... step=... error=Cls: message run_id=...`"""
    steps = []
    for event in step_failures:
        error = getattr(event.event_specific_data, "error", None)
        reason = f"{error.cls_name}: {error.message.strip()}" if error else (event.message or "").strip()
        steps.append(f"step={event.step_key} error={reason.splitlines()[0] if reason else 'unknown'}")
    detail = "; ".join(steps) or f"step=none error={(run_message or 'run failed before any step').strip()}"
    partition = run.tags.get(PARTITION_TAG, "none")
    return f"ALERT dedup run failed: job={run.job_name} partition={partition} {detail} run_id={run.run_id}"


@dg.run_failure_sensor(
    name="ladder_failure_alert", default_status=automation_status(), minimum_interval_seconds=30,
    description="Logs a clear alert (job, partition, failed steps, error) for every failed run of this code location.",
)
def ladder_failure_alert(context: dg.RunFailureSensorContext) -> None:
    message = failure_alert(context.dagster_run, context.get_step_failure_events(), context.failure_event.message or "")
    context.log.error(message)
    log.error(message)
