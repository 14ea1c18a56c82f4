"""The seed's alerts as asset checks on the dispatcher, evaluated by ``reminder_health_checks`` with no dispatch run needed.

The job runs against the real database; each check's verdict, severity and figures are read
back from the run's ``AssetCheckEvaluation`` events.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from dagster import (
    AssetCheckKey,
    AssetCheckSeverity,
    DagsterInstance,
    DagsterRun,
    DagsterRunStatus,
    DefaultScheduleStatus,
    RunRequest,
    SkipReason,
    build_schedule_context,
    instance_for_test,
)
from dagster._core.remote_origin import RegisteredCodeLocationOrigin, RemoteRepositoryOrigin

from reminder_pipeline.definitions import defs
from reminder_pipeline.defs.assets import DISPATCH_ASSET_KEY
from reminder_pipeline.defs.checks import CHECKS
from reminder_pipeline.defs.jobs import CONCURRENCY_TAG, CONCURRENCY_TAGS, HEALTH_JOB_NAME, KIND_TAG
from reminder_pipeline.defs.resources import PostgresResource
from reminder_pipeline.defs.schedules import reminder_health_schedule
from reminder_pipeline.observability import health
from reminder_pipeline_tests.support import make_due_event

from . import resources_for

NAMES = ["dispatch_liveness", "no_overdue_reminders", "dispatch_errors", "outbox_backlog", "lateness_slo"]


@pytest.fixture
def instance() -> Iterator[DagsterInstance]:
    """A throwaway persistent instance (schedule contexts refuse ephemeral ones)."""
    with instance_for_test() as instance:
        yield instance


def run_health_checks(instance: DagsterInstance, database_url: str, checks=None) -> dict:
    """Execute the health-check job (or a subset of its checks); the evaluations by check name."""
    job = defs.resolve_job_def(HEALTH_JOB_NAME)
    if checks is not None:
        job = job.get_subset(asset_check_selection={AssetCheckKey(DISPATCH_ASSET_KEY, c) for c in checks})
    result = job.execute_in_process(
        instance=instance, resources={"postgres": PostgresResource(database_url=database_url)}
    )
    assert result.success  # a failing check does not fail the run
    evaluations = result.get_asset_check_evaluations()
    assert all(e.asset_key == DISPATCH_ASSET_KEY for e in evaluations)
    by_name = {e.check_name: e for e in evaluations}
    assert len(by_name) == len(evaluations)  # one evaluation per check
    return by_name


def _values(evaluation) -> dict:
    return {k: v.value for k, v in evaluation.metadata.items()}


def test_the_checks_are_the_health_conditions_one_for_one(engine):
    assert list(CHECKS) == NAMES
    assert [c.name for c in health.evaluate(engine)] == NAMES
    keys = defs.resolve_asset_graph().asset_check_keys
    assert keys == {AssetCheckKey(DISPATCH_ASSET_KEY, n) for n in NAMES}


def test_with_no_dispatch_ever_and_an_overdue_row_liveness_and_overdue_fail(
    engine, database_url, instance
):
    make_due_event(engine, minutes_overdue=10)
    make_due_event(engine, minutes_overdue=1)

    checks = run_health_checks(instance, database_url)

    assert list(checks) == NAMES
    assert {n: c.passed for n, c in checks.items()} == {
        "dispatch_liveness": False, "no_overdue_reminders": False, "dispatch_errors": True,
        "outbox_backlog": True, "lateness_slo": True,
    }
    overdue = checks["no_overdue_reminders"]
    assert overdue.severity is AssetCheckSeverity.ERROR
    assert overdue.description.startswith("1 Pending reminder(s) due more than 300 s ago")
    meta = _values(overdue)
    assert (meta["overdue_count"], meta["backlog"], meta["threshold_seconds"]) == (1, 2, 300.0)
    assert 590 <= meta["oldest_due_age_seconds"] <= 660
    assert meta["runbook"] == "docs/runbooks/reminder-dispatch.md#overdue-pending-reminders"
    live = checks["dispatch_liveness"]
    assert live.description == "No dispatch cycle has ever succeeded."
    assert _values(live)["seconds_since_last_success"] is None
    assert checks["lateness_slo"].severity is AssetCheckSeverity.WARN
    assert _values(checks["outbox_backlog"])["runbook"] == "docs/runbooks/outbox-backlog.md"
    # Recorded on the asset, where the UI shows them.
    key = AssetCheckKey(DISPATCH_ASSET_KEY, "no_overdue_reminders")
    latest = instance.event_log_storage.get_latest_asset_check_execution_by_key([key])
    assert latest[key].evaluation.passed is False


def test_after_a_successful_dispatch_run_every_check_passes_and_late_sends_warn(
    engine, database_url, kafka_settings, instance
):
    from reminder_pipeline.defs.jobs import reminder_dispatch

    def dispatch():
        assert reminder_dispatch.execute_in_process(
            instance=instance, resources=resources_for(database_url, kafka_settings)
        ).success

    make_due_event(engine, minutes_overdue=1)
    dispatch()
    checks = run_health_checks(instance, database_url)
    assert all(c.passed for c in checks.values()), {n: c.description for n, c in checks.items()}
    assert _values(checks["dispatch_liveness"])["seconds_since_last_success"] < 60
    assert _values(checks["lateness_slo"])["sent_in_window"] == 1

    make_due_event(engine, minutes_overdue=10)  # sent 10 minutes late: beyond the 120 s SLO
    dispatch()
    checks = run_health_checks(instance, database_url)
    assert [n for n, c in checks.items() if not c.passed] == ["lateness_slo"]
    assert checks["lateness_slo"].severity is AssetCheckSeverity.WARN
    assert _values(checks["lateness_slo"])["lateness_p95_seconds"] > 120


def test_one_check_can_be_executed_alone_as_from_the_ui(engine, database_url, instance):
    checks = run_health_checks(instance, database_url, checks=["outbox_backlog"])
    assert list(checks) == ["outbox_backlog"]
    assert checks["outbox_backlog"].passed


def test_the_job_is_outside_the_dispatch_concurrency_limit_and_in_process():
    job = defs.resolve_job_def(HEALTH_JOB_NAME)
    assert CONCURRENCY_TAG not in job.tags
    assert job.tags[KIND_TAG] == "health-checks"
    assert int(job.tags["dagster/max_runtime"]) <= 60
    assert job.executor_def.name == "in_process"


# --- the every-minute schedule ----------------------------------------------------------------


def _add_run(instance: DagsterInstance, job_name: str, status: DagsterRunStatus, tags: dict) -> str:
    origin = RemoteRepositoryOrigin(
        RegisteredCodeLocationOrigin("reminder_pipeline"), "__repository__"
    ).get_job_origin(job_name)
    run = DagsterRun(job_name=job_name, status=status, remote_job_origin=origin, tags=tags)
    instance.add_run(run)
    return run.run_id


def _tick(instance: DagsterInstance):
    context = build_schedule_context(
        instance=instance, scheduled_execution_time=datetime(2026, 11, 30, 10, 0, tzinfo=UTC)
    )
    return reminder_health_schedule(context)


def test_the_schedule_runs_every_minute_by_default_even_while_a_dispatch_run_is_in_flight(instance):
    assert reminder_health_schedule.cron_schedule == "* * * * *"
    assert reminder_health_schedule.execution_timezone == "UTC"
    assert reminder_health_schedule.default_status is DefaultScheduleStatus.RUNNING
    assert reminder_health_schedule.job_name == HEALTH_JOB_NAME
    # A hung dispatch run is exactly when liveness must still be evaluated.
    _add_run(instance, "reminder_dispatch", DagsterRunStatus.STARTED, CONCURRENCY_TAGS)
    assert isinstance(_tick(instance), RunRequest)


def test_the_schedule_skips_while_a_health_run_is_in_flight(instance):
    run_id = _add_run(instance, HEALTH_JOB_NAME, DagsterRunStatus.QUEUED, {KIND_TAG: "health-checks"})
    skipped = _tick(instance)
    assert isinstance(skipped, SkipReason)
    assert run_id in skipped.skip_message
