"""Limits that hold: a run launched with an overridden limit tag sends nothing.

Dagster lets tags given at launch override a job's own; a dispatch, catch-up or re-publish run
launched with another ``reminder_pipeline/concurrency`` value (escaping the one-at-a-time limit)
or another ``dagster/max_runtime`` must fail before it acts, on the real database and broker:
the reminder stays Pending, no outbox row is written, nothing is re-published.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from dagster import DagsterInstance, instance_for_test

from reminder_pipeline.defs.jobs import reminder_catch_up, reminder_dispatch
from reminder_pipeline.defs.limits import CONCURRENCY_TAG, MAX_RUNTIME_TAG
from reminder_pipeline.defs.republish import reminder_republish
from reminder_pipeline_tests.support import make_due_event, outbox_rows, reminders, utcnow

from .helpers import instance_overrides, log_messages, materializations, resources_for


@pytest.fixture
def instance() -> Iterator[DagsterInstance]:
    """A throwaway instance with the shipped python_logs settings."""
    with instance_for_test(overrides=instance_overrides()) as instance:
        yield instance


def _failure(result) -> str:
    [failure] = [e for e in result.all_events if e.is_step_failure]
    return failure.step_failure_data.error.message


@pytest.mark.parametrize(
    ("job", "override"),
    [
        (reminder_dispatch, {CONCURRENCY_TAG: "mine"}),
        (reminder_catch_up, {MAX_RUNTIME_TAG: "86400"}),
    ],
    ids=["dispatch-concurrency", "catch_up-max_runtime"],
)
def test_a_cycle_run_with_an_overridden_limit_tag_does_not_dispatch(
    job, override, engine, database_url, kafka_settings, instance
):
    event_id = make_due_event(engine)
    result = job.execute_in_process(
        instance=instance,
        resources=resources_for(database_url, kafka_settings),
        tags=override,
        raise_on_error=False,
    )
    assert not result.success
    [key] = override
    assert f"run tag {key}=" in _failure(result) and "\n" not in _failure(result).strip()
    assert reminders(engine, event_id)[0]["status"] == "Pending"
    assert outbox_rows(engine) == []


def test_a_republish_run_with_an_overridden_concurrency_tag_does_not_republish(
    database_url, kafka_settings, instance
):
    day = (utcnow().date()).isoformat()
    instance.add_dynamic_partitions(reminder_republish.partitions_def.name, [day])
    result = reminder_republish.execute_in_process(
        instance=instance,
        resources=resources_for(database_url, kafka_settings),
        partition_key=day,
        tags={CONCURRENCY_TAG: "dispatch"},
        raise_on_error=False,
    )
    assert not result.success
    assert f"run tag {CONCURRENCY_TAG}='dispatch'" in _failure(result)
    assert materializations(result.all_events) == []
    assert not [m for m in log_messages(instance, result.run_id) if "republish completed" in m]


def test_a_run_with_the_jobs_own_tags_dispatches(engine, database_url, kafka_settings, instance):
    event_id = make_due_event(engine)
    result = reminder_dispatch.execute_in_process(
        instance=instance,
        resources=resources_for(database_url, kafka_settings),
        tags={CONCURRENCY_TAG: "dispatch", "user": "operator@example.com"},
    )
    assert result.success
    assert reminders(engine, event_id)[0]["status"] == "Sent"
