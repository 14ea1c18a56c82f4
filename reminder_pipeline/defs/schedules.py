"""The 60-second schedule of ``reminder_dispatch``, skipping a tick while a cycle is in flight."""

from dagster import (
    DagsterRunStatus,
    DefaultScheduleStatus,
    RunRequest,
    RunsFilter,
    ScheduleEvaluationContext,
    SkipReason,
    schedule,
)

from .jobs import CONCURRENCY_TAGS, reminder_dispatch

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
    in_flight = context.instance.get_run_records(
        filters=RunsFilter(tags=CONCURRENCY_TAGS, statuses=IN_FLIGHT_STATUSES), limit=1
    )
    if in_flight:
        run = in_flight[0].dagster_run
        return SkipReason(
            f"run {run.run_id} of {run.job_name} is still {run.status.value}; "
            "the next tick dispatches what is left"
        )
    return RunRequest()
