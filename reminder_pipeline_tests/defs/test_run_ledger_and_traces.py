"""Dagster runs feed the metrics ledger and the traces, like CLI cycles do.

A successful run writes a succeeded ledger row (what the exporter and ``dispatch_liveness``
read) and its outbox rows carry the cycle span's ``traceparent``; a run whose publishing failed
(broker down) records a dispatched cycle with its publish failures, and the run fails plainly; a
run failing earlier is recorded by the run-failure sensor, once; a relay-only re-execution
counts only what it published.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from dagster import (
    DagsterInstance,
    DefaultSensorStatus,
    Definitions,
    EnvVar,
    ReexecutionOptions,
    build_run_status_sensor_context,
    execute_job,
    instance_for_test,
    reconstructable,
)

from reminder_pipeline.defs.jobs import reminder_catch_up, reminder_dispatch
from reminder_pipeline.defs.resources import KafkaResource, PostgresResource
from reminder_pipeline.defs.sensors import reminder_dispatch_failure_ledger
from reminder_pipeline.local.servers import free_port
from reminder_pipeline.observability import health, tracing
from reminder_pipeline.store.tables import dispatch_cycles
from reminder_pipeline_tests.observability.helpers import captured_spans
from reminder_pipeline_tests.support import make_due_event, outbox_rows, reminders

from .helpers import instance_overrides, resources_for

SHORT_KAFKA = {"topic_timeout_seconds": 2, "message_timeout_ms": 3_000}


@pytest.fixture
def instance() -> Iterator[DagsterInstance]:
    """A throwaway instance with the shipped python_logs settings."""
    with instance_for_test(overrides=instance_overrides()) as instance:
        yield instance


def ledger_rows(engine) -> list[dict]:
    """The ledger's per-cycle rows, oldest first."""
    with engine.connect() as conn:
        return [dict(r._mapping) for r in conn.execute(sa.select(dispatch_cycles).order_by("id"))]


def run_failure_sensor_on(result, instance: DagsterInstance, database_url: str) -> None:
    """What the daemon does when the run has failed: the sensor on that run's failure event."""
    with build_run_status_sensor_context(
        sensor_name=reminder_dispatch_failure_ledger.name,
        dagster_event=result.get_run_failure_event(),
        dagster_instance=instance,
        dagster_run=result.dagster_run,
        resources={"postgres": PostgresResource(database_url=database_url)},
    ) as context:
        reminder_dispatch_failure_ledger(context)


def _refuse_outbox_writes(engine) -> None:
    with engine.begin() as conn:
        conn.exec_driver_sql(
            "CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS "
            "$$BEGIN RAISE EXCEPTION 'outbox unavailable' USING ERRCODE = '55000'; END$$"
        )
        conn.exec_driver_sql(
            "CREATE TRIGGER refuse BEFORE INSERT ON outbox FOR EACH STATEMENT EXECUTE FUNCTION refuse()"
        )


def test_a_successful_run_records_a_succeeded_cycle_and_its_messages_carry_the_trace(
    engine, database_url, kafka_settings, kafka_reader, instance
):
    sent = [make_due_event(engine, minutes_overdue=2 + i) for i in range(2)]
    make_due_event(engine, minutes_overdue=1, status="Cancelled")

    with captured_spans() as spans:
        result = reminder_dispatch.execute_in_process(
            instance=instance, resources=resources_for(database_url, kafka_settings)
        )
    assert result.success

    [row] = ledger_rows(engine)
    assert row["run_id"] == result.run_id
    assert row["succeeded"] is True and row["error_kind"] is None
    assert (row["sent"], row["skipped"], row["published"], row["batches"]) == (2, 1, 2, 1)
    assert row["lateness_count"] == 2 and row["as_of"] is not None
    assert 0 < row["duration_seconds"] < 30
    assert health.liveness(engine, row["finished_at"]).passed  # what the check and exporter read

    [span] = [s for s in spans.get_finished_spans() if s.name == tracing.CYCLE_SPAN]
    assert span.attributes[tracing.ATTR_CORRELATION_ID] == result.run_id
    assert span.attributes["reminder_dispatch.sent"] == 2
    assert {e.name for e in span.events} == {"reminder sent", "reminder skipped"}
    trace_id = format(span.context.trace_id, "032x")
    stored = outbox_rows(engine)
    assert len(stored) == 2
    assert {r["headers"]["traceparent"].split("-")[1] for r in stored} == {trace_id}
    ids = [reminders(engine, e)[0]["id"] for e in sent]
    assert {m.headers["traceparent"].split("-")[1] for m in kafka_reader.wait_for(ids)} == {
        trace_id
    }


