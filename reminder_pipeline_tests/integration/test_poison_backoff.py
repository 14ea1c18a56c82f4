"""Poison rows without head-of-line blocking: more poison rows than a batch, due before the healthy ones.

The seed keeps a poison row Pending for the next cycle; with ordering by DueAt a head of poison
rows would starve everything behind it. Each failure backs the row off (30 s, 60 s, ... capped),
so healthy rows are always dispatched.
"""

from __future__ import annotations

from datetime import timedelta

import sqlalchemy as sa

from reminder_pipeline import cycle
from reminder_pipeline.store.repository import (
    POISON_BACKOFF_BASE_SECONDS,
    POISON_BACKOFF_CAP_SECONDS,
)

from ..support import POISON_KIND, make_due_event, reminders


def test_healthy_rows_behind_a_head_of_poison_rows_are_dispatched(engine):
    batch = 5
    poison = [
        make_due_event(engine, minutes_overdue=60 + i, kind=POISON_KIND) for i in range(batch * 2)
    ]
    healthy = [make_due_event(engine, minutes_overdue=1 + i / 10) for i in range(3)]

    first = cycle.dispatch_batch(engine, cycle.now_utc(), batch)
    assert len(first.poison) == batch and first.sent == []  # the head of the queue is all poison
    second = cycle.dispatch_batch(engine, cycle.now_utc(), batch)
    assert len(second.poison) == batch  # the next poison rows; the first ones back off
    third = cycle.dispatch_batch(engine, cycle.now_utc(), batch)
    assert len(third.sent) == 3 and third.poison == []
    assert all(reminders(engine, e)[0]["status"] == "Sent" for e in healthy)
    assert all(reminders(engine, e)[0]["status"] == "Pending" for e in poison)


def test_back_off_grows_exponentially_and_is_capped(engine):
    event_id = make_due_event(engine, kind=POISON_KIND)
    waits = []
    now = cycle.now_utc()
    for _ in range(10):
        with engine.begin() as conn:
            selection = cycle.lock_due(conn, now, 10)
            assert len(selection.rows) == 1
            cycle.write_rows(conn, selection.rows, now, now=now)
        [row] = reminders(engine, event_id)
        waits.append((row["next_attempt_at"] - now).total_seconds())
        now = row["next_attempt_at"] + timedelta(seconds=1)
    assert waits[:4] == [POISON_BACKOFF_BASE_SECONDS * 2**i for i in range(4)]
    assert max(waits) == POISON_BACKOFF_CAP_SECONDS
    assert reminders(engine, event_id)[0]["attempts"] == 10


def test_a_poison_row_fixed_by_the_calendar_goes_out_on_its_next_attempt(engine):
    event_id = make_due_event(engine, kind=POISON_KIND)
    cycle.dispatch_batch(engine, cycle.now_utc(), 10)
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE calendar_events SET kind = 'Meeting'"))
        conn.execute(
            sa.text("UPDATE event_reminders SET next_attempt_at = NULL")
        )  # as `poison retry`
    outcome = cycle.dispatch_batch(engine, cycle.now_utc(), 10)
    assert len(outcome.sent) == 1
    [row] = reminders(engine, event_id)
    assert row["status"] == "Sent" and row["last_error"] is None and row["next_attempt_at"] is None
