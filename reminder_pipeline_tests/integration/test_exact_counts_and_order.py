"""Exact ``skipped_locked``, reservations of Dagster runs, and a batch's records after its commit.

Real PostgreSQL connections. ``skipped_locked`` must count the due rows another transaction (or
another run's reservation) holds, nothing else: DueAt ties cut by LIMIT are never "locked". A
batch's log lines and span events are emitted after its transaction committed (no I/O but the
database's while its rows are locked); a batch that rolls back never logs "reminder sent".
"""

from __future__ import annotations

import logging

import pytest
import sqlalchemy as sa

from reminder_pipeline import cycle
from reminder_pipeline.logs import Journal
from reminder_pipeline.observability import tracing

from ..support import make_due_event, outbox_rows, reminders, utcnow


def _tied_due(engine, n: int, distinct: int = 3) -> None:
    """``n`` due reminders of live events with only ``distinct`` DueAt values (round times)."""
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                """
                WITH ev AS (
                    INSERT INTO calendar_events (id, tenant_id, owner_user_id, kind, start_at, time_zone)
                    SELECT gen_random_uuid(), gen_random_uuid(), gen_random_uuid(), 'Meeting',
                           date_trunc('minute', now()) + interval '30 minutes', 'UTC'
                      FROM generate_series(1, :n)
                    RETURNING id
                )
                INSERT INTO event_reminders (id, calendar_event_id, offset_minutes, due_at)
                SELECT gen_random_uuid(), id, 60,
                       date_trunc('minute', now()) - (1 + (row_number() OVER ()) % :distinct)
                           * interval '1 minute'
                  FROM ev
                """
            ),
            {"n": n, "distinct": distinct},
        )


def _hold(conn, n: int) -> list[str]:
    """Lock the ``n`` oldest due rows in ``conn``'s transaction (another instance, a cascade)."""
    return list(
        conn.execute(
            sa.text(
                "SELECT CAST(id AS text) FROM event_reminders WHERE status = 'Pending' "
                "ORDER BY due_at, id LIMIT :n FOR UPDATE"
            ),
            {"n": n},
        ).scalars()
    )


def test_a_lone_dispatcher_reports_nothing_locked_whatever_the_due_at_ties(engine):
    _tied_due(engine, 1000)  # 3 DueAt values: every batch limit cuts through a tie
    as_of = utcnow()
    batches = [cycle.dispatch_batch(engine, as_of, 200) for _ in range(6)]
    assert [len(b.sent) for b in batches] == [200, 200, 200, 200, 200, 0]
    assert [b.skipped_locked for b in batches] == [0] * 6


def test_rows_held_by_another_transaction_are_counted_exactly(engine):
    _tied_due(engine, 1000)
    as_of = utcnow()
    with engine.connect() as other:
        other.begin()
        held = _hold(other, 7)
        outcome = cycle.dispatch_batch(engine, as_of, 200)
        assert len(outcome.sent) == 200 and outcome.skipped_locked == 7
        assert not {r.reminder_id for r in outcome.sent} & set(held)
        # The rest of the backlog: every row free is taken, the 7 are still held.
        rest = [cycle.dispatch_batch(engine, as_of, 400) for _ in range(3)]
        assert sum(len(b.sent) for b in rest) == 793
        assert [b.skipped_locked for b in rest] == [7, 7, 7]
        other.rollback()
    assert cycle.dispatch_batch(engine, as_of, 200).skipped_locked == 0


def test_a_run_reservation_keeps_its_rows_from_other_selections_until_its_write(engine):
    _tied_due(engine, 300)
    run = cycle.start("run-a", engine=engine, batch_size=200)
    reserved = cycle.select(engine, run)
    assert len(reserved.ids) == 200 and reserved.skipped_locked == 0
    # Another instance, selecting meanwhile, takes the other 100 and counts the reserved ones.
    other = cycle.dispatch_batch(engine, utcnow(), 200)
    assert len(other.sent) == 100 and other.skipped_locked == 200
    assert not {r.reminder_id for r in other.sent} & set(reserved.ids)
    # Another run's selection finds nothing free and counts the reservation as held.
    assert cycle.select(engine, cycle.start("run-b", engine=engine, batch_size=200)).ids == []
    written = cycle.write(engine, run, reserved.ids, run_id="run-a")
    assert written.counts.sent == 200 and written.counts.skipped_locked == 0
    assert {r["status"] for r in reminders(engine)} == {"Sent"}
    assert len(outbox_rows(engine)) == 300
    with engine.connect() as conn:  # the reservation ends with the write
        assert (
            conn.execute(
                sa.text("SELECT count(*) FROM event_reminders WHERE reserved_by IS NOT NULL")
            ).scalar_one()
            == 0
        )