def test_a_catch_up_run_is_one_cycle_in_the_ledger(engine, database_url, kafka_settings, instance):
    for i in range(5):
        make_due_event(engine, minutes_overdue=30 - i)

    result = reminder_catch_up.execute_in_process(
        run_config={"batch_size": 2},
        instance=instance,
        resources=resources_for(database_url, kafka_settings),
    )

    assert result.success
    [row] = ledger_rows(engine)
    assert (row["run_id"], row["succeeded"], row["sent"], row["batches"]) == (
        result.run_id,
        True,
        5,
        3,
    )


def test_a_broker_outage_records_a_dispatched_cycle_with_its_publish_failures_once(
    engine, database_url, instance
):
    """Two signals: the rows were dispatched (liveness holds), publishing failed (plainly)."""
    for i in range(3):
        make_due_event(engine, minutes_overdue=1 + i)
    dead_broker = f"127.0.0.1:{free_port()}"

    result = reminder_dispatch.execute_in_process(
        instance=instance,
        resources=resources_for(database_url, dead_broker, **SHORT_KAFKA),
        raise_on_error=False,
    )

    assert not result.success  # the run shows the publish failure plainly
    [row] = ledger_rows(engine)
    assert row["run_id"] == result.run_id
    assert row["succeeded"] is True and row["error_kind"] is None
    assert (row["sent"], row["published"], row["publish_failed"]) == (3, 0, 3)
    assert health.liveness(engine, row["finished_at"]).passed
    assert not health.outbox_backlog(engine, row["finished_at"]).passed or (
        health.outbox_backlog(engine, row["finished_at"]).metadata["unpublished"] == 3
    )
    # The relay recorded it: the failure sensor adds nothing.
    run_failure_sensor_on(result, instance, database_url)
    assert len(ledger_rows(engine)) == 1


def test_a_run_failing_before_the_relay_is_recorded_by_the_failure_sensor(
    engine, database_url, kafka_settings, instance
):
    event_id = make_due_event(engine, minutes_overdue=1)
    _refuse_outbox_writes(engine)

    result = reminder_dispatch.execute_in_process(
        instance=instance,
        resources=resources_for(database_url, kafka_settings),
        raise_on_error=False,
    )

    assert not result.success
    assert reminders(engine, event_id)[0]["status"] == "Pending"
    assert ledger_rows(engine) == []  # the steps that failed record nothing themselves
    run_failure_sensor_on(result, instance, database_url)
    [row] = ledger_rows(engine)
    assert row["run_id"] == result.run_id
    assert row["succeeded"] is False
    assert row["error_kind"] == "OperationalError"  # the exception class, never its message
    assert (row["sent"], row["published"]) == (0, 0)
    assert health.errors(engine, row["finished_at"]).metadata["failed_cycles"] == 1


def test_a_run_whose_resources_cannot_start_is_recorded_too(
    engine, database_url, instance, monkeypatch
):
    # No step runs (op failure hooks would never fire): the sensor still sees the run fail.
    monkeypatch.setenv("KAFKA_SECURITY_PROTOCOL", "QUANTUM")  # a bad setting: one-line Failure
    result = reminder_dispatch.execute_in_process(
        instance=instance,
        resources={
            "postgres": PostgresResource(database_url=database_url),
            "kafka": KafkaResource(bootstrap_servers="127.0.0.1:9"),
        },
        raise_on_error=False,
    )

    assert not result.success
    run_failure_sensor_on(result, instance, database_url)
    [row] = ledger_rows(engine)
    assert row["run_id"] == result.run_id and row["succeeded"] is False
    assert row["error_kind"] == "Failure"  # what KafkaResource raised for the bad setting


def test_the_sensor_watches_both_dispatch_jobs_and_is_on_by_default():
    assert reminder_dispatch_failure_ledger.default_status is DefaultSensorStatus.RUNNING
    # No public accessor; a wrong job here would silently record nothing.
    monitored = {j.name for j in reminder_dispatch_failure_ledger._monitored_jobs}
    assert monitored == {"reminder_dispatch", "reminder_catch_up"}


