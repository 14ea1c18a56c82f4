"""From a pin.calendar.reminder-due.v1 message to the notifications it asks for: pure functions.

This is the notifications side of the contract, so it reads only the published language
(:mod:`reminder_pipeline.domain.contract`), never the calendar's own model. Parsing is tolerant in
the ways the contract allows (unknown extra fields, a new Kind, a missing optional field) and
strict in the ways it does not (a required field missing, a wrong type): those raise
:class:`IncompatibleMessage`, which the runner dead-letters.
"""

from __future__ import annotations

import copy
import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from functools import cache
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from jsonschema import Draft202012Validator

from ..domain import contract

#: Stable namespace for notification ids: the same reminder and recipient give the same id, so a
#: sink can pass it on as an idempotency key (push providers, mail APIs).
NOTIFICATION_NAMESPACE = uuid.UUID("0b6f5d0e-3c55-4d39-9a52-7e2d1f0c8a41")

NEUTRAL_TEXT = "A calendar event starts soon"

#: Reminder text per known Kind; ``{horizon}`` and ``{when}`` are filled in. Kind is additive in
#: the contract, so anything else falls back to :data:`NEUTRAL_TEXT` (fail safe).
KIND_TEMPLATES: Mapping[str, str] = {
    "Showing": "Property showing starts {horizon}, at {when}",
    "Consultation": "Consultation starts {horizon}, at {when}",
    "Meeting": "Meeting starts {horizon}, at {when}",
    "Task": "Task starts {horizon}, at {when}",
    "BookingDeadline": "Booking deadline is {horizon}, at {when}",
}


class NotificationKind(StrEnum):
    """What notifications delivers: a reminder about an appointment, or about any other event."""

    APPOINTMENT_REMINDER = "AppointmentReminder"
    CALENDAR_REMINDER = "CalendarReminder"


class RecipientRole(StrEnum):
    """Why a user receives the reminder."""

    OWNER = "owner"
    CLIENT = "client"


class MessageProblem(StrEnum):
    """Why a message cannot be handled; becomes the ``dlq-reason`` header."""

    UNPARSEABLE = "unparseable"
    INCOMPATIBLE = "incompatible"


class IncompatibleMessage(ValueError):
    """The message is not a usable ReminderDueEvent; ``problem`` says which way, str() says where."""

    def __init__(self, problem: MessageProblem, detail: str) -> None:
        super().__init__(" ".join(detail.split())[:300])
        self.problem = problem


@dataclass(frozen=True)
class ReminderDue:
    """A parsed ReminderDueEvent: the contract's fields, typed."""

    reminder_id: uuid.UUID
    event_id: uuid.UUID
    tenant_id: uuid.UUID
    owner_user_id: uuid.UUID
    client_user_id: uuid.UUID | None
    kind: str
    start_at: datetime
    time_zone: str
    offset_minutes: int
    appointment_id: uuid.UUID | None


@dataclass(frozen=True)
class Notification:
    """One reminder for one recipient; identifiers, times and text only (the payload has no PII)."""

    notification_id: uuid.UUID
    kind: NotificationKind
    reminder_id: uuid.UUID
    event_id: uuid.UUID
    tenant_id: uuid.UUID
    recipient_user_id: uuid.UUID
    recipient_role: RecipientRole
    event_kind: str
    known_kind: bool
    start_at: datetime
    local_start: datetime
    time_zone: str
    offset_minutes: int
    horizon: str
    text: str
    appointment_id: uuid.UUID | None = None


@dataclass(frozen=True)
class MappedReminder:
    """The notifications for one reminder and the warnings raised while building them."""

    reminder: ReminderDue
    notifications: tuple[Notification, ...]
    warnings: tuple[str, ...] = ()


@cache
def relaxed_schema() -> dict[str, Any]:
    """The contract's schema as a consumer applies it: extra fields allowed, optional ones optional.

    The contract is additive for minor changes (new optional fields), so rejecting an unknown
    field here would turn the producer's compatible change into dead letters.
    """
    schema = copy.deepcopy(contract.schema())
    schema.pop("additionalProperties", None)
    schema["required"] = list(contract.REQUIRED_FIELDS)
    return schema


@cache
def _validator() -> Draft202012Validator:
    return Draft202012Validator(relaxed_schema())


def parse_reminder(raw: bytes | str | None) -> ReminderDue:
    """Parse and check a message value; raise :class:`IncompatibleMessage` if it is not usable."""
    if raw is None:
        raise IncompatibleMessage(MessageProblem.UNPARSEABLE, "empty message value (tombstone)")
    try:
        text = raw.decode("utf-8") if isinstance(raw, bytes) else raw
        payload = json.loads(text)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise IncompatibleMessage(MessageProblem.UNPARSEABLE, f"not UTF-8 JSON: {exc}") from None
    if not isinstance(payload, dict):
        raise IncompatibleMessage(
            MessageProblem.UNPARSEABLE, f"JSON value is a {type(payload).__name__}, not an object"
        )
    errors = sorted(_validator().iter_errors(payload), key=lambda e: list(e.path))
    if errors:
        where = "/".join(str(p) for p in errors[0].path) or "payload"
        raise IncompatibleMessage(MessageProblem.INCOMPATIBLE, f"{where}: {errors[0].message[:200]}")
    try:
        start_at = datetime.fromisoformat(payload["StartAt"]).astimezone(UTC)
    except ValueError as exc:
        # The schema's pattern admits e.g. month 13; the value is still not a date.
        raise IncompatibleMessage(MessageProblem.INCOMPATIBLE, f"StartAt: {exc}") from None
    return ReminderDue(
        reminder_id=uuid.UUID(payload["ReminderId"]),
        event_id=uuid.UUID(payload["EventId"]),
        tenant_id=uuid.UUID(payload["TenantId"]),
        owner_user_id=uuid.UUID(payload["OwnerUserId"]),
        client_user_id=_optional_uuid(payload.get("ClientUserId")),
        kind=payload["Kind"],
        start_at=start_at,
        time_zone=payload["TimeZone"],
        offset_minutes=payload["OffsetMinutes"],
        appointment_id=_optional_uuid(payload.get("AppointmentId")),
    )


