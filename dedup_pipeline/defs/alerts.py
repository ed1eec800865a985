"""The run-failure alert: one clear line per failed run, with job, partition, failed steps and the error.

It goes to the sensor's log in the UI (Automation > ladder_failure_alert >
tick logs) and to the `dedup_pipeline.alerts` Python logger, which the daemon
writes to its output; point that logger at a handler (mail, chat webhook) to
page someone. Runs end up here after the steps' own retries (`RetryPolicy` on
the rungs) and the instance's run retries have been used up.
"""

import logging
from collections.abc import Sequence

import dagster as dg

from dedup_pipeline.defs.sensors import automation_status

log = logging.getLogger("dedup_pipeline.alerts")
PARTITION_TAG = "dagster/partition"
#: Set by Dagster on a failed run: "true" when the instance's run retries will run it again.
WILL_RETRY_TAG = "dagster/will_retry"


def error_summary(error) -> str:
    """`Cls: message` of what failed, on one line: the innermost cause, not the wrappers Dagster adds around it.

    A step that gave up after its retries fails with "Exceeded max_retries", a failed blocking check with
    "1 blocking asset check failed ... :" followed by the check's name on the next line: the cause, and
    every line of the message, are what an operator needs.
    """
    while error.cause is not None:
        error = error.cause
    message = " ".join(error.message.split())
    prefix = f"{error.cls_name}: "
    if not message.startswith(prefix):  # Dagster's own errors repeat their class, with its module
        message = prefix + message.split(f".{prefix}", 1)[-1]
    return message


def failure_alert(run: dg.DagsterRun, step_failures: Sequence[dg.DagsterEvent], run_message: str = "") -> str:
    """`ALERT dedup run failed: job=... partition=... step=... error=Cls: message run_id=...`"""
    steps = []
    for event in step_failures:
        error = getattr(event.event_specific_data, "error", None)
        reason = error_summary(error) if error else " ".join((event.message or "").split())
        steps.append(f"step={event.step_key} error={reason or 'unknown'}")
    detail = "; ".join(steps) or f"step=none error={(run_message or 'run failed before any step').strip()}"
    partition = run.tags.get(PARTITION_TAG, "none")
    return f"ALERT dedup run failed: job={run.job_name} partition={partition} {detail} run_id={run.run_id}"


@dg.run_failure_sensor(
    name="ladder_failure_alert",
    default_status=automation_status(),
    minimum_interval_seconds=30,
    description="Logs a clear alert (job, partition, failed steps, error) for every failed run of this code location "
    "that will not be retried.",
)
def ladder_failure_alert(context: dg.RunFailureSensorContext) -> None:
    if context.dagster_run.tags.get(WILL_RETRY_TAG) == "true":
        return  # the instance runs it again: the retry's failure, if it fails too, is the one to alert on
    message = failure_alert(context.dagster_run, context.get_step_failure_events(), context.failure_event.message or "")
    context.log.error(message)
    log.error(message)
