"""The schedules: ``reminder_dispatch`` every minute, outbox retention daily.

The dispatch schedule skips a tick while a dispatch or catch-up run is in flight, so slow runs
never pile up in the queue. (The health checks are evaluated every minute by a sensor, not a
scheduled run: ``defs/sensors.py``.)
"""

from dagster import (
    DagsterRunStatus,
    DefaultScheduleStatus,
    RunRequest,
    RunsFilter,
    ScheduleDefinition,
    ScheduleEvaluationContext,
    SkipReason,
    schedule,
)

from .jobs import CONCURRENCY_TAGS, outbox_retention, reminder_dispatch

#: QUEUED and NOT_STARTED included: otherwise, while one run is slow, every tick would queue one
#: more run behind it and they would pile up.
IN_FLIGHT_STATUSES = [
    DagsterRunStatus.QUEUED,
    DagsterRunStatus.NOT_STARTED,
    DagsterRunStatus.STARTING,
    DagsterRunStatus.STARTED,
    DagsterRunStatus.CANCELING,
]


@schedule(
    name="reminder_dispatch_schedule",
    job=reminder_dispatch,
    cron_schedule="* * * * *",
    execution_timezone="UTC",
    default_status=DefaultScheduleStatus.RUNNING,
    description="The seed's 60 s cycle; a tick is skipped while a dispatch or catch-up run is queued or running.",
)
def reminder_dispatch_schedule(context: ScheduleEvaluationContext):
    """A run per minute, or a SkipReason naming the run still in flight (no overlapping cycles)."""
    # By the concurrency tag rather than the job name: a catch-up run is a cycle too. The run
    # coordinator's limit would hold a new run anyway; skipping keeps the queue empty and says why.
    return _run_unless_in_flight(context, CONCURRENCY_TAGS, "the next tick dispatches what is left")


#: 03:17 UTC: off the hour (when other cron jobs pile up) and in the quiet of the night.
outbox_retention_schedule = ScheduleDefinition(
    name="outbox_retention_schedule",
    job=outbox_retention,
    cron_schedule="17 3 * * *",
    execution_timezone="UTC",
    default_status=DefaultScheduleStatus.RUNNING,
    description="Daily outbox retention with the defaults (published rows older than 168 h).",
)


def _run_unless_in_flight(context: ScheduleEvaluationContext, tags: dict, then: str):
    """A RunRequest, or a SkipReason naming a queued/running run carrying ``tags``."""
    in_flight = context.instance.get_run_records(
        filters=RunsFilter(tags=tags, statuses=IN_FLIGHT_STATUSES), limit=1
    )
    if in_flight:
        run = in_flight[0].dagster_run
        return SkipReason(f"run {run.run_id} of {run.job_name} is still {run.status.value}; {then}")
    return RunRequest()
