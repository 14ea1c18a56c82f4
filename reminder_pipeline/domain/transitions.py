"""The send/skip rule of the dispatcher (its one home). Which transitions a reminder may make
(Pending -> Sent/Skipped, both terminal: INV-REM-2) is kept by every statement's status
predicate (store/queries.py); the tests' oracle states it as a table and holds the cycle to it."""

from __future__ import annotations

from .model import Action, EventStatus

#: Event statuses whose due reminders are sent; every other status is skipped (fail safe).
LIVE_EVENT_STATUSES: frozenset[str] = frozenset({EventStatus.PLANNED, EventStatus.IN_PROGRESS})


def action_for(event_status: str | None) -> Action:
    """Send when the parent event is Planned/InProgress, otherwise skip without publishing.

    An unknown event status is skipped too: sending a reminder for an event in a state we do
    not understand is worse than not sending it.
    """
    return Action.SEND if event_status in LIVE_EVENT_STATUSES else Action.SKIP
