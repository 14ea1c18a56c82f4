"""The allowed reminder transitions and the send/skip rule of the dispatcher (its one home)."""

from __future__ import annotations

from .model import Action, EventStatus, ReminderStatus

#: Every transition a reminder row may make; Sent and Skipped are terminal (INV-REM-2).
ALLOWED_TRANSITIONS: frozenset[tuple[ReminderStatus, ReminderStatus]] = frozenset(
    {
        (ReminderStatus.PENDING, ReminderStatus.SENT),
        (ReminderStatus.PENDING, ReminderStatus.SKIPPED),
    }
)

#: Event statuses whose due reminders are sent; every other status is skipped (fail safe).
LIVE_EVENT_STATUSES: frozenset[str] = frozenset({EventStatus.PLANNED, EventStatus.IN_PROGRESS})


class TransitionError(ValueError):
    """A transition outside :data:`ALLOWED_TRANSITIONS` was requested."""


def check_transition(current: ReminderStatus | str, target: ReminderStatus | str) -> None:
    """Raise :class:`TransitionError` unless ``current → target`` is allowed."""
    pair = (ReminderStatus(current), ReminderStatus(target))
    if pair not in ALLOWED_TRANSITIONS:
        raise TransitionError(f"reminder transition {pair[0]} -> {pair[1]} is not allowed")


def action_for(event_status: str | None) -> Action:
    """Send when the parent event is Planned/InProgress, otherwise skip without publishing.

    An unknown event status is skipped too: sending a reminder for an event in a state we do
    not understand is worse than not sending it.
    """
    return Action.SEND if event_status in LIVE_EVENT_STATUSES else Action.SKIP
