"""Demo data: a healthy calendar whose reminders fall due in the coming minutes at a steady rate.

Every check on the dispatcher is green on it, truly: reminders fall due after the dispatcher is
there, one scheduled run a minute sends them within seconds to a minute of their DueAt, and a few
events are cancelled or moved as people do (:mod:`.calendar`). Reminders that are already overdue
(a catch-up to watch, which the lateness check rightly reports) come only when asked for
(``demo --overdue N``).

The text fields are filled with PII-looking values on purpose: they must never show up in a
message or a log line, and the running system makes that visible.
"""

from __future__ import annotations

import logging
import random
import threading
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy.engine import Engine

from ..domain.model import EventKind, EventOrigin
from ..logs import event
from .calendar import (
    CalendarError,
    NewEvent,
    born_pending,
    cancel_event,
    complete_event,
    create_event,
    move_event_by,
)

log = logging.getLogger(__name__)

TENANTS = [uuid.UUID(int=0xA1 + i) for i in range(3)]
OWNERS = [uuid.UUID(int=0xB1 + i) for i in range(5)]
ZONES = ["Europe/Moscow", "Asia/Yekaterinburg", "Europe/Kaliningrad", "Asia/Vladivostok", "UTC"]

#: Events whose shortest reminder falls due per minute, evenly spaced.
RATE_PER_MINUTE = 6
#: How far ahead the feeder keeps the calendar laid out.
HORIZON = timedelta(minutes=10)
#: Reminders due just before the first cycle (sent by it, seconds late).
DUE_NOW = 3
#: How many minutes later the feeder moves an event, at most and at least.
MOVE_MINUTES = (2, 5)


def _one(
    engine: Engine, rng: random.Random, now: datetime, due_in: timedelta
) -> tuple[uuid.UUID, str, int]:
    """One event whose shortest reminder falls due ``due_in`` from ``now``; returns (id, fate,
    how many of its reminders are Pending).

    Most stay planned; a few are cancelled or completed at once (their reminders go Skipped).
    """
    offsets = rng.choice([(15,), (60,), (60, 15), (1440, 60)])
    start_at = now + due_in + timedelta(minutes=min(offsets))
    appointment = rng.random() < 0.3
    client = appointment or rng.random() < 0.3
    new = NewEvent(
        tenant_id=rng.choice(TENANTS),
        owner_user_id=rng.choice(OWNERS),
        client_user_id=uuid.uuid4() if client else None,
        kind=rng.choice([k.value for k in EventKind]),
        origin=EventOrigin.APPOINTMENT.value if appointment else EventOrigin.MANUAL.value,
        appointment_id=uuid.uuid4() if appointment else None,
        start_at=start_at,
        time_zone=rng.choice(ZONES),
        title="Demo: viewing with Ivan Petrov",
        description="Phone +7 900 000-00-00, bring the keys",
        location="Tverskaya 1, apt 42",
    )
    # Created just before its shortest reminder falls due: the longer offsets are already in the
    # past at creation and are materialised Skipped, as the calendar does (never published).
    due = now + due_in
    created = min(now, due - timedelta(seconds=30))
    event_id = create_event(engine, new, offsets, now=created)
    fate = rng.choices(["live", "cancelled", "completed"], weights=[9, 0.7, 0.3])[0]
    if fate == "cancelled":
        cancel_event(engine, event_id)
    elif fate == "completed":
        complete_event(engine, event_id)
    pending = sum(born_pending(start_at - timedelta(minutes=o), created) for o in set(offsets))
    return event_id, fate, pending if fate == "live" else 0


#: Upcoming events ``demo`` alone lays out (five minutes' worth at RATE_PER_MINUTE).
DEFAULT_UPCOMING = 30


def seed_plan(overdue: int | None, upcoming: int | None) -> dict[str, int]:
    """How many events of each kind ``demo`` makes: exactly those asked for (``None``: not
    given); given neither, the default calendar (DUE_NOW due now, DEFAULT_UPCOMING upcoming)."""
    if overdue is None and upcoming is None:
        return {"overdue": 0, "due_now": DUE_NOW, "upcoming": DEFAULT_UPCOMING}
    return {"overdue": overdue or 0, "due_now": 0, "upcoming": upcoming or 0}


#: How far back an overdue demo reminder fell due, and a "due now" one (seconds, at most).
OVERDUE_AGO_SECONDS = (5.0, 300.0)
DUE_NOW_AGO_SECONDS = (1.0, 20.0)
#: The kinds of demo event a seed makes, by when their reminder falls due, in words.
SEED_KINDS = {
    "overdue": f"due up to {OVERDUE_AGO_SECONDS[1] / 60:g} minutes ago: the next cycle sends them "
    "late (a catch-up)",
    "due_now": f"due in the last {DUE_NOW_AGO_SECONDS[1]:g} seconds: the next cycle sends them",
    "upcoming": f"falling due {RATE_PER_MINUTE} a minute from a minute on",
}
#: The fates an event meets at once (``_one``): most stay planned, a few are closed.
FATES = ("live", "cancelled", "completed")


