"""The operator jobs launched from the UI: ``reminder_poison_rows`` (list / retry / skip) and ``outbox_retention``.

Both run on the real database; the poison row is a real one (a kind the contract refuses makes its
payload impossible to build), the outbox rows are written by real cycles.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest
from dagster import (
    DagsterInstance,
    DagsterInvalidConfigError,
    DefaultScheduleStatus,
    instance_for_test,
)

from reminder_pipeline import cycle
from reminder_pipeline.defs.jobs import (
    CONCURRENCY_TAG,
    POISON_JOB_NAME,
    RETENTION_JOB_NAME,
    outbox_retention,
    reminder_poison_rows,
)
from reminder_pipeline.defs.resources import PostgresResource
from reminder_pipeline.defs.schedules import outbox_retention_schedule
from reminder_pipeline_tests.support import (
    PII_DESCRIPTION,
    PII_LOCATION,
    PII_TITLE,
    POISON_KIND,
    make_due_event,
    outbox_rows,
    reminders,
)

from .helpers import instance_overrides, log_messages


@pytest.fixture
def instance() -> Iterator[DagsterInstance]:
    """A throwaway instance with the shipped python_logs settings."""
    with instance_for_test(overrides=instance_overrides()) as instance:
        yield instance


def _resources(database_url: str) -> dict:
    return {"postgres": PostgresResource(database_url=database_url)}


def _output_metadata(result, node: str) -> dict:
    [output] = [e for e in result.all_events if e.is_successful_output and e.step_key == node]
    return {k: v.value for k, v in output.event_specific_data.metadata.items()}


# --- poison rows -----------------------------------------------------------------------------


@pytest.fixture
def poison(engine, publisher) -> dict:
    """A real poison row: its event's kind breaks the contract, so its message cannot be built."""
    event_id = make_due_event(engine, minutes_overdue=1, kind=POISON_KIND)
    healthy = make_due_event(engine, minutes_overdue=2)
    report = cycle.run_cycle(engine, publisher)
    assert (report.counts.failed, report.counts.sent) == (1, 1)
    [row] = reminders(engine, event_id)
    assert (
        row["status"] == "Pending" and row["attempts"] == 1 and row["next_attempt_at"] is not None
    )
    assert reminders(engine, healthy)[0]["status"] == "Sent"
    return row


def test_list_shows_the_poison_rows_with_their_last_error_and_ids_only(
    database_url, instance, poison
):
    result = reminder_poison_rows.execute_in_process(
        instance=instance, resources=_resources(database_url)
    )  # action defaults to list

    assert result.success
    [row] = result.output_for_node("poison_rows")
    assert row["id"] == str(poison["id"])
    assert row["attempts"] == 1 and "Kind" in row["last_error"]
    assert row["next_attempt_at"] and row["due_at"]
    meta = _output_metadata(result, "poison_rows")
    assert meta["action"] == "list" and meta["poison_count"] == 1
    assert str(poison["id"]) in meta["poison_rows"] and "Kind" in meta["poison_rows"]
    lines = log_messages(instance, result.run_id)
    assert any("poison rows listed" in line and "count=1" in line for line in lines)
    shown = repr(row) + repr(meta) + "\n".join(lines)
    assert not any(pii in shown for pii in (PII_TITLE, PII_DESCRIPTION, PII_LOCATION))


