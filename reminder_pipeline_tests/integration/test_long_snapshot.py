"""The due scan beside a long snapshot: it starts where the live rows start, and leaves none behind.

Real PostgreSQL. A second session holds a ``REPEATABLE READ`` snapshot taken before the rows are
dispatched, as a report or a ``pg_dump`` would: no entry of a dispatched row can then be removed
or marked dead, so a scan that started at the due index's oldest end would visit each one. What
is asserted is the number of index entries a statement read (``pg_stat_get_xact_tuples_returned``
of the due index, in the statement's own transaction), never a time. And the rules that a
position could break: a row passed over because another transaction held it, or another run had
reserved it, is taken by the next cycle once it is free; a poison row is taken when its back-off
ends; a row written behind the floor is taken by the next full sweep.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine, make_url

from reminder_pipeline import cycle
from reminder_pipeline.cycle.scan import FULL_SWEEP_SECONDS, scan_start
from reminder_pipeline.store import outbox_repository, repository
from reminder_pipeline_testkit.held_snapshot import HeldSnapshot

from ..support import POISON_KIND, bulk_due, make_due_event, reminders

DUE_INDEX = "ix_event_reminders_status_due_at"


@contextmanager
def held_snapshot(database_url: str) -> Iterator[None]:
    """A session holding a REPEATABLE READ snapshot that has read the reminders (a report)."""
    dsn = make_url(database_url).set(drivername="postgresql").render_as_string(hide_password=False)
    held = HeldSnapshot(dsn)
    held.take()
    try:
        yield
    finally:
        held.release()


def entries_read(conn: Connection) -> int:
    """Entries of the due index that this transaction's scans have read so far."""
    return int(
        conn.execute(
            sa.text("SELECT pg_stat_get_xact_tuples_returned(CAST(:index AS regclass))"),
            {"index": DUE_INDEX},
        ).scalar_one()
    )


def due_now(engine: Engine, n: int) -> None:
    """``n`` reminders of live events that fall due as they are inserted (after any cycle so far)."""
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                """
                WITH ev AS (
                    INSERT INTO calendar_events (id, tenant_id, owner_user_id, kind, start_at,
                                                 time_zone)
                    SELECT gen_random_uuid(), gen_random_uuid(), gen_random_uuid(), 'Task',
                           now() + interval '1 hour', 'UTC'
                      FROM generate_series(1, :n)
                    RETURNING id
                )
                INSERT INTO event_reminders (id, calendar_event_id, offset_minutes, due_at)
                SELECT gen_random_uuid(), id, 60, clock_timestamp() FROM ev
                """
            ),
            {"n": n},
        )


def status(engine: Engine, reminder_id: uuid.UUID) -> str:
    with engine.connect() as conn:
        return str(
            conn.execute(
                sa.text("SELECT status FROM event_reminders WHERE id = :id"), {"id": reminder_id}
            ).scalar_one()
        )


def oldest_ids(engine: Engine, n: int) -> list[uuid.UUID]:
    with engine.connect() as conn:
        return list(
            conn.execute(
                sa.text(
                    "SELECT id FROM event_reminders WHERE status = 'Pending' "
                    "ORDER BY due_at, id LIMIT :n"
                ),
                {"n": n},
            ).scalars()
        )


def test_the_next_cycle_reads_none_of_the_rows_dispatched_before_it(engine, database_url):
    bulk_due(engine, 3000)
    with held_snapshot(database_url):
        first = cycle.run_cycle(engine, None, batch_size=200, max_batches=100)
        assert first.counts.sent == 3000 and first.backlog_remaining == 0
        due_now(engine, 150)
        as_of = cycle.database_now(engine)
        with engine.begin() as conn:
            start = scan_start(conn)
            assert not start.full_sweep  # a snapshot older than the floor is open
            before = entries_read(conn)
            selection = cycle.lock_due(conn, as_of, 200)
            selected = entries_read(conn) - before
            conn.rollback()
        with engine.begin() as conn:
            before = entries_read(conn)
            reserved = repository.reserve_due(conn, as_of, 200, "run-x", 30, start.start)
            reserving = entries_read(conn) - before
            before = entries_read(conn)
            backlog = repository.backlog(conn, as_of)
            counting = entries_read(conn) - before
            conn.rollback()
    assert len(selection.rows) == len(reserved.ids) == backlog.count == 150
    # Each read the 150 live entries (the passed-over count a second time), none of the 3,000
    # dispatched before (from the oldest end, each read more than 3,000).
    assert selected < 600 and reserving < 600 and counting < 400, (selected, reserving, counting)


def test_batch_after_batch_each_scan_starts_where_the_last_stopped(engine, database_url):
    bulk_due(engine, 2000)
    as_of = cycle.database_now(engine)
    with held_snapshot(database_url):
        start = repository.SCAN_START
        reads = []
        for _ in range(10):
            with engine.begin() as conn:
                before = entries_read(conn)
                selection = cycle.lock_due(conn, as_of, 200, start)
                reads.append(entries_read(conn) - before)
                cycle.write_rows(conn, selection.rows, as_of)
            start = selection.next_from
    assert reads[-1] < 2 * 200 + 10, reads  # the 10th batch read its own 200, not 1,800 more
    assert max(reads) < 2 * 200 + 10, reads
    assert all(r["status"] != "Pending" for r in reminders(engine))


