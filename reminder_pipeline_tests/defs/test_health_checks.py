"""The seed's alerts as asset checks on the dispatcher: recorded by each dispatch run with its
materialization, every minute from ``reminder_health_sensor`` (no run), on demand from
``reminder_health_checks``; no dispatch run needed for the last two.

Both run against the real database; each check's verdict, severity and figures are read back from
the ``AssetCheckEvaluation`` events.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from dagster import (
    AssetCheckEvaluation,
    AssetCheckKey,
    AssetCheckSeverity,
    DagsterEventType,
    DagsterInstance,
    DefaultSensorStatus,
    SensorResult,
    UrlMetadataValue,
    build_sensor_context,
    instance_for_test,
)

from reminder_pipeline.definitions import defs
from reminder_pipeline.defs.assets import DISPATCH_ASSET_KEY
from reminder_pipeline.defs.jobs import CONCURRENCY_TAG, HEALTH_JOB_NAME, KIND_TAG
from reminder_pipeline.defs.resources import PostgresResource
from reminder_pipeline.defs.sensors import reminder_health_sensor
from reminder_pipeline.local.servers import free_port
from reminder_pipeline.observability import health
from reminder_pipeline.observability.health import ASSERTIONS
from reminder_pipeline_tests.support import make_due_event

from .helpers import resources_for

NAMES = [
    "dispatch_liveness",
    "no_overdue_reminders",
    "dispatch_errors",
    "outbox_backlog",
    "lateness_slo",
    "clock_skew",
    "coming_peak",
    "vacuum_horizon",
]


@pytest.fixture
def instance() -> Iterator[DagsterInstance]:
    """A throwaway persistent instance (schedule contexts refuse ephemeral ones)."""
    with instance_for_test() as instance:
        yield instance


def run_health_checks(instance: DagsterInstance, database_url: str, checks=None) -> dict:
    """Execute the health-check job (or a subset of its checks); the evaluations by check name."""
    job = defs.resolve_job_def(HEALTH_JOB_NAME)
    if checks is not None:
        job = job.get_subset(
            asset_check_selection={AssetCheckKey(DISPATCH_ASSET_KEY, c) for c in checks}
        )
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
    assert list(ASSERTIONS) == NAMES
    assert [c.name for c in health.evaluate(engine)] == NAMES
    keys = defs.resolve_asset_graph().asset_check_keys
    assert keys == {AssetCheckKey(DISPATCH_ASSET_KEY, n) for n in NAMES}


def test_with_no_dispatch_ever_and_an_overdue_row_liveness_and_overdue_fail(
    engine, database_url, instance, monkeypatch
):
    monkeypatch.setenv("REMINDER_DOCS_BASE_URL", "https://docs.example.test/reminders/docs")
    make_due_event(engine, minutes_overdue=10)
    make_due_event(engine, minutes_overdue=1)

    checks = run_health_checks(instance, database_url)

    assert list(checks) == NAMES
    assert {n: c.passed for n, c in checks.items()} == {
        "dispatch_liveness": False,
        "no_overdue_reminders": False,
        "dispatch_errors": True,
        "outbox_backlog": True,
        "lateness_slo": True,
        "clock_skew": True,
        "coming_peak": True,
        "vacuum_horizon": True,
    }
    overdue = checks["no_overdue_reminders"]
    assert overdue.severity is AssetCheckSeverity.ERROR
    assert overdue.description.startswith("1 Pending reminder(s) due more than 300 s ago")
    meta = _values(overdue)
    assert (meta["overdue_count"], meta["backlog"], meta["threshold_seconds"]) == (1, 2, 300.0)
    assert 590 <= meta["oldest_due_age_seconds"] <= 660
    assert meta["runbook"] == (  # a link (issue 35: clickable, under the docs base URL)
        "https://docs.example.test/reminders/docs/runbooks/reminder-dispatch.md"
        "#overdue-pending-reminders"
    )
    assert isinstance(overdue.metadata["runbook"], UrlMetadataValue)
    live = checks["dispatch_liveness"]
    assert live.description == "No dispatch cycle has ever succeeded."
    assert _values(live)["seconds_since_last_success"] is None
    assert checks["lateness_slo"].severity is AssetCheckSeverity.WARN
    assert _values(checks["outbox_backlog"])["runbook"] == (
        "https://docs.example.test/reminders/docs/runbooks/outbox-backlog.md"
    )
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


def test_a_dispatch_run_records_every_check_of_the_asset_with_its_materialization(
    engine, database_url, kafka_settings, instance
):
    """What keeps the UI from showing a check "Not evaluated" after each scheduled run: every
    check declared on the asset (whichever module declares it) is logged by the materializing run
    (Dagster's ``targets_latest_materialization``: same run), just before its materialization."""
    from reminder_pipeline.defs.jobs import reminder_dispatch

    make_due_event(engine, minutes_overdue=1)
    result = reminder_dispatch.execute_in_process(
        instance=instance, resources=resources_for(database_url, kafka_settings)
    )
    assert result.success
    declared = {
        key.name
        for key in defs.resolve_asset_graph().asset_check_keys
        if key.asset_key == DISPATCH_ASSET_KEY
    }
    by_name = {e.check_name: e for e in result.get_asset_check_evaluations()}
    assert set(by_name) == declared
    assert all(e.passed for e in by_name.values()), {n: e.description for n, e in by_name.items()}
    materialization = instance.get_latest_materialization_event(DISPATCH_ASSET_KEY)
    assert materialization is not None and materialization.run_id == result.run_id
    records = instance.get_records_for_run(result.run_id).records
    order = [
        (r.event_log_entry.dagster_event_type, r.storage_id)
        for r in records
        if r.event_log_entry.dagster_event is not None
    ]
    materialized_at = next(i for t, i in order if t is DagsterEventType.ASSET_MATERIALIZATION)
    checked_at = [i for t, i in order if t is DagsterEventType.ASSET_CHECK_EVALUATION]
    assert len(checked_at) == len(declared) and max(checked_at) < materialized_at
    for name in declared:
        [latest] = instance.event_log_storage.get_asset_check_execution_history(
            AssetCheckKey(DISPATCH_ASSET_KEY, name), limit=1
        )
        assert latest.run_id == result.run_id and latest.evaluation is not None


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


# --- the every-minute sensor -----------------------------------------------------------------


def test_the_sensor_evaluates_every_check_each_minute_without_a_run(engine, database_url, instance):
    assert reminder_health_sensor.minimum_interval_seconds == 60
    assert reminder_health_sensor.default_status is DefaultSensorStatus.RUNNING
    make_due_event(
        engine, minutes_overdue=30
    )  # overdue: the overdue check fails, the others do not
    with build_sensor_context(
        instance=instance, resources={"postgres": PostgresResource(database_url=database_url)}
    ) as context:
        result = reminder_health_sensor(context)
    assert isinstance(result, SensorResult)
    assert not result.run_requests  # a verdict, not a run
    by_name = {e.check_name: e for e in result.asset_events}
    assert list(by_name) == NAMES
    assert all(
        isinstance(e, AssetCheckEvaluation) and e.asset_key == DISPATCH_ASSET_KEY
        for e in result.asset_events
    )
    assert not by_name["no_overdue_reminders"].passed
    assert by_name["no_overdue_reminders"].severity is AssetCheckSeverity.ERROR
    assert by_name["outbox_backlog"].passed
    assert "no_overdue_reminders" in result.skip_reason.skip_message

    # What the daemon does with them: runless evaluations, the checks' latest verdicts in the UI.
    for evaluation in result.asset_events:
        instance.report_runless_asset_event(evaluation)
    key = AssetCheckKey(DISPATCH_ASSET_KEY, "no_overdue_reminders")
    [record] = instance.event_log_storage.get_asset_check_execution_history(key, limit=1)
    assert record.evaluation.passed is False


def test_the_sensor_tick_fails_when_the_database_is_unreachable(instance):
    port = free_port()  # nothing listens there
    url = f"postgresql+psycopg://u@127.0.0.1:{port}/x"
    with pytest.raises(Exception) as info:
        with build_sensor_context(
            instance=instance, resources={"postgres": PostgresResource(database_url=url)}
        ) as context:
            reminder_health_sensor(context)
    causes, error = [], info.value
    while error is not None:
        causes.append(error)
        error = error.__cause__
    # The resource refuses to start with a one-line Failure naming the setting (see resources.py).
    assert any("DATABASE_URL" in str(c) and "refused" in str(c) for c in causes), causes