def test_retry_clears_the_back_off_and_skip_ends_the_row_each_logged(
    engine, database_url, instance, poison
):
    reminder_id = str(poison["id"])

    retried = reminder_poison_rows.execute_in_process(
        run_config={"action": "retry", "reminder_id": reminder_id},
        instance=instance,
        resources=_resources(database_url),
    )
    assert retried.success
    assert retried.output_for_node("poison_rows") == {
        "action": "retry",
        "reminder_id": reminder_id,
        "changed": True,
    }
    [row] = reminders(engine, poison["calendar_event_id"])
    assert row["status"] == "Pending" and row["next_attempt_at"] is None
    lines = log_messages(instance, retried.run_id)
    assert any(
        "poison row retry" in line
        and f"reminder_id={reminder_id}" in line
        and f"run_id={retried.run_id}" in line
        and "changed=True" in line
        for line in lines
    ), lines

    skipped = reminder_poison_rows.execute_in_process(
        run_config={"action": "skip", "reminder_id": reminder_id.upper()},  # any UUID spelling
        instance=instance,
        resources=_resources(database_url),
    )
    assert skipped.success
    assert _output_metadata(skipped, "poison_rows") == {
        "action": "skip",
        "reminder_id": reminder_id,
        "changed": True,
    }
    assert reminders(engine, poison["calendar_event_id"])[0]["status"] == "Skipped"
    assert all(r["reminder_id"] != poison["id"] for r in outbox_rows(engine))  # never published
    assert any(
        "poison row skip" in line and "changed=True" in line
        for line in log_messages(instance, skipped.run_id)
    )

    # No longer Pending: nothing changes, and the run says so (like the CLI's exit code 1).
    again = reminder_poison_rows.execute_in_process(
        run_config={"action": "skip", "reminder_id": reminder_id},
        instance=instance,
        resources=_resources(database_url),
        raise_on_error=False,
    )
    assert not again.success
    failure = next(e for e in again.all_events if e.is_step_failure)
    assert failure.step_failure_data.user_failure_data.description == (
        f"poison skip: reminder {reminder_id}: nothing changed: it is Skipped, not Pending"
    )
    assert any(
        "poison row skip" in line and "changed=False" in line
        for line in log_messages(instance, again.run_id)
    )
    assert reminders(engine, poison["calendar_event_id"])[0]["status"] == "Skipped"


@pytest.mark.parametrize(
    ("run_config", "message"),
    [
        (
            {"action": "retry", "reminder_id": "not-a-uuid"},
            "reminder_id 'not-a-uuid' is not a UUID",
        ),
        ({"action": "skip", "reminder_id": "1234"}, "reminder_id '1234' is not a UUID"),
        (
            {"action": "skip"},
            "skip needs reminder_id or a filter (all, event_id, kind, failed_since)",
        ),
        (
            {"action": "retry", "reminder_id": " "},
            "retry needs reminder_id or a filter (all, event_id, kind, failed_since)",
        ),
        ({"limit": 0}, "limit=0 is out of range [1, 1000]"),
    ],
)
def test_a_bad_poison_config_is_refused_in_one_line_before_any_run(
    database_url, instance, run_config, message
):
    with pytest.raises(DagsterInvalidConfigError) as refused:
        reminder_poison_rows.execute_in_process(
            run_config=run_config, instance=instance, resources=_resources(database_url)
        )
    text = str(refused.value)
    assert text == f"{POISON_JOB_NAME} run config refused: {message}"
    assert instance.get_runs() == []


def test_an_unknown_action_is_refused_by_the_schema(database_url, instance):
    with pytest.raises(DagsterInvalidConfigError, match="not in enum"):
        reminder_poison_rows.execute_in_process(
            run_config={"action": "delete"}, instance=instance, resources=_resources(database_url)
        )


# --- outbox retention ------------------------------------------------------------------------


def _age_published(engine, reminder_ids, hours: float) -> None:
    with engine.begin() as conn:
        conn.exec_driver_sql(
            "UPDATE outbox SET published_at = now() - make_interval(hours => %(h)s) "
            "WHERE reminder_id = ANY(%(ids)s)",
            {"h": hours, "ids": list(reminder_ids)},
        )


def _age_unpublished(engine, hours: float) -> None:
    with engine.begin() as conn:
        conn.exec_driver_sql(
            "UPDATE outbox SET created_at = now() - make_interval(hours => %(h)s) "
            "WHERE published_at IS NULL",
            {"h": hours},
        )