def test_a_row_another_transaction_held_is_taken_by_the_next_cycle(engine, database_url):
    bulk_due(engine, 500)
    held = oldest_ids(engine, 300)[-1]  # in the middle of the due rows
    with held_snapshot(database_url):
        with engine.connect() as holder:
            holder.execute(
                sa.text("SELECT id FROM event_reminders WHERE id = :id FOR UPDATE"), {"id": held}
            )
            first = cycle.run_cycle(engine, None, batch_size=100, max_batches=100)
            holder.rollback()
        assert first.counts.sent == 499 and first.counts.skipped_locked >= 1
        assert status(engine, held) == "Pending"
        second = cycle.run_cycle(engine, None, batch_size=100, max_batches=100)
    assert not second.full_sweep  # the floor found it, not a sweep from the oldest end
    assert second.counts.sent == 1 and status(engine, held) == "Sent"


def test_rows_a_dead_run_reserved_are_taken_once_the_reservation_ends(engine, database_url):
    bulk_due(engine, 400)
    with held_snapshot(database_url):
        dead = cycle.start("run-dead", engine=engine, batch_size=100)
        reserved = cycle.select(engine, dead).ids  # ... and the run dies before its write
        first = cycle.run_cycle(engine, None, batch_size=100, max_batches=100)
        assert first.counts.sent == 300 and first.counts.skipped_locked >= 100
        with engine.begin() as conn:  # the reservation runs out
            conn.execute(sa.text("UPDATE event_reminders SET reserved_until = now()"))
        second = cycle.run_cycle(engine, None, batch_size=100, max_batches=100)
    assert not second.full_sweep
    assert second.counts.sent == 100
    assert {status(engine, uuid.UUID(i)) for i in reserved} == {"Sent"}


def test_a_poison_row_is_taken_when_its_back_off_ends(engine, database_url):
    poison = make_due_event(engine, minutes_overdue=30, kind=POISON_KIND)
    [row] = reminders(engine, poison)
    bulk_due(engine, 300)
    with held_snapshot(database_url):
        first = cycle.run_cycle(engine, None, batch_size=100, max_batches=100)
        assert first.counts.failed == 1 and first.counts.sent == 300
        with engine.begin() as conn:  # the calendar fixes the event
            conn.execute(sa.text("UPDATE calendar_events SET kind = 'Meeting'"))
        backing_off = cycle.run_cycle(engine, None, batch_size=100, max_batches=100)
        assert backing_off.counts.sent == 0 and status(engine, row["id"]) == "Pending"
        with engine.begin() as conn:  # its back-off ends
            conn.execute(sa.text("UPDATE event_reminders SET next_attempt_at = now()"))
        ended = cycle.run_cycle(engine, None, batch_size=100, max_batches=100)
    assert not ended.full_sweep  # behind the floor: taken from the poison rows' own index
    assert ended.counts.sent == 1 and status(engine, row["id"]) == "Sent"


@pytest.mark.parametrize("snapshot", [False, True])
def test_a_row_written_behind_the_floor_is_taken_by_a_full_sweep(engine, database_url, snapshot):
    bulk_due(engine, 200)
    held = held_snapshot(database_url) if snapshot else None
    if held is not None:
        held.__enter__()
    try:
        cycle.run_cycle(engine, None, batch_size=100, max_batches=100)
        late = make_due_event(engine, minutes_overdue=60)  # written already overdue
        if snapshot:
            # With an old snapshot open, the cycles start at the floor until a full sweep is due.
            skipped = cycle.run_cycle(engine, None, batch_size=100, max_batches=100)
            assert not skipped.full_sweep and skipped.counts.sent == 0
            with engine.begin() as conn:
                conn.execute(
                    sa.text(
                        "UPDATE due_scan_position SET swept_at = now() - CAST(:age AS interval)"
                    ),
                    {"age": f"{FULL_SWEEP_SECONDS + 1} seconds"},
                )
        swept = cycle.run_cycle(engine, None, batch_size=100, max_batches=100)
    finally:
        if held is not None:
            held.__exit__(None, None, None)
    assert swept.full_sweep and swept.counts.sent == 1
    assert reminders(engine, late)[0]["status"] == "Sent"


UNPUBLISHED_INDEX = "ix_outbox_unpublished"


def outbox_entries_read(conn: Connection) -> int:
    """Entries of the index of unpublished outbox ids that this transaction's scans have read."""
    return int(
        conn.execute(
            sa.text("SELECT pg_stat_get_xact_tuples_returned(CAST(:index AS regclass))"),
            {"index": UNPUBLISHED_INDEX},
        ).scalar_one()
    )


def test_the_relay_reads_from_its_low_water_mark_not_the_rows_published_before(
    engine, database_url, publisher
):
    bulk_due(engine, 3000)
    with held_snapshot(database_url):
        first = cycle.run_cycle(engine, publisher, batch_size=500, max_batches=100)
        assert first.counts.sent == first.relay.published == 3000
        due_now(engine, 100)
        written = cycle.run_cycle(engine, None)  # in the outbox, not yet published
        assert written.counts.sent == 100 and written.outbox_unpublished == 100
        with engine.connect() as conn:
            low = outbox_repository.relay_low_water(conn)
            before = outbox_entries_read(conn)
            read = outbox_repository.unpublished(conn, 1000, low=low)
            reading = outbox_entries_read(conn) - before
            before = outbox_entries_read(conn)
            older, _ = outbox_repository.first_unpublished_before(conn, low, read.messages[-1].id)
            checking = outbox_entries_read(conn) - before
            before = outbox_entries_read(conn)
            lag = outbox_repository.outbox_lag(conn)
            lagging = outbox_entries_read(conn) - before
        assert len(read.messages) == lag.unpublished == 100 and older == read.messages[0].id
        # The 100 unpublished entries, not the 3,000 published before (each read them all).
        assert reading < 300 and checking < 300 and lagging < 300, (reading, checking, lagging)
        relayed = cycle.run_cycle(engine, publisher)
    assert relayed.relay.published == 100 and relayed.outbox_unpublished == 0
