"""``reminder_dispatch_schedule``: every minute, UTC, on by default, skipping while a cycle is in flight."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from dagster import (
    DagsterInstance,
    DagsterRunStatus,
    DefaultScheduleStatus,
    RunRequest,
    SkipReason,
    build_schedule_context,
    instance_for_test,
)
from dagster._core.remote_origin import RegisteredCodeLocationOrigin, RemoteRepositoryOrigin
from dagster._core.storage.dagster_run import DagsterRun

from reminder_pipeline.config import ConfigError
from reminder_pipeline.defs.jobs import CONCURRENCY_TAGS
from reminder_pipeline.defs.schedules import reminder_dispatch_schedule


@pytest.fixture(scope="module")
def module_instance() -> Iterator[DagsterInstance]:
    """A throwaway persistent instance (schedule contexts refuse ephemeral ones)."""
    with instance_for_test() as instance:
        yield instance


@pytest.fixture
def instance(module_instance: DagsterInstance) -> DagsterInstance:
    """The module's instance with no runs."""
    module_instance.wipe()
    return module_instance


def _tick(instance: DagsterInstance):
    context = build_schedule_context(
        instance=instance, scheduled_execution_time=datetime(2026, 11, 30, 10, 0, tzinfo=UTC)
    )
    return reminder_dispatch_schedule(context)


def _add_run(instance: DagsterInstance, job_name: str, status: DagsterRunStatus, tags=None) -> str:
    # A queued run must say where its code lives (the daemon launches it from there).
    origin = RemoteRepositoryOrigin(
        RegisteredCodeLocationOrigin("reminder_pipeline"), "__repository__"
    ).get_job_origin(job_name)
    run = DagsterRun(
        job_name=job_name,
        status=status,
        remote_job_origin=origin,
        tags=tags if tags is not None else CONCURRENCY_TAGS,
    )
    instance.add_run(run)
    return run.run_id


def test_the_schedule_is_every_minute_in_utc_and_running_by_default():
    assert reminder_dispatch_schedule.cron_schedule == "* * * * *"
    assert reminder_dispatch_schedule.execution_timezone == "UTC"
    assert reminder_dispatch_schedule.default_status is DefaultScheduleStatus.RUNNING
    assert reminder_dispatch_schedule.job_name == "reminder_dispatch"


def test_a_run_is_requested_when_nothing_is_in_flight(instance):
    _add_run(instance, "reminder_dispatch", DagsterRunStatus.SUCCESS)
    _add_run(instance, "reminder_dispatch", DagsterRunStatus.FAILURE)
    _add_run(instance, "some_other_job", DagsterRunStatus.STARTED, tags={})

    result = _tick(instance)

    assert isinstance(result, RunRequest)


@pytest.mark.parametrize(
    "status",
    [
        DagsterRunStatus.QUEUED,
        DagsterRunStatus.NOT_STARTED,
        DagsterRunStatus.STARTING,
        DagsterRunStatus.STARTED,
        DagsterRunStatus.CANCELING,
    ],
)
def test_the_tick_is_skipped_naming_the_run_in_flight(instance, status):
    _add_run(instance, "reminder_dispatch", DagsterRunStatus.SUCCESS)
    run_id = _add_run(instance, "reminder_dispatch", status)

    result = _tick(instance)

    assert isinstance(result, SkipReason)
    assert run_id in result.skip_message
    assert status.value in result.skip_message


def test_a_catch_up_run_in_flight_also_skips_the_tick(instance):
    run_id = _add_run(instance, "reminder_catch_up", DagsterRunStatus.STARTED)

    result = _tick(instance)

    assert isinstance(result, SkipReason)
    assert f"run {run_id} of reminder_catch_up is still STARTED" in result.skip_message


def test_the_operator_restores_the_one_batch_cycle_with_one_setting(instance, monkeypatch):
    assert _tick(instance).run_config == {}  # the default: drain what is due within the budget
    monkeypatch.setenv("REMINDER_DISPATCH_MAX_BATCHES", "1")
    assert _tick(instance).run_config == {"max_batches": 1}
    monkeypatch.setenv("REMINDER_DISPATCH_MAX_BATCHES", "0")
    with pytest.raises(ConfigError, match=r"^REMINDER_DISPATCH_MAX_BATCHES=0 is out of range"):
        _tick(instance)
