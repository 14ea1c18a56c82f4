"""The trace's reasons on the real database and broker: each state says when and by what.

Every writer that moves a reminder out of Pending is recorded (``moved_by``/``moved_in_run``,
migration 0007) and named by the reason: a cycle of ``reminder-pipeline dispatch`` (no Dagster
run, so no ``run_url``), the calendar at creation (its time had passed), a cancel or a completion
(at T), the dispatcher finding the event closed under its lock, an operator's skip (at T, after N
failures). A sent reminder whose row is gone (the event moved or deleted) is traced from its
outbox message, to the partition and offset the broker holds it at; an id found nowhere is one
line. ``trace_ids`` answers for a list of ReminderIds in the caller's order (the finder's entry
point). A Dagster run's writes are traced in ``defs/test_trace.py``.
"""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa

from reminder_pipeline import cycle
from reminder_pipeline.local.calendar import (
    cancel_event,
    complete_event,
    move_event_by,
    reschedule_event,
)
from reminder_pipeline.operator_jobs import poison, trace
from reminder_pipeline_tests.support import (
    POISON_KIND,
    error_lines,
    event_row,
    make_due_event,
    make_event,
    reminders,
    run_cli,
    utcnow,
)

UI = "http://127.0.0.1:3000"


def _at(value: datetime) -> str:
    return value.astimezone(UTC).isoformat(timespec="seconds")


@pytest.fixture
def cli_env(database_url, kafka_settings, tmp_path):
    return {
        "DATABASE_URL": database_url,
        "KAFKA_BOOTSTRAP_SERVERS": kafka_settings.bootstrap_servers,
        "REMINDER_PIPELINE_HOME": str(tmp_path / "home"),
    }


def _one(engine, reminder_id) -> dict:
    [item] = trace.trace(engine, reminder_id, ui_url=UI)
    return item


def test_trace_ids_answers_in_the_given_order_and_leaves_unknown_ids_out(engine, publisher):
    first = make_due_event(engine, kind="Showing")
    second = make_due_event(engine, kind="Call", minutes_overdue=-30)
    cycle.run_cycle(engine, publisher)
    [sent], [pending] = reminders(engine, first), reminders(engine, second)

    items = trace.trace_ids(engine, [pending["id"], uuid.uuid4(), sent["id"]], ui_url=UI)

    assert [i["reminder_id"] for i in items] == [str(pending["id"]), str(sent["id"])]
    assert [i["kind"] for i in items] == ["Call", "Showing"]
    assert list(items[1]) == list(trace.FIELDS)
    assert items[1]["failed_publish_attempts"] == 0 and "publish_attempts" not in items[1]
    assert items[0]["status"] == "Pending" and items[0]["reason"].startswith("not due yet")
    assert trace.trace_ids(engine, [], ui_url=UI) == []


def test_a_reminder_sent_by_the_dispatch_command_names_it_and_has_no_run_url(engine, cli_env):
    event_id = make_due_event(engine)
    result = run_cli("dispatch", "--json", env=cli_env)
    assert result.returncode == 0, result.stderr
    run_id = json.loads(result.stdout)["run_id"]
    [row] = reminders(engine, event_id)
    assert (row["moved_by"], row["moved_in_run"]) == ("cli:dispatch", run_id)

    traced = run_cli("trace", str(row["id"]), "--json", env=cli_env)
    [item] = json.loads(traced.stdout)["reminders"]

    assert item["status"] == "Sent" and item["moved_by"] == "cli:dispatch"
    assert item["run_id"] == run_id and item["run_url"] is None  # no dead link
    assert item["reason"].startswith(
        f"sent at {_at(row['sent_at'])} by `reminder-pipeline dispatch` "
        f"(run id {run_id}, no Dagster run); published at "
    )
    text = run_cli("trace", str(row["id"]), env=cli_env).stdout
    assert "failed publish attempts: 0" in text and "moved by       cli:dispatch" in text
    assert "/runs/" not in text


def test_a_reminder_past_due_at_creation_says_it_was_skipped_at_creation(engine):
    now = utcnow()
    event_id = make_event(engine, start_at=now + timedelta(minutes=30), offsets=(60, 15))
    past, future = reminders(engine, event_id)
    assert (past["status"], future["status"]) == ("Skipped", "Pending")

    item = _one(engine, past["id"])

    assert item["reason"] == (
        f"skipped at creation: its time (due at {_at(past['due_at'])}) had passed when it was "
        f"created at {_at(past['created_at'])}"
    )
    # The calendar's, named as such though it records no writer (no run: no run id, no link).
    assert item["moved_by"] == "calendar" and item["run_id"] is None and item["run_url"] is None


@pytest.mark.parametrize(
    ("close", "words"), [(cancel_event, "cancel"), (complete_event, "completion")]
)
def test_a_reminder_skipped_by_a_cancel_or_a_completion_says_when(engine, close, words):
    event_id = make_due_event(engine, minutes_overdue=-30)
    close(engine, event_id)
    [row] = reminders(engine, event_id)

    item = _one(engine, row["id"])

    assert item["status"] == "Skipped"
    assert item["reason"] == f"skipped by the {words} of the event at {_at(row['updated_at'])}"
    # The calendar records no writer; the trace names it beside its reason (it said "-").
    assert item["moved_by"] == "calendar" and row["moved_by"] is None


