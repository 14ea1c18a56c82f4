"""The schedules: ``reminder_dispatch`` every minute, outbox retention daily.

The dispatch schedule skips a tick while as many dispatch or catch-up runs are in flight as the
instance's run-concurrency limit for the dispatch tag allows (dagster.yaml; 1 by default, the
design's no-overlap rule), so slow runs never pile up in the queue.
"""

import os

from dagster import (
    DefaultScheduleStatus,
    RunRequest,
    RunsFilter,
    ScheduleDefinition,
    ScheduleEvaluationContext,
    SkipReason,
    schedule,
)

from ..config import CYCLE_MAX_BATCHES_ENV, check_max_batches
from .jobs import CONCURRENCY_TAGS, CONCURRENCY_VALUE, outbox_retention, reminder_dispatch
from .limits import CONCURRENCY_TAG, IN_FLIGHT_STATUSES

#: The operator's switch back to the literal one-batch cycle (``1``): the scheduled runs'
#: ``max_batches`` (and the CLI's). Unset, a run drains what is due within its budget.
MAX_BATCHES_ENV = CYCLE_MAX_BATCHES_ENV


def scheduled_run_config() -> dict[str, int]:
    """The scheduled run's config: ``max_batches`` from the environment if set, else defaults."""
    value = os.environ.get(MAX_BATCHES_ENV, "").strip()
    if not value:
        return {}
    return {"max_batches": check_max_batches(value, MAX_BATCHES_ENV)}


def dispatch_concurrency_limit(context: ScheduleEvaluationContext) -> int:
    """How many dispatch runs the instance lets run at once (its tag concurrency limit), else 1."""
    queue = context.instance.get_concurrency_config().run_queue_config
    for limit in (queue.tag_concurrency_limits if queue else None) or []:
        if limit.get("key") == CONCURRENCY_TAG and limit.get("value") in (CONCURRENCY_VALUE, None):
            return int(limit["limit"])
    return 1


@schedule(
    name="reminder_dispatch_schedule",
    job=reminder_dispatch,
    cron_schedule="* * * * *",
    execution_timezone="UTC",
    default_status=DefaultScheduleStatus.RUNNING,
    description="The design's 60 s cycle; a tick is skipped while the dispatch runs allowed "
    "at once "
    "(dagster.yaml's limit for the dispatch tag, 1 by default) are queued or running.",
)
def reminder_dispatch_schedule(context: ScheduleEvaluationContext) -> RunRequest | SkipReason:
    """A run per minute, or a SkipReason naming the runs still in flight (no pile-up)."""
    limit = dispatch_concurrency_limit(context)
    # By the concurrency tag rather than the job name: a catch-up run is a cycle too.
    in_flight = context.instance.get_run_records(
        filters=RunsFilter(tags=CONCURRENCY_TAGS, statuses=list(IN_FLIGHT_STATUSES)), limit=limit
    )
    if len(in_flight) < limit:
        return RunRequest(run_config=scheduled_run_config())
    runs = ", ".join(
        f"run {r.dagster_run.run_id} of {r.dagster_run.job_name} is still "
        f"{r.dagster_run.status.value}"
        for r in in_flight
    )
    return SkipReason(f"{runs} (limit {limit}); the next tick dispatches what is left")


#: 03:17 UTC: off the hour (when other cron jobs pile up) and in the quiet of the night.
outbox_retention_schedule = ScheduleDefinition(
    name="outbox_retention_schedule",
    job=outbox_retention,
    cron_schedule="17 3 * * *",
    execution_timezone="UTC",
    default_status=DefaultScheduleStatus.RUNNING,
    description="Daily outbox retention with the defaults (published rows older than 168 h).",
)
