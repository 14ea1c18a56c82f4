"""Re-execution from the UI's point of view: nothing sent twice, nothing lost.

``execute_job`` with ``reconstructable`` and a persistent instance is what the UI's "re-execute
from failure" / "re-execute selected" do: the re-executed steps load the parent run's outputs
through the fs_io_manager.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from dagster import (
    DagsterInstance,
    Definitions,
    EnvVar,
    ReexecutionOptions,
    execute_job,
    instance_for_test,
    reconstructable,
)

from reminder_pipeline.defs.jobs import reminder_dispatch
from reminder_pipeline.defs.resources import KafkaResource, PostgresResource
from reminder_pipeline.local.servers import free_port
from reminder_pipeline_tests.support import make_due_event, outbox_rows, reminders

from .helpers import instance_overrides, materializations, metadata_values


def dispatch_job_with_short_kafka_timeouts():
    """The dispatch job as deployed (resources from the environment), failing fast on a dead broker."""
    return Definitions(
        jobs=[reminder_dispatch],
        resources={
            "postgres": PostgresResource(database_url=EnvVar("DATABASE_URL")),
            "kafka": KafkaResource(
                bootstrap_servers=EnvVar("KAFKA_BOOTSTRAP_SERVERS"),
                topic_timeout_seconds=2,
                message_timeout_ms=3_000,
            ),
        },
    ).get_job_def("reminder_dispatch")


JOB = reconstructable(dispatch_job_with_short_kafka_timeouts)


@pytest.fixture
def instance(tmp_path: Path) -> Iterator[DagsterInstance]:
    """A persistent instance: step outputs are pickled under its storage directory."""
    with instance_for_test(temp_dir=str(tmp_path), overrides=instance_overrides()) as instance:
        yield instance


def _ids(engine, events):
    return [reminders(engine, e)[0]["id"] for e in events]


def _per_reminder(messages) -> Counter:
    return Counter(m.value["ReminderId"] for m in messages)


def test_reexecution_from_a_failed_relay_publishes_each_reminder_once(
    engine, database_url, kafka_settings, kafka_reader, instance, monkeypatch
):
    events = [make_due_event(engine, minutes_overdue=3 - i) for i in range(3)]
    ids = _ids(engine, events)
    monkeypatch.setenv("DATABASE_URL", database_url)
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", f"127.0.0.1:{free_port()}")  # broker down

    with execute_job(JOB, instance=instance) as failed:
        assert not failed.success
        assert failed.get_failed_step_keys() == {"relay_outbox"}
        failure = next(e for e in failed.all_events if e.is_step_failure)
        assert "Kafka publish failed: 3 outbox rows stay unpublished" in (
            failure.step_failure_data.user_failure_data.description
        )
        # The figures were recorded before the step failed: the outage is plain in the asset's plot.
        (recorded,) = materializations(failed.all_events)
        meta = metadata_values(recorded)
        assert (meta["sent_count"], meta["published_count"], meta["publish_failed_count"]) == (
            3,
            0,
            3,
        )
        failed_run_id = failed.run_id
    # The outbox keeps the rows; the reminders are Sent exactly once.
    assert [r["status"] for e in events for r in reminders(engine, e)] == ["Sent"] * 3
    assert [r["published_at"] for r in outbox_rows(engine)] == [None] * 3

    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", kafka_settings.bootstrap_servers)  # broker back
    with execute_job(
        JOB,
        instance=instance,
        reexecution_options=ReexecutionOptions.from_failure(failed_run_id, instance),
    ) as retried:
        assert retried.success
        assert {e.step_key for e in retried.get_step_success_events()} == {"relay_outbox"}
        (recorded,) = materializations(retried.all_events)
        meta = metadata_values(recorded)
        # Only the relay ran here: its sent_count is 0 (the failed run already counted the 3).
        assert (meta["sent_count"], meta["published_count"], meta["reexecuted_relay_only"]) == (
            0,
            3,
            True,
        )

    rows = outbox_rows(engine)
    assert sorted(r["reminder_id"] for r in rows) == sorted(ids)
    assert all(r["published_at"] is not None for r in rows)
    kafka_reader.wait_for(ids)
    kafka_reader.drain()
    assert _per_reminder(kafka_reader.for_reminders(ids)) == Counter({str(i): 1 for i in ids})
    # The message still carries the id of the run that wrote it (the correlation id).
    assert {m.headers["correlation-id"] for m in kafka_reader.for_reminders(ids)} == {failed_run_id}


def test_reexecuting_the_writing_step_of_a_successful_run_writes_nothing_new(
    engine, database_url, kafka_settings, kafka_reader, instance, monkeypatch
):
    events = [make_due_event(engine, minutes_overdue=2), make_due_event(engine, minutes_overdue=1)]
    ids = _ids(engine, events)
    monkeypatch.setenv("DATABASE_URL", database_url)
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", kafka_settings.bootstrap_servers)

    with execute_job(JOB, instance=instance) as first:
        assert first.success
        first_run_id = first.run_id
    before_rows = outbox_rows(engine)
    before_reminders = [reminders(engine, e) for e in events]
    kafka_reader.wait_for(ids)

    # "Re-execute selected" of the writing step alone, then of writing + relay: the old selection
    # is loaded from the first run, re-locked and re-read; its rows are Sent, so nothing moves.
    for steps in (["transition_and_outbox"], ["transition_and_outbox", "relay_outbox"]):
        with execute_job(
            JOB,
            instance=instance,
            reexecution_options=ReexecutionOptions(
                parent_run_id=first_run_id, step_selection=steps
            ),
        ) as again:
            assert again.success
            assert {e.step_key for e in again.get_step_success_events()} == set(steps)
            if "relay_outbox" in steps:
                meta = metadata_values(materializations(again.all_events)[0])
                assert (meta["sent_count"], meta["published_count"]) == (0, 0)

    assert outbox_rows(engine) == before_rows
    assert [reminders(engine, e) for e in events] == before_reminders
    kafka_reader.drain()
    assert _per_reminder(kafka_reader.for_reminders(ids)) == Counter({str(i): 1 for i in ids})


def test_reexecuting_from_a_failed_transition_sends_once(
    engine, database_url, kafka_settings, kafka_reader, instance, monkeypatch
):
    """The writing step fails (the database refuses the transaction); its re-execution sends once."""
    event_id = make_due_event(engine, minutes_overdue=1)
    (reminder_id,) = _ids(engine, [event_id])
    monkeypatch.setenv("DATABASE_URL", database_url)
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", kafka_settings.bootstrap_servers)
    # Make every write transaction on the outbox fail, as an outage mid-cycle would.
    with engine.begin() as conn:
        conn.exec_driver_sql(
            "CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS "
            "$$BEGIN RAISE EXCEPTION 'outbox unavailable' USING ERRCODE = '55000'; END$$"
        )
        conn.exec_driver_sql(
            "CREATE TRIGGER refuse BEFORE INSERT ON outbox FOR EACH STATEMENT EXECUTE FUNCTION refuse()"
        )

    with execute_job(JOB, instance=instance) as failed:
        assert not failed.success
        assert failed.get_failed_step_keys() == {"transition_and_outbox"}
        failed_run_id = failed.run_id
    assert reminders(engine, event_id)[0]["status"] == "Pending"  # rolled back whole
    assert outbox_rows(engine) == []

    with engine.begin() as conn:
        conn.exec_driver_sql("DROP TRIGGER refuse ON outbox")
    with execute_job(
        JOB,
        instance=instance,
        reexecution_options=ReexecutionOptions.from_failure(failed_run_id, instance),
    ) as retried:
        assert retried.success
        assert {e.step_key for e in retried.get_step_success_events()} == {
            "transition_and_outbox",
            "relay_outbox",
        }

    assert reminders(engine, event_id)[0]["status"] == "Sent"
    assert [r["reminder_id"] for r in outbox_rows(engine)] == [reminder_id]
    kafka_reader.wait_for([reminder_id])
    kafka_reader.drain()
    assert _per_reminder(kafka_reader.for_reminders([reminder_id])) == Counter(
        {str(reminder_id): 1}
    )
