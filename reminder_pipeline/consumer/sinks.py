"""Where notifications go: the sink protocol, a sink's permanent refusal, and the stdout sink."""

from __future__ import annotations

import sys
from typing import Protocol, TextIO

from .notifications import Notification


class NotificationSink(Protocol):
    """Where notifications go (push, email, ...). Raising means "not delivered, try again later"."""

    def deliver(self, notification: Notification) -> None:
        """Deliver one notification or raise; :class:`DeliveryRejected` means never."""


class DeliveryRejected(Exception):
    """A sink's permanent refusal: retrying cannot help, so the message is dead-lettered."""


def format_notification(notification: Notification) -> str:
    """One line for people: kind, recipient, identifiers, horizon and local time (no PII exists)."""
    n = notification
    return (
        f"{n.kind} to {n.recipient_role} {n.recipient_user_id} | {n.text} | "
        f"reminder={n.reminder_id} event={n.event_id} tenant={n.tenant_id} "
        f"offset={n.offset_minutes}m"
    )


class StdoutSink:
    """The default sink: prints one line per notification."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self._stream = stream

    def deliver(self, notification: Notification) -> None:
        """Print the notification's line and flush, so a pipe sees it at once."""
        print(format_notification(notification), file=self._stream or sys.stdout, flush=True)