def test_retention_deletes_only_old_published_rows_never_unpublished_ones(
    engine, database_url, publisher, instance
):
    published = [make_due_event(engine, minutes_overdue=1 + i) for i in range(4)]
    cycle.run_cycle(engine, publisher)
    unpublished = make_due_event(engine, minutes_overdue=1)
    cycle.run_cycle(engine, None)  # written to the outbox, never published (the broker "down")
    ids = [reminders(engine, e)[0]["id"] for e in published]
    _age_published(engine, ids[:3], hours=200)  # older than the default 168 h
    _age_unpublished(engine, hours=500)  # very old, but still the relay's work
    [waiting] = [r for r in outbox_rows(engine) if r["published_at"] is None]

    result = outbox_retention.execute_in_process(
        run_config={"batch_size": 2},  # two DELETE transactions
        instance=instance,
        resources=_resources(database_url),
    )

    assert result.success
    assert result.output_for_node("purge_outbox") == 3
    meta = _output_metadata(result, "purge_outbox")
    assert (meta["deleted_count"], meta["retention_hours"], meta["batch_size"]) == (3, 168.0, 2)
    left = outbox_rows(engine)
    assert sorted(r["reminder_id"] for r in left) == sorted([ids[3], waiting["reminder_id"]])
    assert reminders(engine, unpublished)[0]["id"] == waiting["reminder_id"]
    # A shorter retention takes the recent published row too, and still not the unpublished one.
    _age_published(engine, [ids[3]], hours=2)
    shorter = outbox_retention.execute_in_process(
        run_config={"retention_hours": 1},
        instance=instance,
        resources=_resources(database_url),
    )
    assert shorter.output_for_node("purge_outbox") == 1
    assert [r["reminder_id"] for r in outbox_rows(engine)] == [waiting["reminder_id"]]


@pytest.mark.parametrize(
    ("run_config", "message"),
    [
        ({"retention_hours": 0}, "retention_hours=0 is out of range [1, 8784]"),
        ({"batch_size": 0}, "batch_size=0 is out of range [1, 10000]"),
        ({"batch_size": 100_000}, "batch_size=100000 is out of range [1, 10000]"),
    ],
)
def test_a_bad_retention_config_is_refused_in_one_line(database_url, instance, run_config, message):
    with pytest.raises(DagsterInvalidConfigError) as refused:
        outbox_retention.execute_in_process(
            run_config=run_config, instance=instance, resources=_resources(database_url)
        )
    assert str(refused.value) == f"{RETENTION_JOB_NAME} run config refused: {message}"


def test_retention_runs_daily_by_default_and_neither_job_waits_for_dispatch():
    assert outbox_retention_schedule.cron_schedule == "17 3 * * *"
    assert outbox_retention_schedule.execution_timezone == "UTC"
    assert outbox_retention_schedule.default_status is DefaultScheduleStatus.RUNNING
    assert outbox_retention_schedule.job_name == RETENTION_JOB_NAME
    for job in (outbox_retention, reminder_poison_rows):
        assert CONCURRENCY_TAG not in job.tags
        assert job.executor_def.name == "in_process"
    assert timedelta(hours=168) == timedelta(days=7)  # the documented default is the seed's week


def test_the_job_touches_a_row_that_never_failed_only_when_forced(engine, database_url, instance):
    """The same rule as ``reminder-pipeline poison skip`` (one implementation: poison.py)."""
    event_id = make_due_event(engine, minutes_overdue=1)  # Pending, never failed: not poison
    [row] = reminders(engine, event_id)
    refused = reminder_poison_rows.execute_in_process(
        run_config={"action": "skip", "reminder_id": str(row["id"])},
        instance=instance,
        resources=_resources(database_url),
        raise_on_error=False,
    )
    assert not refused.success
    failure = next(e for e in refused.all_events if e.is_step_failure)
    assert (
        "it has not failed (attempts=0)" in failure.step_failure_data.user_failure_data.description
    )
    assert reminders(engine, event_id)[0]["status"] == "Pending"
    forced = reminder_poison_rows.execute_in_process(
        run_config={"action": "skip", "reminder_id": str(row["id"]), "force": True},
        instance=instance,
        resources=_resources(database_url),
    )
    assert forced.success and reminders(engine, event_id)[0]["status"] == "Skipped"
    assert any(
        "poison row skip" in line and "forced=True" in line and "operator=" in line
        for line in log_messages(instance, forced.run_id)
    )
