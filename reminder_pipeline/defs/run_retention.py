"""``dagster_run_retention``: Dagster's own storage kept bounded, daily.

One op over :func:`reminder_pipeline.defs.run_retention_pass.purge_runs` (the rules are there).
Its budget
stays under the run's ``dagster/max_runtime``, so even the first pass over a year of minute runs
ends on its own, with what is left counted; the next day's run goes on from the oldest left.
Safe next to dispatch runs: it touches only finished runs in Dagster's storage, never the app's
database, so it carries no dispatch concurrency tag.
"""

# No ``from __future__ import annotations``: Dagster reads the op's annotations at definition time.

from collections.abc import Iterator
from datetime import timedelta
from functools import partial
from typing import Annotated

from dagster import (
    Config,
    DefaultScheduleStatus,
    OpExecutionContext,
    Output,
    RunRequest,
    RunsFilter,
    ScheduleEvaluationContext,
    SkipReason,
    in_process_executor,
    job,
    op,
    schedule,
)
from pydantic import Field

from ..config import check_int, check_number
from ..logs import line
from . import run_retention_pass
from .jobs import KIND_TAG
from .limits import IN_FLIGHT_STATUSES
from .run_config import checked_by, validated
from .run_retention_pass import MetadataScalar

RUN_RETENTION_JOB_NAME = "dagster_run_retention"
#: Run monitoring fails the run past this; the budget's upper bound leaves two minutes for the
#: run worker's start, the last batch and the final count.
RUN_RETENTION_MAX_RUNTIME_SECONDS = 1500
RUN_RETENTION_MAX_BUDGET_SECONDS = RUN_RETENTION_MAX_RUNTIME_SECONDS - 120
#: Keeping more than a year (525,600 minute runs) is the unbounded growth this job exists to stop.
MAX_KEEP_DAYS = 365
RUN_RETENTION_MAX_BATCH_SIZE = 1000


class RunRetentionConfig(Config):
    """How old a finished run must be to go, how many runs per batch, and the time budget."""

    keep_days: Annotated[
        int, checked_by(partial(check_int, name="keep_days", low=1, high=MAX_KEEP_DAYS))
    ] = Field(
        default=run_retention_pass.DEFAULT_KEEP.days,
        description="Finished runs created more than this many days ago go "
        "(default 14, at most 365).",
    )
    batch_size: Annotated[
        int,
        checked_by(partial(check_int, name="batch_size", low=1, high=RUN_RETENTION_MAX_BATCH_SIZE)),
    ] = Field(
        default=run_retention_pass.RUN_RETENTION_BATCH_SIZE,
        description="Runs looked up per batch (oldest first), 1..1,000.",
    )
    budget_seconds: Annotated[
        float,
        checked_by(
            partial(
                check_number, name="budget_seconds", low=1.0, high=RUN_RETENTION_MAX_BUDGET_SECONDS
            )
        ),
    ] = Field(
        default=run_retention_pass.RUN_RETENTION_BUDGET_SECONDS,
        description=f"No deletion starts after this many seconds (at "
        f"most {RUN_RETENTION_MAX_BUDGET_SECONDS}); the next run resumes.",
    )


@op(description="Delete old finished runs with their event logs, step outputs and compute logs.")
def delete_old_runs(
    context: OpExecutionContext, config: RunRetentionConfig
) -> Iterator[Output[dict[str, MetadataScalar]]]:
    """One retention pass over this instance; its counts as output metadata and a log line."""
    run_retention_pass.pool_connections(context.instance)
    report = run_retention_pass.purge_runs(
        context.instance,
        timedelta(days=config.keep_days),
        batch_size=config.batch_size,
        budget_seconds=config.budget_seconds,
        own_run_id=context.run_id,
        on_progress=lambda so_far: context.log.info(
            line("dagster run retention in progress", so_far)
        ),
    )
    context.log.info(line("dagster runs purged", {"run_id": context.run_id, **report.fields()}))
    counts = {**report.fields(), "keep_days": config.keep_days}
    # Plain ints, floats and bools become Dagster's int/float/bool metadata (plotted over runs).
    yield Output(counts, metadata=counts)


@job(
    name=RUN_RETENTION_JOB_NAME,
    description=(
        "Dagster run retention: deletes finished runs (success, failure, canceled) created more "
        "than keep_days ago (default 14), oldest first in batches, with their event logs, step "
        "outputs and compute logs; never a run in flight, a run group being re-executed or "
        "with a run younger than keep_days, a run of an unfinished back-fill, or itself. A run "
        "whose files cannot be deleted is kept and counted (runs_undeletable), the pass goes on. "
        "Stops within budget_seconds and counts what is left; the next run resumes. "
        "Daily from dagster_run_retention_schedule."
    ),
    config=validated(RUN_RETENTION_JOB_NAME, RunRetentionConfig, delete_old_runs),
    executor_def=in_process_executor,
    tags={KIND_TAG: "maintenance", "dagster/max_runtime": str(RUN_RETENTION_MAX_RUNTIME_SECONDS)},
)
def dagster_run_retention() -> None:
    """One step: the retention pass."""
    delete_old_runs()


#: 02:43 UTC: off the hour, in the quiet of the night, apart from outbox retention (03:17).
@schedule(
    name="dagster_run_retention_schedule",
    job=dagster_run_retention,
    cron_schedule="43 2 * * *",
    execution_timezone="UTC",
    default_status=DefaultScheduleStatus.RUNNING,
    description="Daily run retention with the defaults (keep 14 days); skipped while one runs.",
)
def dagster_run_retention_schedule(context: ScheduleEvaluationContext) -> RunRequest | SkipReason:
    """A run a day, or a SkipReason naming the retention run still in flight."""
    in_flight = context.instance.get_run_records(
        filters=RunsFilter(job_name=RUN_RETENTION_JOB_NAME, statuses=list(IN_FLIGHT_STATUSES)),
        limit=1,
    )
    if in_flight:
        run = in_flight[0].dagster_run
        return SkipReason(
            f"run {run.run_id} of {RUN_RETENTION_JOB_NAME} is still {run.status.value}"
        )
    return RunRequest()