# --- re-execution: each run counts what it did ----------------------------------------------------


def dispatch_job_with_short_kafka_timeouts():
    """The dispatch job as deployed (resources from the environment), failing fast on a dead broker."""
    return Definitions(
        jobs=[reminder_dispatch],
        resources={
            "postgres": PostgresResource(database_url=EnvVar("DATABASE_URL")),
            "kafka": KafkaResource(
                bootstrap_servers=EnvVar("KAFKA_BOOTSTRAP_SERVERS"), **SHORT_KAFKA
            ),
        },
    ).get_job_def("reminder_dispatch")


JOB = reconstructable(dispatch_job_with_short_kafka_timeouts)


def test_a_relay_only_reexecution_counts_what_it_published_not_the_sends_again(
    engine, database_url, kafka_settings, tmp_path: Path, monkeypatch
):
    for i in range(3):
        make_due_event(engine, minutes_overdue=1 + i)
    monkeypatch.setenv("DATABASE_URL", database_url)
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", f"127.0.0.1:{free_port()}")  # broker down

    with instance_for_test(temp_dir=str(tmp_path), overrides=instance_overrides()) as instance:
        with execute_job(JOB, instance=instance) as failed:
            assert failed.get_failed_step_keys() == {"relay_outbox"}
            failed_run_id = failed.run_id
        monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", kafka_settings.bootstrap_servers)
        with execute_job(
            JOB,
            instance=instance,
            reexecution_options=ReexecutionOptions.from_failure(failed_run_id, instance),
        ) as retried:
            assert retried.success
            retried_run_id = retried.run_id

    first, second = ledger_rows(engine)
    assert (first["run_id"], first["succeeded"], first["sent"], first["publish_failed"]) == (
        failed_run_id,
        True,
        3,
        3,
    )
    assert (second["run_id"], second["succeeded"], second["sent"], second["published"]) == (
        retried_run_id,
        True,
        0,
        3,
    )
    assert second["lateness_count"] == 0  # the lateness was the first run's
    assert sum(r["sent"] for r in (first, second)) == 3


def test_three_runs_through_a_broker_outage_keep_liveness_and_publish_once_it_returns(
    engine, database_url, kafka_settings, kafka_reader, instance
):
    """The outage as the daemon would see it: three runs with the broker unreachable, then one
    with it back. Rows are Sent and liveness advances throughout; the outbox backlog shows the
    outage; the first run after it publishes everything, each message once."""
    from collections import Counter

    dead_broker = f"127.0.0.1:{free_port()}"
    events, runs = [], []
    for minutes in (3, 2, 1):
        events.append(make_due_event(engine, minutes_overdue=minutes))
        runs.append(
            reminder_dispatch.execute_in_process(
                instance=instance,
                resources=resources_for(database_url, dead_broker, **SHORT_KAFKA),
                raise_on_error=False,
            )
        )
        assert not runs[-1].success  # plainly failed: Kafka publish failed
        rows = ledger_rows(engine)
        assert rows[-1]["succeeded"] is True and rows[-1]["sent"] == 1
        assert health.liveness(engine, rows[-1]["finished_at"]).passed
    assert [r["status"] for e in events for r in reminders(engine, e)] == ["Sent"] * 3
    assert [o["published_at"] for o in outbox_rows(engine)] == [None] * 3
    assert [r["finished_at"] for r in ledger_rows(engine)] == sorted(
        r["finished_at"] for r in ledger_rows(engine)
    )
    assert (
        health.outbox_backlog(engine, ledger_rows(engine)[-1]["finished_at"]).metadata[
            "unpublished"
        ]
        == 3
    )

    back = reminder_dispatch.execute_in_process(
        instance=instance, resources=resources_for(database_url, kafka_settings)
    )
    assert back.success
    assert all(o["published_at"] is not None for o in outbox_rows(engine))
    ids = [reminders(engine, e)[0]["id"] for e in events]
    kafka_reader.wait_for(ids)
    kafka_reader.drain()
    # Nothing reached the dead broker, so no duplicate: the ack window was never open.
    assert Counter(m.value["ReminderId"] for m in kafka_reader.for_reminders(ids)) == Counter(
        {str(i): 1 for i in ids}
    )
