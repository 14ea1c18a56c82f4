"""The re-publish back-fill re-sends only what still holds, on the real database and broker.

A day's reminders are dispatched and published by a real cycle; then one event is cancelled and
one moved a week later (its StartAt changed; its Pending rows re-created). Re-publishing the day
sends only the valid reminder; the others are counted by reason and logged with their ids. A day
whose outbox rows were partly purged (fewer rows than Sent reminders) is refused before anything
is sent, naming the count, whatever retention the job is given.
"""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
import sqlalchemy as sa

from reminder_pipeline import cycle
from reminder_pipeline.local import calendar
from reminder_pipeline.logs import items_of
from reminder_pipeline.operator_jobs.outbox_retention import purge_published
from reminder_pipeline.operator_jobs.republish import RepublishRefused, Requester, resend_day
from reminder_pipeline_tests.support import (
    make_event_due_on,
    reminders,
    utcnow,
    wait_for_republished,
)


def _reminder_id(engine, event_id) -> str:
    (row,) = reminders(engine, event_id)
    return str(row["id"])


def test_only_reminders_that_still_hold_are_republished(engine, publisher, kafka_reader, caplog):
    day = (utcnow() - timedelta(days=1)).date()
    valid, cancelled, moved = (make_event_due_on(engine, day, hour) for hour in (8, 9, 10))
    ids = {e: _reminder_id(engine, e) for e in (valid, cancelled, moved)}
    report = cycle.run_cycle(engine, publisher, batch_size=100)
    assert report.counts.sent == 3 and report.relay.published == 3
    calendar.cancel_event(engine, cancelled)
    old_start = calendar_start(engine, moved)
    calendar.reschedule_event(engine, moved, old_start + timedelta(days=7))

    run_id = f"test-{uuid.uuid4()}"
    caplog.set_level("INFO")
    result = resend_day(engine, publisher, day, Requester(run_id))

    assert result.republished == 1
    assert result.not_republished == {"cancelled": 1, "moved": 1}
    sent = wait_for_republished(kafka_reader, ids.values(), 1)
    assert [m.value["ReminderId"] for m in sent] == [ids[valid]]
    left_out = {
        (item["reason"], item["reminder_id"], item["event_id"])
        for record in caplog.records
        if record.getMessage() == "republish left out"
        for item in items_of(record)
    }
    assert left_out == {
        ("cancelled", ids[cancelled], str(cancelled)),
        ("moved", ids[moved], str(moved)),
    }


def test_a_partly_purged_day_is_refused_with_nothing_sent(engine, publisher):
    day = (utcnow() - timedelta(days=3)).date()
    events = [make_event_due_on(engine, day, hour) for hour in (6, 7, 8)]
    assert cycle.run_cycle(engine, publisher, batch_size=100).relay.published == 3
    # Two of the day's rows go the way a 24 h purge takes them.
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "UPDATE outbox SET published_at = now() - interval '30 hours' "
                "WHERE reminder_id = ANY(CAST(:ids AS uuid[]))"
            ),
            {"ids": [_reminder_id(engine, e) for e in events[:2]]},
        )
    assert purge_published(engine, timedelta(hours=24)) == 2

    with pytest.raises(RepublishRefused) as refused:
        # The job's retention says the day is whole; the rows say otherwise.
        resend_day(
            engine, publisher, day, Requester(f"test-{uuid.uuid4()}"), retention=timedelta(days=7)
        )
    assert str(refused.value).startswith(
        f"re-publish of {day} refused: 1 outbox rows for 3 Sent reminders due that day (2 purged)"
    )
    assert "\n" not in str(refused.value)


def calendar_start(engine, event_id):
    with engine.connect() as conn:
        return conn.execute(
            sa.text("SELECT start_at FROM calendar_events WHERE id = :id"), {"id": event_id}
        ).scalar_one()
