"""The calendar side: creating, cancelling, completing and rescheduling events and their reminders.

Each call is one transaction. Cancel and complete lock the event's Pending rows before touching
them, like the design's cascade: a dispatcher holding a row makes the cascade wait, and a row the
cascade holds is skipped by the dispatcher (SKIP LOCKED).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy.engine import Engine

from ..domain.model import EventOrigin, EventStatus, ReminderStatus
from ..store import repository


class CalendarError(ValueError):
    """A calendar call was given bad input (unknown event, bad offset, naive datetime)."""


@dataclass(frozen=True)
class NewEvent:
    """What the calendar knows about an event when it is created."""

    tenant_id: uuid.UUID
    owner_user_id: uuid.UUID
    kind: str
    start_at: datetime
    time_zone: str
    client_user_id: uuid.UUID | None = None
    origin: str = EventOrigin.MANUAL.value
    appointment_id: uuid.UUID | None = None
    status: str = EventStatus.PLANNED.value
    title: str | None = None
    description: str | None = None
    location: str | None = None
    id: uuid.UUID = field(default_factory=uuid.uuid4)


def _aware(value: datetime, name: str) -> datetime:
    if value.tzinfo is None:
        raise CalendarError(f"{name} must be timezone-aware")
    return value


def born_pending(due_at: datetime, now: datetime) -> bool:
    """Whether a reminder due at ``due_at`` is materialised Pending at ``now``; else Skipped,
    its time already passed (contract: "offset in the past at materialisation")."""
    return due_at > now


def materialise(
    event_id: uuid.UUID, start_at: datetime, offsets: Iterable[int], now: datetime
) -> list[dict[str, Any]]:
    """One reminder row per distinct offset, due at ``start_at - offset``.

    An offset whose due time has already passed at creation is materialised Skipped: it is
    never published (contract: "offset in the past at materialisation").
    """
    rows = []
    for offset in sorted(set(offsets), reverse=True):
        if not isinstance(offset, int) or offset < 0:
            raise CalendarError(f"reminder offset {offset!r} must be a non-negative integer")
        due_at = start_at - timedelta(minutes=offset)
        status = ReminderStatus.PENDING if born_pending(due_at, now) else ReminderStatus.SKIPPED
        rows.append(
            {
                "id": uuid.uuid4(),
                "calendar_event_id": event_id,
                "offset_minutes": offset,
                "due_at": due_at,
                "status": status.value,
            }
        )
    return rows


def create_event(
    engine: Engine, event: NewEvent, offsets: Iterable[int], *, now: datetime | None = None
) -> uuid.UUID:
    """Create an event and its reminder rows in one transaction; returns the event id."""
    now = _aware(now, "now") if now else datetime.now(UTC)
    _aware(event.start_at, "start_at")
    rows = materialise(event.id, event.start_at, offsets, now)
    with engine.begin() as conn:
        repository.insert_event(
            conn,
            {
                "id": event.id,
                "tenant_id": event.tenant_id,
                "owner_user_id": event.owner_user_id,
                "client_user_id": event.client_user_id,
                "kind": event.kind,
                "status": event.status,
                "origin": event.origin,
                "appointment_id": event.appointment_id,
                "start_at": event.start_at,
                "time_zone": event.time_zone,
                "title": event.title,
                "description": event.description,
                "location": event.location,
            },
        )
        repository.insert_reminders(conn, rows)
    return event.id


def _close_event(engine: Engine, event_id: uuid.UUID, status: EventStatus) -> int:
    with engine.begin() as conn:
        if repository.lock_event(conn, event_id) is None:
            raise CalendarError(f"calendar event {event_id} does not exist")
        repository.lock_pending_reminders(conn, event_id)
        repository.set_event_status(conn, event_id, status)
        return repository.skip_pending_reminders(conn, event_id)


def cancel_event(engine: Engine, event_id: uuid.UUID) -> int:
    """Cancel an event: its Pending reminders go Skipped. Returns how many were skipped."""
    return _close_event(engine, event_id, EventStatus.CANCELLED)


def complete_event(engine: Engine, event_id: uuid.UUID) -> int:
    """Complete an event: its Pending reminders go Skipped. Returns how many were skipped."""
    return _close_event(engine, event_id, EventStatus.COMPLETED)


def reschedule_event(
    engine: Engine,
    event_id: uuid.UUID,
    new_start_at: datetime,
    offsets: Iterable[int] | None = None,
    *,
    now: datetime | None = None,
) -> list[uuid.UUID]:
    """Move an event: its Pending rows are deleted and re-materialised for the new start.

    ``offsets`` defaults to every offset the event has had. Rows already Sent or Skipped stay
    as history. Returns the ids of the new reminder rows.
    """
    _aware(new_start_at, "new_start_at")
    return _reschedule(engine, event_id, lambda _start: new_start_at, offsets, now)


def move_event_by(
    engine: Engine, event_id: uuid.UUID, delta: timedelta, *, now: datetime | None = None
) -> list[uuid.UUID]:
    """Move an event by ``delta`` from its start as stored, like :func:`reschedule_event`."""
    return _reschedule(engine, event_id, lambda start: start + delta, None, now)


def _reschedule(
    engine: Engine,
    event_id: uuid.UUID,
    new_start: Callable[[datetime], datetime],
    offsets: Iterable[int] | None,
    now: datetime | None,
) -> list[uuid.UUID]:
    now = _aware(now, "now") if now else datetime.now(UTC)
    with engine.begin() as conn:
        locked = repository.lock_event(conn, event_id)
        if locked is None:
            raise CalendarError(f"calendar event {event_id} does not exist")
        wanted = (
            list(offsets) if offsets is not None else repository.reminder_offsets(conn, event_id)
        )
        new_start_at = new_start(locked.start_at)
        repository.lock_pending_reminders(conn, event_id)
        repository.delete_pending_reminders(conn, event_id)
        repository.move_event(conn, event_id, new_start_at)
        rows = materialise(event_id, new_start_at, wanted, now)
        repository.insert_reminders(conn, rows)
    return [r["id"] for r in rows]
