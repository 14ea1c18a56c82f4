"""The sensors: the health checks every minute, and the ledger row of a run that failed early.

``reminder_health_sensor`` evaluates the health conditions once a minute in the daemon's code
server and reports them as runless check evaluations: the checks stay red or green whether or not
dispatch runs happen, and no run worker is started for them. Each dispatch run records them too,
with its materialization (``relay_outbox``); the sensor keeps them fresh between runs. A failed
evaluation (database down) fails the tick, which the UI shows.

``reminder_dispatch_failure_ledger``: ``relay_outbox`` records its run's cycle in the metrics
ledger; a run that fails before it (a step failing, resources that cannot start, a run failed by
run monitoring, a dead worker) is recorded here as a failed cycle, once (a run that materialized
the dispatcher is skipped). If the database is what failed, the tick fails before the cursor
moves and the daemon retries it.
"""

# No ``from __future__ import annotations``: Dagster reads the resource annotation.

import time

from dagster import (
    DagsterEventType,
    DagsterInstance,
    DefaultSensorStatus,
    RunFailureSensorContext,
    SensorEvaluationContext,
    SensorResult,
    run_failure_sensor,
    sensor,
)

from ..observability import ledger
from .assets import DISPATCH_ASSET_KEY
from .checks import evaluate_all
from .jobs import reminder_catch_up, reminder_dispatch
from .resources import PostgresResource

#: The ledger's error kind when a failed run names no failed step (it never started, or was killed).
RUN_FAILED = "DagsterRunFailure"


def relay_recorded(instance: DagsterInstance, run_id: str) -> bool:
    """True when the run materialized the dispatcher (``relay_outbox`` wrote its ledger row)."""
    records = instance.get_records_for_run(
        run_id, of_type=DagsterEventType.ASSET_MATERIALIZATION, limit=10
    ).records
    return any(
        r.event_log_entry.dagster_event is not None
        and r.event_log_entry.dagster_event.asset_key == DISPATCH_ASSET_KEY
        for r in records
    )


def failure_kind(context: RunFailureSensorContext) -> str:
    """The failed step's exception class, else the run's (never a message), else RUN_FAILED."""
    errors = [f.step_failure_data.error for f in context.get_step_failure_events()]
    errors.append(getattr(context.failure_event.event_specific_data, "error", None))
    for error in errors:
        # Dagster wraps what user code raised (DagsterExecutionStepExecutionError): name the cause.
        while (
            error is not None
            and (error.cls_name or "").startswith("Dagster")
            and error.cause is not None
        ):
            error = error.cause
        if error is not None and error.cls_name:
            return error.cls_name
    return RUN_FAILED


def _duration_seconds(instance: DagsterInstance, run_id: str) -> float:
    # How long the run ran, by Dagster's record of it; the ledger's times are the database's.
    record = instance.get_run_record_by_id(run_id)
    if record is None or record.start_time is None:
        return 0.0  # never started (resources, launch)
    end = record.end_time if record.end_time is not None else time.time()
    return max(end - record.start_time, 0.0)


@run_failure_sensor(
    name="reminder_dispatch_failure_ledger",
    monitored_jobs=[reminder_dispatch, reminder_catch_up],
    default_status=DefaultSensorStatus.RUNNING,
    description=(
        "Records a failed reminder_dispatch / reminder_catch_up run in the metrics ledger "
        "(errors counter, dispatch_errors check) when it failed before relay_outbox recorded it."
    ),
)
def reminder_dispatch_failure_ledger(
    context: RunFailureSensorContext, postgres: PostgresResource
) -> None:
    """One failed cycle per failed run that has no ledger row of its own."""
    # Returns None on purpose: any return value ends the tick after this run; None goes on to the
    # next failed run in the same tick.
    run_id = context.dagster_run.run_id
    if relay_recorded(context.instance, run_id):
        context.log.info(f"run {run_id} recorded its cycle in relay_outbox; nothing to add")
        return
    kind = failure_kind(context)
    written = ledger.record_cycle(
        postgres.engine,
        run_id,
        None,
        duration_seconds=_duration_seconds(context.instance, run_id),
        error=kind,
    )
    context.log.info(
        f"run {run_id} failed ({kind}): {'recorded' if written else 'NOT recorded'} in the ledger"
    )


#: How often the health checks are evaluated (the design's alerts are minute-granular).
HEALTH_INTERVAL_SECONDS = 60


@sensor(
    name="reminder_health_sensor",
    minimum_interval_seconds=HEALTH_INTERVAL_SECONDS,
    default_status=DefaultSensorStatus.RUNNING,
    description=(
        "Evaluates the dispatcher's asset checks every minute (runless check evaluations), "
        "whether or not dispatch runs happen, between the runs that record them with their "
        "materialization; no run is launched."
    ),
)
def reminder_health_sensor(
    context: SensorEvaluationContext, postgres: PostgresResource
) -> SensorResult:
    """One evaluation of every check, reported on the dispatcher asset."""
    checks = evaluate_all(postgres.engine)
    failing = [c.check_name for c in checks if not c.passed]
    summary = f"failing: {', '.join(failing)}" if failing else "all passed"
    # The verdict goes on the tick (its skip reason), not through context.log: a logged line is a
    # captured-log file per tick under DAGSTER_HOME/storage (1,440 a day) that Dagster never
    # deletes, not even with the purged tick.
    return SensorResult(
        asset_events=checks,
        skip_reason=f"health checks evaluated ({summary}); no run needed",
    )
