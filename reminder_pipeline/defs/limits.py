"""Limits that hold: a run whose limit tags are not its job's refuses to act.

Dagster merges the tags given at launch (Launchpad, GraphQL, ``execute_in_process(tags=...)``)
over the job's own, so a run launched with another ``reminder_pipeline/concurrency`` value would
escape the instance's one-at-a-time limit, and another ``dagster/max_runtime`` the run monitor's
time limit. Dagster offers no way to make a job's tag final, so each acting step checks: the
run's value of every limit tag must be the job's (``job_def.run_tags``), else the step fails,
before any database or broker work, with one line naming the tag. Checked in every step that
writes or sends, not only the first: a re-execution from a later step skips the first one.
"""

from dagster import DagsterRunStatus, Failure, OpExecutionContext

#: dagster.yaml's ``concurrency.runs.tag_concurrency_limits`` key (one dispatch, one re-publish).
CONCURRENCY_TAG = "reminder_pipeline/concurrency"
#: Run monitoring fails a run past this many seconds.
MAX_RUNTIME_TAG = "dagster/max_runtime"
LIMIT_TAGS = (CONCURRENCY_TAG, MAX_RUNTIME_TAG)
#: A run in one of these may still be running or be picked up (the schedule's skipped ticks and
#: the run retention count them as in flight). QUEUED and NOT_STARTED included: otherwise, while
#: one run is slow, every tick would queue one more run behind it and they would pile up.
IN_FLIGHT_STATUSES = (
    DagsterRunStatus.QUEUED,
    DagsterRunStatus.NOT_STARTED,
    DagsterRunStatus.STARTING,
    DagsterRunStatus.STARTED,
    DagsterRunStatus.CANCELING,
)


def overridden_limit(run_tags: dict[str, str], job_tags: dict[str, str]) -> str | None:
    """The one-line refusal when a limit tag of the run is not the job's, else None."""
    for key in LIMIT_TAGS:
        if run_tags.get(key) != job_tags.get(key):
            return (
                f"run tag {key}={run_tags.get(key)!r} is not its job's {job_tags.get(key)!r}: "
                "a limit tag cannot be overridden at launch; launch the run without it"
            )
    return None


def refuse_overridden_limits(context: OpExecutionContext) -> None:
    """Fail the step (no retry) before it acts when the run overrides a limit tag of its job."""
    refusal = overridden_limit(dict(context.run.tags), dict(context.job_def.run_tags))
    if refusal is not None:
        context.log.error(f"refused: {refusal}")
        raise Failure(description=refusal, allow_retries=False)