def seed(
    engine: Engine,
    *,
    overdue: int = 0,
    upcoming: int = DEFAULT_UPCOMING,
    due_now: int = DUE_NOW,
    seed_value: int | None = None,
) -> dict[str, Any]:
    """``due_now`` events due right now, ``upcoming`` falling due one every 60/RATE s from a
    minute on, and ``overdue`` ones already due up to 5 minutes ago (a catch-up).

    Returns exactly what it made: per kind, the events, their fates and their Pending reminders
    (a live event's shortest reminder falls due as its kind says; its longer offsets are Skipped
    at creation when already past, as the calendar does; a cancelled or completed event has
    none Pending), with the totals (``events``, ``live``, ``cancelled``, ``completed``).
    """
    rng = random.Random(seed_value)
    now = datetime.now(UTC)
    spacing = timedelta(minutes=1) / RATE_PER_MINUTE
    planned = {
        "overdue": [-timedelta(seconds=rng.uniform(*OVERDUE_AGO_SECONDS)) for _ in range(overdue)],
        "due_now": [-timedelta(seconds=rng.uniform(*DUE_NOW_AGO_SECONDS)) for _ in range(due_now)],
        "upcoming": [timedelta(minutes=1) + i * spacing for i in range(upcoming)],
    }
    kinds: dict[str, dict[str, int]] = {}
    for kind, dues in planned.items():
        made, pending = dict.fromkeys(FATES, 0), 0
        for due_in in dues:
            _, fate, its_pending = _one(engine, rng, now, due_in)
            made[fate] += 1
            pending += its_pending
        kinds[kind] = {"events": len(dues), "pending_reminders": pending, **made}
    totals = {fate: sum(k[fate] for k in kinds.values()) for fate in FATES}
    made_all = {"events": sum(k["events"] for k in kinds.values()), **totals, "kinds": kinds}
    event(
        log, logging.INFO, "demo data seeded", **totals, **{k: len(v) for k, v in planned.items()}
    )
    return made_all


class DemoFeeder(threading.Thread):
    """Keeps the calendar laid out HORIZON ahead at RATE_PER_MINUTE, and now and then cancels or
    moves an upcoming event, as people do."""

    def __init__(
        self,
        engine: Engine,
        *,
        every_seconds: float = 20.0,
        rate_per_minute: int = RATE_PER_MINUTE,
        horizon: timedelta = HORIZON,
    ) -> None:
        super().__init__(name="demo-feeder", daemon=True)
        self.engine = engine
        self.every_seconds = every_seconds
        self.spacing = timedelta(minutes=1) / rate_per_minute
        self.horizon = horizon
        self.stopped = threading.Event()
        self._rng = random.Random()
        self._laid_out_until: datetime | None = None
        #: Live events whose reminder is still ahead: (due, id), the ones a change can touch.
        self._upcoming: list[tuple[datetime, uuid.UUID]] = []

    def run(self) -> None:
        """Lay the calendar out at once, then every ``every_seconds`` until stopped."""
        while True:
            try:
                self.tick(datetime.now(UTC))
            except Exception as exc:  # noqa: BLE001 - keep feeding: the demo must not die on a blip
                event(log, logging.WARNING, "demo feeder failed a tick", error=type(exc).__name__)
            if self.stopped.wait(self.every_seconds):
                return

    def tick(self, now: datetime) -> None:
        """New events up to ``now + horizon``, one every ``spacing``; maybe one cancel or move."""
        due = max(self._laid_out_until or now, now + timedelta(seconds=30))
        while due < now + self.horizon:
            due += self.spacing
            event_id, fate, _ = _one(self.engine, self._rng, now, due - now)
            if fate == "live":
                self._upcoming.append((due, event_id))
        self._laid_out_until = due
        # Only events whose reminder is at least two minutes away: a change reaches them first.
        self._upcoming = [(d, e) for d, e in self._upcoming if d > now + timedelta(minutes=2)]
        roll = self._rng.random()
        if not self._upcoming or roll > 0.25:
            return
        d, event_id = self._upcoming.pop(self._rng.randrange(len(self._upcoming)))
        try:
            if roll < 0.1:
                cancel_event(self.engine, event_id)
            else:  # moved a few minutes later: its reminder is re-materialised for the new start
                minutes = self._rng.randint(*MOVE_MINUTES)
                move_event_by(self.engine, event_id, timedelta(minutes=minutes), now=now)
                self._upcoming.append((d + timedelta(minutes=minutes), event_id))
        except CalendarError:  # gone meanwhile (a `demo cancel` of it is fine)
            pass

    def stop(self, timeout: float = 30.0) -> None:
        """Stop after the current tick, and wait for it."""
        self.stopped.set()
        if self.is_alive():
            self.join(timeout)
