"""Building the ReminderDueEvent payload from a due row: the contract's fields and nothing else."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from . import contract
from .model import DueReminder


class PayloadError(ValueError):
    """The row cannot become a valid message (a poison row); the message is one line."""


def _guid(value: uuid.UUID | None) -> str | None:
    return None if value is None else str(value)


def iso_utc(value: datetime) -> str:
    """ISO-8601 in UTC with a ``Z`` suffix; microseconds only when present."""
    if value.tzinfo is None:
        raise PayloadError("StartAt has no time zone")
    if value.tzinfo is not UTC:  # psycopg returns UTC values on a session in UTC: the usual case
        value = value.astimezone(UTC)
    return value.replace(tzinfo=None).isoformat() + "Z"


def check_time_zone(name: str | None) -> str:
    """Return ``name`` if it is a known IANA zone, else raise :class:`PayloadError`."""
    if not name or len(name) > 64 or name.startswith(("/", ".")) or ".." in name:
        raise PayloadError("TimeZone is not an IANA time zone name")
    try:
        ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise PayloadError("TimeZone is not a known IANA time zone") from None
    return name


def build_payload(reminder: DueReminder) -> dict[str, Any]:
    """The contract v1 payload for ``reminder``; raises :class:`PayloadError` for a poison row.

    Only identifiers, times and the kind are read: the event's title, description and location
    are not part of :class:`DueReminder` at all, so they cannot leak into a message.
    """
    if reminder.start_at is None:
        raise PayloadError("StartAt is missing or outside the representable range")
    if reminder.offset_minutes is None or reminder.offset_minutes < 0:
        raise PayloadError("OffsetMinutes is negative or missing")
    if not reminder.kind:
        raise PayloadError("Kind is empty")
    payload: dict[str, Any] = {
        "ReminderId": str(reminder.reminder_id),
        "EventId": str(reminder.event_id),
        "TenantId": str(reminder.tenant_id),
        "OwnerUserId": str(reminder.owner_user_id),
        "ClientUserId": _guid(reminder.client_user_id),
        "Kind": reminder.kind,
        "StartAt": iso_utc(reminder.start_at),
        "TimeZone": check_time_zone(reminder.time_zone),
        "OffsetMinutes": int(reminder.offset_minutes),
        "AppointmentId": _guid(reminder.appointment_id),
    }
    try:
        contract.validate(payload)
    except contract.ContractViolation as exc:
        raise PayloadError(f"breaks the contract: {exc}") from None
    return payload
