"""Demo data that keeps reminders falling due: live, cancelled, with clients, from appointments.

The text fields are filled with PII-looking values on purpose: they must never show up in a
message or a log line, and the running system makes that visible.
"""

from __future__ import annotations

import logging
import random
import threading
import uuid
from datetime import UTC, datetime, timedelta

from sqlalchemy.engine import Engine

from ..domain.model import EventKind, EventOrigin
from ..logs import event
from .calendar import NewEvent, cancel_event, complete_event, create_event

log = logging.getLogger(__name__)

TENANTS = [uuid.UUID(int=0xA1 + i) for i in range(3)]
OWNERS = [uuid.UUID(int=0xB1 + i) for i in range(5)]
ZONES = ["Europe/Moscow", "Asia/Yekaterinburg", "Europe/Kaliningrad", "Asia/Vladivostok", "UTC"]


def _one(
    engine: Engine, rng: random.Random, now: datetime, due_in: timedelta
) -> tuple[uuid.UUID, str]:
    """One event whose shortest reminder falls due ``due_in`` from ``now``; returns (id, fate)."""
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
    event_id = create_event(engine, new, offsets, now=min(now, due - timedelta(seconds=30)))
    fate = rng.choices(["live", "cancelled", "completed"], weights=[8, 1.5, 0.5])[0]
    if fate == "cancelled":
        cancel_event(engine, event_id)
    elif fate == "completed":
        complete_event(engine, event_id)
    return event_id, fate


def seed(
    engine: Engine, *, overdue: int = 12, upcoming: int = 30, seed_value: int | None = None
) -> dict[str, int]:
    """Events already due (for the first cycle) and events falling due over the next half hour."""
    rng = random.Random(seed_value)
    now = datetime.now(UTC)
    fates: dict[str, int] = {}
    for _ in range(overdue):
        _, fate = _one(engine, rng, now, -timedelta(seconds=rng.uniform(5, 300)))
        fates[fate] = fates.get(fate, 0) + 1
    for _ in range(upcoming):
        _, fate = _one(engine, rng, now, timedelta(seconds=rng.uniform(10, 1800)))
        fates[fate] = fates.get(fate, 0) + 1
    event(log, logging.INFO, "demo data seeded", **fates)
    return fates


class DemoFeeder(threading.Thread):
    """Keeps creating events whose reminders fall due within the next couple of minutes."""

    def __init__(self, engine: Engine, *, every_seconds: float = 20.0, per_tick: int = 2) -> None:
        super().__init__(name="demo-feeder", daemon=True)
        self.engine = engine
        self.every_seconds = every_seconds
        self.per_tick = per_tick
        self.stopped = threading.Event()
        self._rng = random.Random()

    def run(self) -> None:
        """Create ``per_tick`` events every ``every_seconds`` until stopped."""
        while not self.stopped.wait(self.every_seconds):
            try:
                now = datetime.now(UTC)
                for _ in range(self.per_tick):
                    _one(self.engine, self._rng, now, timedelta(seconds=self._rng.uniform(5, 120)))
            except Exception as exc:  # noqa: BLE001 - keep feeding: the demo must not die on a blip
                event(log, logging.WARNING, "demo feeder failed a tick", error=type(exc).__name__)

    def stop(self) -> None:
        """Stop after the current tick."""
        self.stopped.set()