def test_the_reservation_of_a_run_that_died_expires_by_itself(engine):
    _tied_due(engine, 10)
    dead = cycle.select(engine, cycle.start("run-dead", engine=engine, batch_size=10))
    assert len(dead.ids) == 10
    assert cycle.dispatch_batch(engine, utcnow(), 10).sent == []
    with engine.begin() as conn:  # RESERVATION_SECONDS later
        conn.execute(sa.text("UPDATE event_reminders SET reserved_until = now() - interval '1 s'"))
    assert len(cycle.dispatch_batch(engine, utcnow(), 10).sent) == 10


def test_a_write_never_takes_rows_another_run_reserved(engine):
    _tied_due(engine, 5)
    mine = cycle.start("run-mine", engine=engine, batch_size=5)
    ids = cycle.select(engine, mine).ids
    with engine.begin() as conn:  # my reservation lapsed; another run took the rows meanwhile
        conn.execute(
            sa.text(
                "UPDATE event_reminders SET reserved_by = 'run-other', "
                "reserved_until = now() + interval '1 minute'"
            )
        )
    written = cycle.write(engine, mine, ids, run_id="run-mine")
    assert written.counts.sent == 0 and written.counts.skipped_locked == 5
    assert {r["status"] for r in reminders(engine)} == {"Pending"}


class _CommitWitness(Journal):
    """A journal that checks, from another connection, that a batch is committed when logged."""

    def __init__(self, engine) -> None:
        super().__init__()
        self.engine = engine
        self.records: list[tuple[str, list[dict]]] = []
        self.seen_pending: list[str] = []

    def batch(self, level, message, items, **fields):
        ids = [i["reminder_id"] for i in items if "reminder_id" in i]
        with self.engine.connect() as conn:
            pending = conn.execute(
                sa.text(
                    "SELECT CAST(id AS text) FROM event_reminders "
                    "WHERE id = ANY(CAST(:ids AS uuid[])) AND status = 'Pending'"
                ),
                {"ids": ids},
            ).scalars()
            self.seen_pending.extend(pending)
        self.records.append((message, items))
        super().batch(level, message, items, **fields)

    def event(self, level, message, **fields):
        self.records.append((message, [fields]))
        super().event(level, message, **fields)


def test_a_batch_is_logged_and_traced_after_its_commit(engine, monkeypatch):
    events = [make_due_event(engine, minutes_overdue=m) for m in (3, 2, 1)]
    witness = _CommitWitness(engine)
    traced_while_pending: list[int] = []
    item_events = tracing.item_events

    def witness_span_events(name, items):
        with engine.connect() as conn:
            traced_while_pending.append(
                conn.execute(
                    sa.text("SELECT count(*) FROM event_reminders WHERE status = 'Pending'")
                ).scalar_one()
            )
        return item_events(name, items)

    monkeypatch.setattr(tracing, "item_events", witness_span_events)
    with tracing.cycle_span("run-order"):
        outcome = cycle.dispatch_batch(engine, utcnow(), 200, run_id="run-order", journal=witness)
    assert len(outcome.sent) == 3
    sent_lines = [
        i for m, items in witness.records for i in items if i.get("msg") == "reminder sent"
    ]
    assert len(sent_lines) == 3
    assert witness.seen_pending == []  # every logged row was already committed
    assert traced_while_pending and set(traced_while_pending) == {0}
    assert all(reminders(engine, e)[0]["status"] == "Sent" for e in events)


def test_a_batch_that_rolls_back_logs_that_and_never_reminder_sent(engine, caplog):
    make_due_event(engine, minutes_overdue=1)
    with engine.begin() as conn:  # the outbox refuses writes: an infrastructure error mid-batch
        conn.exec_driver_sql(
            "CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS "
            "$$BEGIN RAISE EXCEPTION 'outbox unavailable' USING ERRCODE = '55000'; END$$"
        )
        conn.exec_driver_sql(
            "CREATE TRIGGER refuse BEFORE INSERT ON outbox "
            "FOR EACH STATEMENT EXECUTE FUNCTION refuse()"
        )
    with (
        caplog.at_level(logging.INFO, logger="reminder_pipeline"),
        pytest.raises(sa.exc.DBAPIError),
    ):
        cycle.dispatch_batch(engine, utcnow(), 200, run_id="run-rollback")
    messages = [r.getMessage() for r in caplog.records]
    assert "batch rolled back" in messages
    assert not [r for r in caplog.records if getattr(r, "items", None)]  # no batch record at all
    assert {r["status"] for r in reminders(engine)} == {"Pending"}
