"""The ``reminder_find`` job on the real database: support's finder from the Launchpad.

Its run config takes the command line's filters with the command line's checks (a bad value is
one line and no run); a run answers what ``reminders`` answers (the same items and cursor), shows
each reminder as a Markdown card with the count and the next page's cursor, logs one line per
reminder (ids only) and pages by the cursor it printed.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from dagster import (
    DagsterInstance,
    DagsterInvalidConfigError,
    instance_for_test,
    validate_run_config,
)

from reminder_pipeline import cycle
from reminder_pipeline.definitions import defs
from reminder_pipeline.defs.find import reminder_find
from reminder_pipeline.defs.resources import PostgresResource
from reminder_pipeline.operator_jobs import finder
from reminder_pipeline_tests.support import (
    PII_DESCRIPTION,
    PII_LOCATION,
    PII_TITLE,
    make_event_due_on,
    reminders,
    utcnow,
)

from .helpers import instance_overrides, log_messages


@pytest.fixture
def instance() -> Iterator[DagsterInstance]:
    """A throwaway instance with the shipped python_logs settings."""
    with instance_for_test(overrides=instance_overrides()) as instance:
        yield instance


_POSITION = (datetime(2026, 12, 1, tzinfo=UTC), uuid.UUID(int=7))


def test_the_config_takes_the_filters_in_canonical_form(monkeypatch):
    monkeypatch.setenv("DATABASE_URL", "postgresql+psycopg://user@127.0.0.1:5432/reminders")
    job = defs.get_job_def("reminder_find")
    client = str(uuid.uuid4())
    config = validate_run_config(
        job,
        {
            "client": client.upper(),
            "status": ["sent", "SKIPPED", "Sent"],
            "kind": "showing",
            "due_from": "2026-12-01",
            "due_to": "2026-12-01",
            "owner": "  ",
        },
    )["ops"]["find_reminders"]["config"]
    assert config["client"] == client and config["owner"] is None
    assert (config["status"], config["kind"]) == (["Sent", "Skipped"], "Showing")
    assert config["limit"] == finder.DEFAULT_FIND_LIMIT
    assert validate_run_config(job, {})["ops"]["find_reminders"]["config"]["status"] == []
    # The last day is no upper bound (it used to overflow); a cursor of the same search is taken.
    assert validate_run_config(job, {"due_to": "9999-12-31"})
    cursor = finder.encode_cursor(finder.Filters(kind="Task"), *_POSITION)
    assert validate_run_config(job, {"kind": "task", "after": cursor})


@pytest.mark.parametrize(
    ("config", "says"),
    [
        (
            {"status": ["Nonsense"]},
            "status='Nonsense' is not a reminder status (one of Pending, Sent, Skipped)",
        ),
        (
            {"kind": "Nonsense"},
            "kind='Nonsense' is not an event kind (one of Showing, "
            "Consultation, Meeting, Task, BookingDeadline)",
        ),
        ({"client": "Ivanov"}, "client='Ivanov' is not an id (a UUID)"),
        ({"due_from": "tuesday"}, "due_from='tuesday' is not an ISO-8601 timestamp"),
        (
            {"due_from": "2026-12-02", "due_to": "2026-12-01"},
            "due_from='2026-12-02' is after due_to='2026-12-01': no reminder could match",
        ),
        ({"limit": 0}, "limit=0 is out of range [1, 1000]"),
        ({"after": "nope"}, "after='nope' is not a cursor"),
        (  # a cursor another search printed (this one of the filters {}): refused
            {"kind": "Task", "after": finder.encode_cursor(finder.Filters(), *_POSITION)},
            "is not a cursor of this search",
        ),
    ],
)
def test_a_bad_value_refuses_the_run_in_one_line(config, says, monkeypatch):
    monkeypatch.setenv("DATABASE_URL", "postgresql+psycopg://user@127.0.0.1:5432/reminders")
    with pytest.raises(DagsterInvalidConfigError) as refused:
        validate_run_config(defs.get_job_def("reminder_find"), config)
    first = str(refused.value).splitlines()[0]
    assert first.startswith("reminder_find run config refused: ") and says in first, first


def test_a_run_answers_as_the_command_does_and_shows_cards(
    engine, database_url, publisher, instance, monkeypatch
):
    day = (utcnow() - timedelta(days=2)).date()
    client, tenant = uuid.uuid4(), uuid.uuid4()
    events = [
        make_event_due_on(
            engine, day, hour, client_user_id=client, tenant_id=tenant, kind="Showing"
        )
        for hour in (9, 11, 15)
    ]
    make_event_due_on(engine, day, 12, tenant_id=tenant, kind="Showing")  # another client
    cancelled = make_event_due_on(engine, day, 13, client_user_id=client, status="Cancelled")
    assert cycle.run_cycle(engine, publisher, batch_size=100).counts.sent == 4
    newest_first = (events[2], cancelled, events[1], events[0])  # 15:00, 13:00, 11:00, 09:00
    ids = [str(reminders(engine, e)[0]["id"]) for e in newest_first]
    monkeypatch.setenv("DAGSTER_WEBSERVER_PORT", "3125")
    resources = {"postgres": PostgresResource(database_url=database_url)}
    config = {
        "client": str(client),
        "due_from": day.isoformat(),
        "due_to": day.isoformat(),
        "limit": 3,
    }

    first = reminder_find.execute_in_process(
        run_config=config, instance=instance, resources=resources
    )

    assert first.success
    output = first.output_for_node("find_reminders")
    the_day = finder.due_range(day.isoformat(), day.isoformat())
    items, cursor = finder.find(
        engine,
        finder.Filters(client=client, due_from=the_day[0], due_before=the_day[1]),
        limit=3,
        ui_url="http://127.0.0.1:3125",
    )
    assert output == {"reminders": items, "next": cursor} and cursor is not None
    assert [i["reminder_id"] for i in items] == ids[:3]
    [event] = [e for e in first.all_events if e.is_successful_output]
    meta = event.event_specific_data.metadata
    assert meta["count"].value == 3 and meta["next_cursor"].value == cursor
    cards = meta["reminders"].value
    for item in items:
        assert item["reminder_id"] in cards
    assert "the event was Cancelled" in cards and "\n| " not in cards
    assert item["run_url"] is None or item["run_url"] in cards
    lines = log_messages(instance, first.run_id)
    assert [line for line in lines if line.startswith("reminder ")] == [
        f"reminder {i['reminder_id']} event={i['event_id']} status={i['status']}" for i in items
    ]
    assert not any(
        pii in " ".join(lines) + cards for pii in (PII_TITLE, PII_DESCRIPTION, PII_LOCATION)
    )

    second = reminder_find.execute_in_process(
        run_config={**config, "after": cursor}, instance=instance, resources=resources
    )
    page = second.output_for_node("find_reminders")
    assert [i["reminder_id"] for i in page["reminders"]] == ids[3:] and page["next"] is None
