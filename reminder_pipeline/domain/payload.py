"""Building the ReminderDueEvent payload from a due row: the contract's fields and nothing else."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from . import contract, time_zones
from .model import DueReminder


class PayloadError(ValueError):
    """The row cannot become a valid message (a poison row); the message is one line."""


def _optional_id(value: object) -> str | None:
    return None if value is None else str(value)


def iso_utc(value: datetime) -> str:
    """ISO-8601 in UTC with a ``Z`` suffix; microseconds only when present."""
    if value.tzinfo is None:
        raise PayloadError("StartAt has no time zone")
    if value.tzinfo is not UTC:  # psycopg returns UTC values on a session in UTC: the usual case
        value = value.astimezone(UTC)
    return value.replace(tzinfo=None).isoformat() + "Z"


def message_time_zone(name: str | None) -> str:
    """The TimeZone a message carries: the event's when canonical, else the fallback zone.

    The time-zone policy (docs/design.md): a reminder matters more than its wording, so an
    unknown or non-canonical zone never holds a reminder back; the message says UTC, which the
    consumer renders as such, and the cycle counts and logs the fallback.
    """
    return name if name is not None and time_zones.is_canonical(name) else time_zones.FALLBACK_ZONE


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
        "ClientUserId": _optional_id(reminder.client_user_id),
        "Kind": reminder.kind,
        "StartAt": iso_utc(reminder.start_at),
        "TimeZone": message_time_zone(reminder.time_zone),
        "OffsetMinutes": int(reminder.offset_minutes),
        "AppointmentId": _optional_id(reminder.appointment_id),
    }
    try:
        contract.validate(payload)
    except contract.ContractViolation as exc:
        raise PayloadError(f"breaks the contract: {exc}") from None
    return payload