def test_a_reminder_the_dispatcher_skipped_says_when_by_what_and_why(engine, publisher):
    event_id = make_due_event(engine, status="Cancelled")  # closed when the cycle reads it
    report = cycle.run_cycle(engine, publisher, writer=cycle.cli_writer("dispatch"))
    assert report.counts.skipped == 1
    [row] = reminders(engine, event_id)

    item = _one(engine, row["id"])

    assert item["reason"] == (
        f"skipped at {_at(row['updated_at'])} by `reminder-pipeline dispatch` (run id "
        f"{report.run_id}, no Dagster run): the event was Cancelled"
    )
    assert item["run_id"] == report.run_id and item["run_url"] is None


def test_a_reminder_an_operator_skipped_says_when_and_after_how_many_failures(engine, publisher):
    event_id = make_due_event(engine, kind=POISON_KIND)
    assert cycle.run_cycle(engine, publisher).counts.failed == 1
    [row] = reminders(engine, event_id)
    assert poison.change(engine, "skip", row["id"], actor="test").changed
    [skipped] = reminders(engine, event_id)

    item = _one(engine, row["id"])

    assert skipped["moved_by"] == "operator:poison skip" and skipped["moved_in_run"] is None
    assert item["reason"] == (
        f"skipped by an operator at {_at(skipped['updated_at'])} after 1 failures "
        f"(last error: {row['last_error']})"
    )
    assert item["run_url"] is None


def test_a_bulk_skip_in_a_dagster_run_records_the_run(engine, publisher):
    event_id = make_due_event(engine, kind=POISON_KIND)
    cycle.run_cycle(engine, publisher)
    done = poison.change_many(  # as the reminder_poison job calls it, with its run id
        engine, "skip", poison.PoisonFilter(), actor="test", run_id="run-9"
    )
    [skipped] = [row["id"] for row in done.rows]

    item = _one(engine, skipped)

    assert reminders(engine, event_id)[0]["moved_in_run"] == "run-9"
    assert item["reason"].startswith("skipped by an operator at ")
    assert "(Dagster run run-9) after 1 failures" in item["reason"]
    assert item["run_url"] == f"{UI}/runs/run-9"


def test_a_sent_reminder_whose_row_is_gone_is_traced_from_its_outbox_message(
    engine, publisher, kafka_reader, cli_env
):
    moved, deleted = make_due_event(engine), make_due_event(engine)
    report = cycle.run_cycle(engine, publisher)
    [gone], [gone_with_event] = reminders(engine, moved), reminders(engine, deleted)
    with engine.begin() as conn:  # a calendar that re-creates every reminder of a moved event
        conn.execute(sa.text("DELETE FROM event_reminders WHERE id = :id"), {"id": gone["id"]})
        conn.execute(sa.text("DELETE FROM calendar_events WHERE id = :id"), {"id": deleted})
    [new_id] = reschedule_event(engine, moved, utcnow() + timedelta(hours=2), offsets=(60,))

    result = run_cli("trace", str(gone["id"]), "--json", env=cli_env)

    assert result.returncode == 0, result.stderr
    [item] = json.loads(result.stdout)["reminders"]
    assert str(new_id) != item["reminder_id"] == str(gone["id"])
    assert (item["status"], item["event_id"], item["kind"]) == ("Sent", str(moved), "Meeting")
    # Whose it was, from the message (the row is gone): the person's id to pivot on.
    event = event_row(engine, moved)
    assert (item["owner_user_id"], item["client_user_id"], item["tenant_id"]) == (
        str(event["owner_user_id"]),
        None if event["client_user_id"] is None else str(event["client_user_id"]),
        str(event["tenant_id"]),
    )
    [message] = kafka_reader.wait_for([gone["id"]])
    assert (item["partition"], item["offset"]) == (message.partition, message.offset)
    assert item["run_id"] == report.run_id == message.headers["correlation-id"]
    assert item["run_url"] is None and item["event_status"] == "Planned"
    assert item["reason"].startswith("its reminder row is gone (the event was moved or deleted)")
    assert item["reason"].endswith(
        f"and published at {item['published_at'][:19]}+00:00, "
        f"partition {message.partition} offset {message.offset}"
    )
    [other] = trace.trace_ids(engine, [gone_with_event["id"]], ui_url=UI)
    assert other["reason"].startswith("its reminder row is gone with its event (deleted)")


def test_an_id_found_nowhere_is_one_line_saying_an_unsent_reminder_leaves_no_row(engine, cli_env):
    event_id = make_due_event(engine, minutes_overdue=-30)
    [pending] = reminders(engine, event_id)
    move_event_by(engine, event_id, timedelta(minutes=5))  # Pending rows re-created, new ids

    result = run_cli("trace", str(pending["id"]), env=cli_env)

    assert result.returncode == 1 and result.stdout == ""
    assert error_lines(result) == [
        f"reminder-pipeline: error: trace: no reminder, event or outbox message has the id "
        f"{pending['id']}; a reminder deleted before it was sent leaves no row"
    ]
