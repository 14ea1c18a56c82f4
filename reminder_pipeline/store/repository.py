"""Repository functions: each on a Connection (the caller's transaction), rows to domain records."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from operator import itemgetter
from typing import Any, NamedTuple

import orjson
import sqlalchemy as sa
from sqlalchemy.engine import Connection

from ..domain.model import (
    DueReminder,
    EventStatus,
    PoisonRow,
    ReminderStatus,
)
from . import queries
from .tables import calendar_events, event_reminders

POISON_BACKOFF_BASE_SECONDS = 30
POISON_BACKOFF_CAP_SECONDS = 3600


class ScanPosition(NamedTuple):
    """A position in the due index's order (due_at, id), where a scan starts: ``due_at`` as the
    database writes it (text: a DueAt out of Python's range is a position like any other)."""

    due_at: str
    reminder_id: str


#: The due index's oldest end: a scan from here reads every entry (a full sweep).
SCAN_START = ScanPosition("-infinity", "00000000-0000-0000-0000-000000000000")


def scan_position_at(moment: datetime) -> ScanPosition:
    """The position just before every row due at ``moment`` or later."""
    return ScanPosition(moment.isoformat(), SCAN_START.reminder_id)


def scan_params(position: ScanPosition = SCAN_START) -> dict[str, str]:
    """The bind parameters of a scan's start (``:from_due_at``, ``:from_id``)."""
    return {"from_due_at": position.due_at, "from_id": position.reminder_id}


def _next(row: Any, position: ScanPosition) -> ScanPosition:
    """Where the batch after a scan starts: the furthest row it took, else where it started."""
    if row is None or row.next_id is None:
        return position
    return ScanPosition(row.next_due_at, row.next_id)


@dataclass(frozen=True)
class DueBatch:
    """Due rows locked by the caller's transaction, oldest first, the rows others held, and where
    the next batch's scan starts."""

    rows: list[DueReminder]
    skipped_locked: int
    next_from: ScanPosition = SCAN_START


def _by_name(
    result: sa.CursorResult[Any], names: Sequence[str]
) -> Callable[[Any], tuple[Any, ...]]:
    """The named columns of a result's rows, as a tuple in ``names``' order (looked up by name
    once per result, then read by index: a batch reads 1,000 rows)."""
    where = {name: i for i, name in enumerate(result.keys())}
    get = itemgetter(*(where[name] for name in names))
    return lambda row: get(row)


def _due_reminders(result: sa.CursorResult[Any]) -> tuple[list[DueReminder], Sequence[Any]]:
    """The due rows of a lock-and-read statement, each read from the columns of its fields'
    names, and the statement's raw rows (for the counts a selection carries on each)."""
    fields_of = _by_name(result, DueReminder._fields)
    rows = result.all()
    make = DueReminder._make
    # A selection that took nothing answers one row all the same: its count of rows held
    # elsewhere, with no reminder (a NULL id).
    return [make(fields_of(r)) for r in rows if r.reminder_id is not None], rows


def select_due_for_update_skip_locked(
    conn: Connection, as_of: datetime, batch_size: int, start: ScanPosition = SCAN_START
) -> DueBatch:
    """Lock and read up to ``batch_size`` due Pending rows, oldest first from ``start`` (and poison
    rows due again behind it), each with its event's fields, skipping rows locked elsewhere (how
    many: ``skipped_locked``, exact)."""
    result = conn.execute(
        queries.SELECT_DUE_FOR_UPDATE_SKIP_LOCKED,
        {"as_of": as_of, "batch_size": batch_size, **scan_params(start)},
    )
    locked, rows = _due_reminders(result)
    first = rows[0] if rows else None
    skipped = int(first.skipped_locked) if first is not None else 0
    return DueBatch(locked, skipped, _next(first, start))


@dataclass(frozen=True)
class Reservation:
    """Due rows reserved for a run (ids, oldest first), the rows others held, and where the next
    batch's scan starts."""

    ids: list[str]
    skipped_locked: int
    next_from: ScanPosition = SCAN_START


def reserve_due(
    conn: Connection,
    as_of: datetime,
    batch_size: int,
    run_id: str,
    seconds: float,
    start: ScanPosition = SCAN_START,
) -> Reservation:
    """Reserve up to ``batch_size`` due rows from ``start`` for ``run_id`` for ``seconds`` (see
    RESERVE_DUE)."""
    row = conn.execute(
        queries.RESERVE_DUE,
        {
            "as_of": as_of,
            "batch_size": batch_size,
            "run_id": run_id,
            "seconds": seconds,
            **scan_params(start),
        },
    ).one()
    return Reservation(list(row.ids), int(row.skipped_locked), _next(row, start))


@dataclass(frozen=True)
class DueScanFloor:
    """The floor the last cycle left (due_scan_position), and how old it is."""

    position: ScanPosition
    #: Transactions begun since it was written (a snapshot holding an xmin older than that many
    #: transactions may still see the rows dispatched behind it).
    xids_since: int
    #: Seconds since a cycle last swept the due index from its oldest end (None: never).
    seconds_since_sweep: float | None


def due_scan_floor(conn: Connection) -> DueScanFloor | None:
    """The due scan's floor, None before the first cycle wrote one."""
    row = conn.execute(queries.DUE_SCAN_POSITION).first()
    if row is None:
        return None
    since = row.seconds_since_sweep
    return DueScanFloor(
        ScanPosition(row.due_at, row.reminder_id),
        int(row.xids_since),
        None if since is None else float(since),
    )


def set_due_scan_floor(conn: Connection, position: ScanPosition, *, swept: bool) -> None:
    """Write the floor the next cycle starts at (``swept``: the cycle swept from the oldest end)."""
    conn.execute(
        queries.SET_DUE_SCAN_POSITION,
        {"due_at": position.due_at, "reminder_id": position.reminder_id, "swept": swept},
    )


def first_pending_from(
    conn: Connection, start: ScanPosition, as_of: datetime
) -> ScanPosition | None:
    """The first Pending row (not backing off) due before ``as_of`` at or after ``start``."""
    row = conn.execute(queries.FIRST_PENDING_FROM, {"as_of": as_of, **scan_params(start)}).first()
    return None if row is None else ScanPosition(row.due_at, row.reminder_id)


def select_candidates_for_update_skip_locked(
    conn: Connection, ids: Sequence[str], as_of: datetime, reserved_by: str | None = None
) -> list[DueReminder]:
    """Lock and read the given candidates that are still Pending, due and not another run's,
    each with its event's fields, oldest first."""
    if not ids:
        return []
    result = conn.execute(
        queries.LOCK_CANDIDATES_SKIP_LOCKED,
        {"ids": list(ids), "as_of": as_of, "reserved_by": reserved_by},
    )
    return _due_reminders(result)[0]


def preview_event_statuses(conn: Connection, ids: Sequence[str]) -> dict[str, str]:
    """Each reminder's event status, read without a lock (the rows still there)."""
    if not ids:
        return {}
    rows = conn.execute(queries.PREVIEW_EVENT_STATUSES, {"ids": list(ids)}).all()
    return {r.reminder_id: r.event_status for r in rows}


def count_still_pending(conn: Connection, ids: Iterable[str]) -> int:
    """How many of ``ids`` are still Pending (committed state, no lock taken)."""
    ids = list(ids)
    if not ids:
        return 0
    return int(conn.execute(queries.COUNT_STILL_PENDING, {"ids": ids}).scalar_one())


# SQLSTATE classes that belong to a row's data, not to the infrastructure: the only refusals a
# batch's write finds row by row (each row written alone, rolled back), so that only the
# offending row is left out.
_DATA_ERROR_CLASSES = ("22", "23")


def data_error(error: sa.exc.DBAPIError) -> str | None:
    """The SQLSTATE of a data error (the row's fault), None for anything else."""
    sqlstate = getattr(error.orig, "sqlstate", None) or ""
    return sqlstate if sqlstate[:2] in _DATA_ERROR_CLASSES else None


def set_savepoint(conn: Connection) -> None:
    """Set the savepoint a batch's write runs in (queries.SET_BATCH_SAVEPOINT)."""
    conn.exec_driver_sql(queries.SET_BATCH_SAVEPOINT)


def roll_back_to_savepoint(conn: Connection) -> None:
    """Undo what the transaction did since :func:`set_savepoint` (a refused write)."""
    conn.exec_driver_sql(queries.ROLL_BACK_TO_BATCH_SAVEPOINT)


class WrittenRow(NamedTuple):
    """One reminder a batch's write moved out of Pending, with its outbox row if Sent (read by
    column name)."""

    reminder_id: str
    status: str
    lateness_seconds: float | None
    outbox_id: int | None


def write_verdicts(
    conn: Connection,
    as_of: datetime,
    verdicts: Sequence[tuple[str, str | None]],
    *,
    topic: str,
    headers: dict[str, str],
    moved_by: str,
    moved_in_run: str | None,
    now: datetime | None = None,
) -> dict[str, WrittenRow]:
    """Write a batch's verdicts in one statement (WRITE_VERDICTS): ``verdicts`` are (reminder id,
    message) of rows this transaction holds locked, the message's text for a send, None for a
    skip. Each moved row records ``moved_by`` (the writer) and ``moved_in_run`` (its run id).
    Returns the rows that moved, by reminder id. Errors propagate (:func:`data_error`)."""
    # The messages are JSON text already (domain/payload.py): the object is joined, not encoded
    # again. Ids are uuids' canonical text: nothing to escape.
    document = ",".join(f'"{reminder_id}":{text or "null"}' for reminder_id, text in verdicts)
    result = conn.execute(
        queries.WRITE_VERDICTS,
        {
            "verdicts": "{" + document + "}",
            "as_of": as_of,
            "now": now,
            "topic": topic,
            "headers": orjson.dumps(headers).decode(),
            "moved_by": moved_by,
            "moved_in_run": moved_in_run,
        },
    )
    written = _by_name(result, WrittenRow._fields)
    make = WrittenRow._make
    return {w.reminder_id: w for w in (make(written(r)) for r in result.all())}


def record_poison(
    conn: Connection, poison: Sequence[PoisonRow], now: datetime | None = None
) -> None:
    """Count a failed attempt on each row; back off from the database's clock (or ``now``)."""
    if not poison:
        return
    conn.execute(
        queries.RECORD_POISON,
        {
            "ids": [p.reminder_id for p in poison],
            "errors": [p.error[:500] for p in poison],
            "now": now,
            "base_seconds": POISON_BACKOFF_BASE_SECONDS,
            "cap_seconds": POISON_BACKOFF_CAP_SECONDS,
        },
    )


@dataclass(frozen=True)
class Backlog:
    """Due Pending rows left, and how old the oldest one is."""

    count: int
    oldest_due_age_seconds: float | None


def database_clock(conn: Connection) -> datetime:
    """The database server's clock now (the one clock of a cycle)."""
    value: datetime = conn.execute(queries.DATABASE_CLOCK).scalar_one()
    return value


def backlog(conn: Connection, as_of: datetime, due_before: datetime | None = None) -> Backlog:
    """Pending rows due before ``due_before`` (by default ``as_of``) not yet processed, and the
    oldest one's age at ``as_of``."""
    params = {"as_of": as_of, "due_before": as_of if due_before is None else due_before}
    row = conn.execute(queries.BACKLOG, params).one()
    age = row.oldest_due_age_seconds
    return Backlog(
        count=int(row.backlog), oldest_due_age_seconds=None if age is None else float(age)
    )


# --- calendar side -----------------------------------------------------------------------


def insert_event(conn: Connection, values: dict[str, Any]) -> None:
    """Insert one calendar event row."""
    conn.execute(sa.insert(calendar_events).values(**values))


def insert_reminders(conn: Connection, rows: Sequence[dict[str, Any]]) -> None:
    """Insert reminder rows."""
    if rows:
        conn.execute(sa.insert(event_reminders), list(rows))


def lock_event(conn: Connection, event_id: uuid.UUID) -> sa.Row[Any, Any, Any] | None:
    """Lock an event row (FOR UPDATE) and return its start, zone and status."""
    return conn.execute(
        sa.select(
            calendar_events.c.id,
            calendar_events.c.status,
            calendar_events.c.start_at,
        )
        .where(calendar_events.c.id == event_id)
        .with_for_update()
    ).first()


def lock_pending_reminders(conn: Connection, event_id: uuid.UUID) -> list[uuid.UUID]:
    """Lock the event's Pending reminder rows (waiting for a dispatcher holding them)."""
    return list(
        conn.execute(
            sa.select(event_reminders.c.id)
            .where(
                event_reminders.c.calendar_event_id == event_id,
                event_reminders.c.status == ReminderStatus.PENDING.value,
            )
            .order_by(event_reminders.c.id)
            .with_for_update()
        ).scalars()
    )


def set_event_status(conn: Connection, event_id: uuid.UUID, status: EventStatus) -> None:
    """Change an event's status."""
    conn.execute(
        sa.update(calendar_events)
        .where(calendar_events.c.id == event_id)
        .values(status=status.value, updated_at=sa.func.now())
    )


def skip_pending_reminders(conn: Connection, event_id: uuid.UUID) -> int:
    """The cancel/complete cascade: the event's Pending rows go Skipped."""
    return conn.execute(
        sa.update(event_reminders)
        .where(
            event_reminders.c.calendar_event_id == event_id,
            event_reminders.c.status == ReminderStatus.PENDING.value,
        )
        .values(status=ReminderStatus.SKIPPED.value, updated_at=sa.func.now())
    ).rowcount


def delete_pending_reminders(conn: Connection, event_id: uuid.UUID) -> list[int]:
    """Delete the event's Pending rows; returns their offsets."""
    return list(
        conn.execute(
            sa.delete(event_reminders)
            .where(
                event_reminders.c.calendar_event_id == event_id,
                event_reminders.c.status == ReminderStatus.PENDING.value,
            )
            .returning(event_reminders.c.offset_minutes)
        ).scalars()
    )


def reminder_offsets(conn: Connection, event_id: uuid.UUID) -> list[int]:
    """Distinct offsets of all the event's reminder rows."""
    return sorted(
        set(
            conn.execute(
                sa.select(event_reminders.c.offset_minutes).where(
                    event_reminders.c.calendar_event_id == event_id
                )
            ).scalars()
        )
    )


def move_event(conn: Connection, event_id: uuid.UUID, start_at: datetime) -> None:
    """Set an event's new start."""
    conn.execute(
        sa.update(calendar_events)
        .where(calendar_events.c.id == event_id)
        .values(start_at=start_at, updated_at=sa.func.now())
    )
