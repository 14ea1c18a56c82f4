"""Parallel instances and races with the calendar, on real PostgreSQL connections.

SKIP LOCKED must give each due row to exactly one instance, and the writing transaction must
decide on state it read under its own lock, so a cancel that commits first always wins.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import sqlalchemy as sa

from reminder_pipeline import cycle
from reminder_pipeline.local.calendar import cancel_event
from reminder_pipeline.store import repository
from reminder_pipeline.store.tables import calendar_events

from .. import oracle
from ..support import bulk_due, make_due_event, outbox_rows, reminders, utcnow


def test_parallel_instances_handle_each_row_once(engine, publisher, kafka_reader):
    bulk_due(engine, 600)
    as_of = utcnow()

    def worker() -> Counter:
        done: Counter = Counter()
        while True:
            outcome = cycle.dispatch_batch(engine, as_of, 40)
            done.update(r.reminder_id for r in outcome.sent)
            if not outcome.sent and not outcome.skipped_locked:
                return done

    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(lambda _: worker(), range(2)))

    total = results[0] + results[1]
    assert len(total) == 600
    assert max(total.values()) == 1  # no row sent by both instances
    rows = reminders(engine)
    assert {r["status"] for r in rows} == {"Sent"}
    outbox = outbox_rows(engine)
    assert len(outbox) == 600
    assert len({o["reminder_id"] for o in outbox}) == 600

    relayed = cycle.run_cycle(engine, publisher, budget_seconds=60)
    assert relayed.relay.published == 600
    messages = kafka_reader.wait_for([r["id"] for r in rows], timeout=60)
    assert Counter(m.value["ReminderId"] for m in messages).most_common(1)[0][1] == 1
    assert len(messages) == 600


def _ids(selection: cycle.Selection) -> list[str]:
    """The selected rows' ids (what a run's selecting step hands its writing step)."""
    return [r.reminder_id for r in selection.rows]


def test_rows_locked_by_another_instance_are_skipped_and_counted(engine):
    events = [make_due_event(engine, minutes_overdue=m) for m in (5, 4, 3, 2, 1)]
    as_of = utcnow()
    with engine.begin() as holder:
        held = cycle.lock_due(holder, as_of, 2)  # the two oldest stay locked
        assert len(held.rows) == 2
        other = cycle.dispatch_batch(engine, as_of, 5)
        assert len(other.sent) == 3
        assert other.skipped_locked == 2
        cycle.write_rows(holder, held.rows, as_of)
    assert all(reminders(engine, e)[0]["status"] == "Sent" for e in events)
    assert len(outbox_rows(engine)) == 5


def test_cancel_committed_between_read_and_write_wins(engine):
    event_id = make_due_event(engine)
    as_of = utcnow()
    with engine.begin() as conn:  # the selecting step, its own transaction (as a Dagster op)
        selection = cycle.lock_due(conn, as_of, 200)
    assert len(selection.rows) == 1
    assert oracle.decide_batch(selection.rows)[0].action.value == "send"

    cancel_event(engine, event_id)  # commits before the writing step

    with engine.begin() as conn:  # the writing step: the candidates locked and read again
        again = cycle.lock_candidates(conn, _ids(selection), as_of, reserved_by=None)
        outcome = cycle.write_rows(conn, again.rows, as_of)
    assert outcome.sent == [] and again.gone == 1
    assert reminders(engine, event_id)[0]["status"] == "Skipped"
    assert outbox_rows(engine) == []


def test_status_change_without_cascade_is_re_read_under_lock(engine):
    event_id = make_due_event(engine)
    as_of = utcnow()
    with engine.begin() as conn:
        selection = cycle.lock_due(conn, as_of, 200)
    with engine.begin() as conn:  # cancelled, but its rows were left Pending (replay)
        conn.execute(sa.update(calendar_events).values(status="Cancelled"))
    with engine.begin() as conn:
        again = cycle.lock_candidates(conn, _ids(selection), as_of, reserved_by=None)
        outcome = cycle.write_rows(conn, again.rows, as_of)
    assert [r.reminder_id for r in outcome.skipped] == _ids(selection)
    assert reminders(engine, event_id)[0]["status"] == "Skipped"
    assert outbox_rows(engine) == []


def test_rows_held_by_a_cancel_in_flight_are_skipped_then_cancelled(engine):
    event_id = make_due_event(engine)
    with engine.connect() as cascade:
        tx = cascade.begin()
        repository.lock_event(cascade, event_id)
        repository.lock_pending_reminders(cascade, event_id)
        repository.set_event_status(
            cascade,
            event_id,
            __import__(
                "reminder_pipeline.domain.model", fromlist=["EventStatus"]
            ).EventStatus.CANCELLED,
        )

        outcome = cycle.dispatch_batch(engine, utcnow(), 200)
        assert outcome.sent == [] and outcome.skipped_locked == 1

        repository.skip_pending_reminders(cascade, event_id)
        tx.commit()
    assert reminders(engine, event_id)[0]["status"] == "Skipped"
    assert outbox_rows(engine) == []


def _wait_for_lock_wait(engine, timeout: float = 10.0) -> bool:
    """True once some backend of this database waits on a row lock."""
    deadline = time.monotonic() + timeout
    with engine.connect() as conn:
        while time.monotonic() < deadline:
            waiting = conn.execute(
                sa.text(
                    "SELECT count(*) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND wait_event_type = 'Lock'"
                )
            ).scalar_one()
            conn.commit()
            if waiting:
                return True
    return False


def test_dispatcher_first_then_cancel_sends_once_and_cancel_waits(engine):
    event_id = make_due_event(engine)
    as_of = utcnow()
    with engine.begin() as conn:
        selection = cycle.lock_due(conn, as_of, 200)
        canceller = threading.Thread(target=cancel_event, args=(engine, event_id))
        canceller.start()
        assert _wait_for_lock_wait(engine), (
            "the cancel cascade should wait for the dispatcher's lock"
        )
        cycle.write_rows(conn, selection.rows, as_of)
    canceller.join(timeout=30)
    assert not canceller.is_alive()
    # The dispatcher committed first: the reminder went out, the cancel followed (accepted window).
    assert reminders(engine, event_id)[0]["status"] == "Sent"
    assert len(outbox_rows(engine)) == 1
    with engine.connect() as conn:
        status = conn.execute(sa.select(calendar_events.c.status)).scalar_one()
    assert status == "Cancelled"


def test_reschedule_re_materialises_pending_rows(engine):
    from reminder_pipeline.local.calendar import reschedule_event

    start = utcnow() + timedelta(days=3)
    event_id = make_due_event(engine, offsets=(60,))
    # One row Sent for the old start.
    cycle.dispatch_batch(engine, utcnow(), 200)
    new_ids = reschedule_event(engine, event_id, start, offsets=(1440, 60))
    rows = reminders(engine, event_id)
    assert sorted(r["status"] for r in rows) == ["Pending", "Pending", "Sent"]
    assert {r["id"] for r in rows if r["status"] == "Pending"} == set(new_ids)
    for r in rows:
        if r["status"] == "Pending":
            assert r["due_at"] == start - timedelta(minutes=r["offset_minutes"])