def _optional_uuid(value: str | None) -> uuid.UUID | None:
    return None if value is None else uuid.UUID(value)


def _count(n: int, unit: str, article: str) -> str:
    return f"{article} {unit}" if n == 1 else f"{n} {unit}s"


def horizon_text(offset_minutes: int) -> str:
    """How far ahead the event is: 1440 → "in a day", 60 → "in an hour", 90 → "in 1 hour 30 minutes"."""
    if offset_minutes <= 0:
        return "now"
    weeks, rest = divmod(offset_minutes, 7 * 24 * 60)
    if rest == 0:
        return "in " + _count(weeks, "week", "a")
    days, rest = divmod(offset_minutes, 24 * 60)
    hours, minutes = divmod(rest, 60)
    parts = [(days, "day", "a"), (hours, "hour", "an"), (minutes, "minute", "a")]
    present = [(n, unit, article) for n, unit, article in parts if n]
    if len(present) == 1:
        n, unit, article = present[0]
        return "in " + _count(n, unit, article)
    return "in " + " ".join(f"{n} {unit}{'' if n == 1 else 's'}" for n, unit, _ in present)


def local_time(start_at: datetime, time_zone: str) -> tuple[datetime, str, str | None]:
    """``start_at`` in ``time_zone``; an unknown zone falls back to UTC with a warning (fail safe)."""
    try:
        return start_at.astimezone(ZoneInfo(time_zone)), time_zone, None
    except (ZoneInfoNotFoundError, ValueError, OSError):
        return start_at.astimezone(UTC), "UTC", "unknown TimeZone; local time shown in UTC"


def reminder_text(kind: str, horizon: str, when: str) -> tuple[str, bool]:
    """The reminder text and whether ``kind`` was known (else the neutral text)."""
    template = KIND_TEMPLATES.get(kind)
    if template is None:
        return f"{NEUTRAL_TEXT}, at {when}", False
    return template.format(horizon=horizon, when=when), True


def notification_kind(reminder: ReminderDue) -> NotificationKind:
    """AppointmentReminder when the event came from an appointment, else CalendarReminder."""
    if reminder.appointment_id is not None:
        return NotificationKind.APPOINTMENT_REMINDER
    return NotificationKind.CALENDAR_REMINDER


def recipients(reminder: ReminderDue) -> list[tuple[uuid.UUID, RecipientRole]]:
    """The owner always, then the client when set (once, even if the client is the owner)."""
    result = [(reminder.owner_user_id, RecipientRole.OWNER)]
    if reminder.client_user_id is not None and reminder.client_user_id != reminder.owner_user_id:
        result.append((reminder.client_user_id, RecipientRole.CLIENT))
    return result


def notifications_for(reminder: ReminderDue) -> MappedReminder:
    """Build the notifications for ``reminder``; unknown values give warnings, never failures."""
    warnings: list[str] = []
    local_start, zone, zone_warning = local_time(reminder.start_at, reminder.time_zone)
    if zone_warning:
        warnings.append(zone_warning)
    horizon = horizon_text(reminder.offset_minutes)
    when = f"{local_start:%Y-%m-%d %H:%M} ({zone})"
    text, known = reminder_text(reminder.kind, horizon, when)
    if not known:
        warnings.append("unknown Kind; neutral reminder text used")
    kind = notification_kind(reminder)
    notifications = tuple(
        Notification(
            notification_id=uuid.uuid5(NOTIFICATION_NAMESPACE, f"{reminder.reminder_id}/{user_id}"),
            kind=kind,
            reminder_id=reminder.reminder_id,
            event_id=reminder.event_id,
            tenant_id=reminder.tenant_id,
            recipient_user_id=user_id,
            recipient_role=role,
            event_kind=reminder.kind,
            known_kind=known,
            start_at=reminder.start_at,
            local_start=local_start,
            time_zone=zone,
            offset_minutes=reminder.offset_minutes,
            horizon=horizon,
            text=text,
            appointment_id=reminder.appointment_id,
        )
        for user_id, role in recipients(reminder)
    )
    return MappedReminder(reminder, notifications, tuple(warnings))


def lateness(reminder: ReminderDue, now: datetime) -> timedelta:
    """How long after its due time (StartAt - OffsetMinutes) the reminder is being handled."""
    return now - (reminder.start_at - timedelta(minutes=reminder.offset_minutes))
