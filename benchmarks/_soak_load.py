"""The soak's calendar workload: events created, cancelled and moved while their reminders fall due.

A compressed calendar: one real minute stands for a quarter hour, so the hour's :00 and :30, when
events start, come every other real minute; a burst of ``burst`` reminders falls due exactly on
each even minute (the tick's second), on top of ``rate`` a minute due at random seconds. Each event
(one reminder, offset 5, 10 or 15 minutes; a client on 30 %) is created about ``LEAD_SECONDS``
before its reminder falls due through the calendar stand-in (``reminder_pipeline.local.calendar``);
5 % are cancelled and 5 % moved at a random moment from 20 s before DueAt to 5 s after (racing
the dispatcher's tick). A call that fails (the database restarting) is retried each second while it
still makes sense; a cancel is recorded with the moment it returned, an upper bound of its commit.
"""

from __future__ import annotations

import heapq
import random
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from reminder_pipeline.local.calendar import NewEvent, cancel_event, create_event, reschedule_event
from reminder_pipeline.store.engine import make_engine

LEAD_SECONDS = 45.0
OFFSETS = (5, 10, 15)
KINDS = ("Showing", "Consultation", "Meeting", "Task")
ZONES = ("Europe/Moscow", "Asia/Vladivostok", "Europe/Kaliningrad", "UTC")


@dataclass
class EventRecord:
    """What the workload did to one event (the database holds its reminders)."""

    event_id: uuid.UUID
    due: float
    offset: int
    fate: str  # keep | cancel | move
    created: bool = False
    cancelled_at: float | None = None  # when cancel_event returned: the commit was before
    moves: int = 0


@dataclass(order=True)
class _Action:
    at: float
    seq: int
    what: str = field(compare=False)
    record: EventRecord = field(compare=False)
    deadline: float = field(compare=False, default=0.0)
    new_due: float = field(compare=False, default=0.0)


def due_times(seed: int, start: float, end: float, rate: float, burst: int) -> list[float]:
    """Due moments (epoch) between ``start`` and ``end``: Poisson ``rate``/min plus the bursts."""
    rng = random.Random(f"soak-load:{seed}")
    out = []
    t = start
    while rate > 0:
        t += rng.expovariate(rate / 60.0)
        if t >= end:
            break
        out.append(t)
    minute = (int(start) // 60 + 1) * 60
    while minute < end:
        if (minute // 60) % 2 == 0:
            out.extend([float(minute)] * burst)
        minute += 60
    return sorted(out)


class Workload(threading.Thread):
    """Runs the calendar's calls in time order on its own engine until ``end`` (or stopped)."""

    def __init__(
        self, url: str, seed: int, start: float, end: float, rate: float, burst: int
    ) -> None:
        super().__init__(name="soak-workload", daemon=True)
        self.engine = make_engine(url, pool_size=2, application_name="soak-calendar")
        self.rng = random.Random(f"soak-fates:{seed}")
        self.events: dict[uuid.UUID, EventRecord] = {}
        self.errors = 0
        self.abandoned: dict[str, int] = {"create": 0, "cancel": 0, "move": 0}
        self.stopped = threading.Event()
        self._queue: list[_Action] = []
        self._seq = 0
        for due in due_times(seed, start + LEAD_SECONDS, end, rate, burst):
            record = EventRecord(
                uuid.uuid4(), due, self.rng.choice(OFFSETS), self._fate(), created=False
            )
            self._push(due - LEAD_SECONDS, "create", record, deadline=due - 5)
        self.end = end

    def _fate(self) -> str:
        x = self.rng.random()
        return "cancel" if x < 0.05 else "move" if x < 0.10 else "keep"

    def _push(self, at: float, what: str, record: EventRecord, **kw: float) -> None:
        self._seq += 1
        heapq.heappush(self._queue, _Action(at, self._seq, what, record, **kw))

    def run(self) -> None:
        while self._queue and not self.stopped.is_set():
            action = self._queue[0]
            wait = action.at - time.time()
            if wait > 0 and self.stopped.wait(min(wait, 1.0)):
                return
            if wait > 0:
                continue
            heapq.heappop(self._queue)
            try:
                self._do(action)
            except Exception:  # noqa: BLE001 - the database is restarting: retry while it makes sense
                self.errors += 1
                if time.time() + 1 < action.deadline:
                    action.at = time.time() + 1
                    heapq.heappush(self._queue, action)
                else:
                    self.abandoned[action.what] += 1

    def _do(self, action: _Action) -> None:
        record = action.record
        if action.what == "create":
            self._create(record)
            # Cancel/move from 20 s before DueAt to 5 s after: before, at and after the tick.
            if record.fate != "keep":
                at = record.due + self.rng.uniform(-20.0, 5.0)
                new_due = record.due + self.rng.uniform(10.0, 60.0)
                self._push(at, record.fate, record, deadline=record.due + 60, new_due=new_due)
        elif action.what == "cancel":
            cancel_event(self.engine, record.event_id)
            record.cancelled_at = time.time()
        elif action.what == "move":
            reschedule_event(
                self.engine,
                record.event_id,
                datetime.fromtimestamp(action.new_due, UTC) + timedelta(minutes=record.offset),
            )
            record.moves += 1

    def _create(self, record: EventRecord) -> None:
        due = datetime.fromtimestamp(record.due, UTC)
        rng = self.rng
        self.events[record.event_id] = record  # before the call: it may commit and then fail
        create_event(
            self.engine,
            NewEvent(
                id=record.event_id,
                tenant_id=uuid.UUID(int=0x50AC + rng.randrange(3)),
                owner_user_id=uuid.uuid4(),
                client_user_id=uuid.uuid4() if rng.random() < 0.3 else None,
                kind=rng.choice(KINDS),
                start_at=due + timedelta(minutes=record.offset),
                time_zone=rng.choice(ZONES),
            ),
            (record.offset,),
        )
        record.created = True

    def stop(self) -> None:
        self.stopped.set()
        self.join(30)
        self.engine.dispose()
