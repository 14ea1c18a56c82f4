"""From a pin.calendar.reminder-due.v1 message to the notifications it asks for: pure functions.

This is the notifications side of the contract, so it reads only the published language
(:mod:`reminder_pipeline.domain.contract`), never the calendar's own model. Strict in what we
send, lenient in what we accept: our producer writes the shipped schema's exact forms, but a
message is refused only when the contract's meaning cannot be read from it:

* field names in any case (``reminderId`` from a camelCase serializer is ReminderId); fields the
  contract does not name are ignored (minor versions are additive);
* GUIDs and instants in every spelling :mod:`.spellings` admits;
* ClientUserId and AppointmentId null or absent; OffsetMinutes an integer 0..2^31-1 (``60.0``
  too); Kind and TimeZone any value: an unknown Kind gets the neutral text and a TimeZone that
  is not a canonical IANA name shows the local time in UTC (both fail safe, with a warning).

What cannot be read raises :class:`IncompatibleMessage` naming the field, which the runner
retries a bounded number of times and then dead-letters.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from functools import lru_cache
from typing import Any, TypeVar

import orjson

from ..domain import contract, time_zones
from .spellings import SpellingError, parse_guid, parse_instant, uuid_from_int
from .texts import Locale, ReminderText, parse_locale, reminder_text

#: Stable namespace for notification ids: the same reminder and recipient give the same id, so a
#: sink can pass it on as an idempotency key (push providers, mail APIs).
NOTIFICATION_NAMESPACE = uuid.UUID("0b6f5d0e-3c55-4d39-9a52-7e2d1f0c8a41")
_NAMESPACE_BYTES = NOTIFICATION_NAMESPACE.bytes
#: RFC 4122's version (5) and variant bits, as :func:`uuid.uuid5` sets them.
_NOT_VERSION_VARIANT = ~(0xF000 << 64) & ~(0xC000 << 48)
_VERSION_5_VARIANT = (5 << 76) | (0x8000 << 48)

#: .NET's ``int``: the contract's type of OffsetMinutes.
INT32_MAX = 2**31 - 1

WARNING_UNKNOWN_KIND = "unknown Kind; neutral reminder text used"
WARNING_TIME_ZONE_FALLBACK = "TimeZone is not a canonical IANA name; local time shown in UTC"

_FIELD_BY_FOLDED = {name.casefold(): name for name in contract.PAYLOAD_FIELDS}
_FIELD_BY_NAME = {name: name for name in contract.PAYLOAD_FIELDS}
_REQUIRED_GUIDS = ("ReminderId", "EventId", "TenantId", "OwnerUserId")
_OPTIONAL_GUIDS = ("ClientUserId", "AppointmentId")


class NotificationKind(StrEnum):
    """What notifications delivers: a reminder about an appointment, or about any other event."""

    APPOINTMENT_REMINDER = "AppointmentReminder"
    CALENDAR_REMINDER = "CalendarReminder"


class RecipientRole(StrEnum):
    """Why a user receives the reminder."""

    OWNER = "owner"
    CLIENT = "client"


class MessageProblem(StrEnum):
    """Why a message was dead-lettered; the value is the ``dlq-reason`` header."""

    #: Not a UTF-8 JSON object (or a tombstone).
    UNPARSEABLE = "unparseable"
    #: JSON, but a required field is missing or a value is not the contract's type.
    INCOMPATIBLE = "incompatible"
    #: Readable, but building its notifications failed (e.g. a local time beyond year 9999).
    UNPROCESSABLE = "unprocessable"
    #: The sink refused a notification for good (:class:`~.runner.DeliveryRejected`).
    DELIVERY_REJECTED = "delivery-rejected"


class IncompatibleMessage(ValueError):
    """Not a usable ReminderDueEvent; ``problem`` says which way, str() says where."""

    def __init__(self, problem: MessageProblem, detail: str) -> None:
        super().__init__(" ".join(detail.split())[:300])
        self.problem = problem


@dataclass(frozen=True)
class ReminderDue:
    """A parsed ReminderDueEvent: the contract's fields, typed (ids and instant normalised)."""

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
    locale: Locale = Locale.EN


@dataclass(frozen=True)
class MappedReminder:
    """The notifications for one reminder and what fell back to a fail-safe default."""

    reminder: ReminderDue
    notifications: tuple[Notification, ...]
    warnings: tuple[str, ...] = ()
    known_kind: bool = True
    time_zone_fallback: bool = False


_T = TypeVar("_T")
_new = object.__new__


def _frozen(cls: type[_T], fields: dict[str, Any]) -> _T:
    """``cls(**fields)`` for the frozen dataclasses above, built without their generated
    ``__init__`` (an ``object.__setattr__`` per field: a third of a notification's cost).
    ``fields`` names every field; none of these classes has a ``__post_init__``."""
    result = _new(cls)
    result.__dict__.update(fields)
    return result


def _incompatible(name: str, detail: str) -> IncompatibleMessage:
    return IncompatibleMessage(MessageProblem.INCOMPATIBLE, f"{name}: {detail}")


def _decode(raw: bytes | str | None) -> dict[str, Any]:
    """The message value as a JSON object, or :class:`IncompatibleMessage` (unparseable)."""
    if raw is None:
        raise IncompatibleMessage(MessageProblem.UNPARSEABLE, "empty message value (tombstone)")
    if isinstance(raw, bytes):
        # orjson reads what every producer writes at a third of the json module's cost; what it
        # refuses (a byte-order mark, NaN, integers past 64 bits, lone surrogates, invalid
        # UTF-8) is read as before, so each value keeps the meaning and the error it had.
        try:
            payload = orjson.loads(raw)
        except orjson.JSONDecodeError:
            pass
        else:
            if isinstance(payload, dict):
                return payload
    try:
        # utf-8-sig: a byte-order mark some writers put first is not part of the JSON.
        text = raw.decode("utf-8-sig") if isinstance(raw, bytes) else raw
        payload = json.loads(text)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise IncompatibleMessage(MessageProblem.UNPARSEABLE, f"not UTF-8 JSON: {exc}") from None
    if not isinstance(payload, dict):
        raise IncompatibleMessage(
            MessageProblem.UNPARSEABLE, f"JSON value is a {type(payload).__name__}, not an object"
        )
    return payload


def _contract_fields(payload: Mapping[str, Any]) -> dict[str, Any]:
    """The contract's fields by their contract names, matched case-insensitively."""
    found: dict[str, Any] = {}
    for key, value in payload.items():
        # The contract's own spelling first (what producers write): casefold only the others.
        name = _FIELD_BY_NAME.get(key) or _FIELD_BY_FOLDED.get(key.casefold())
        if name is None:
            continue  # an additive field of a newer minor version
        if name in found and found[name] != value:
            raise _incompatible(name, "given twice (names differing in case) with different values")
        found[name] = value
    return found


def _required(fields: Mapping[str, Any], name: str) -> Any:
    value = fields.get(name)
    if value is None:
        raise _incompatible(name, "required field is missing or null")
    return value


def _guid(name: str, value: Any) -> uuid.UUID:
    try:
        return parse_guid(value)
    except SpellingError as exc:
        raise _incompatible(name, str(exc)) from None


def _offset_minutes(value: Any) -> int:
    if isinstance(value, float) and value.is_integer():
        value = int(value)  # 60.0: the same integer, from a writer with one number type
    if isinstance(value, bool) or not isinstance(value, int):
        raise _incompatible("OffsetMinutes", f"is a {type(value).__name__}, not an integer")
    if not 0 <= value <= INT32_MAX:
        raise _incompatible("OffsetMinutes", f"is outside 0..{INT32_MAX}")
    return value


def _text(value: Any) -> str:
    """Kind/TimeZone as text: a non-string is kept as its JSON, which no known value equals."""
    return value if isinstance(value, str) else json.dumps(value)


def parse_reminder(raw: bytes | str | None) -> ReminderDue:
    """Read a message value; :class:`IncompatibleMessage` if the contract's meaning is not in it."""
    fields = _contract_fields(_decode(raw))
    guids = {name: _guid(name, _required(fields, name)) for name in _REQUIRED_GUIDS}
    optional = {
        name: None if fields.get(name) is None else _guid(name, fields[name])
        for name in _OPTIONAL_GUIDS
    }
    kind = _text(_required(fields, "Kind"))
    try:
        start_at = parse_instant(_required(fields, "StartAt"))
    except SpellingError as exc:
        raise _incompatible("StartAt", str(exc)) from None
    time_zone = _text(_required(fields, "TimeZone"))
    offset_minutes = _offset_minutes(_required(fields, "OffsetMinutes"))
    return _frozen(
        ReminderDue,
        {
            "reminder_id": guids["ReminderId"],
            "event_id": guids["EventId"],
            "tenant_id": guids["TenantId"],
            "owner_user_id": guids["OwnerUserId"],
            "client_user_id": optional["ClientUserId"],
            "kind": kind,
            "start_at": start_at,
            "time_zone": time_zone,
            "offset_minutes": offset_minutes,
            "appointment_id": optional["AppointmentId"],
        },
    )


def notification_id(reminder_id: str, recipient_user_id: uuid.UUID) -> uuid.UUID:
    """``uuid5(NOTIFICATION_NAMESPACE, "<reminder>/<recipient>")``, computed as :func:`uuid.uuid5`
    does but without its intermediate objects (two per recipient of every reminder)."""
    digest = hashlib.sha1(_NAMESPACE_BYTES + f"{reminder_id}/{recipient_user_id}".encode())
    value = int.from_bytes(digest.digest()[:16], "big")
    return uuid_from_int((value & _NOT_VERSION_VARIANT) | _VERSION_5_VARIANT)


def local_time(start_at: datetime, time_zone: str) -> tuple[datetime, str, bool]:
    """(``start_at`` in ``time_zone``, the zone shown, whether it fell back to UTC).

    Only canonical IANA names are looked up (:func:`time_zones.is_canonical`): ``localtime``,
    ``posix/…`` and the like would read whatever the host is configured with. Converting may
    raise ``OverflowError`` near the ends of the calendar (9999-12-31T23:00Z in Asia/Tokyo).
    """
    if not time_zones.is_canonical(time_zone):
        fallback = time_zones.FALLBACK_ZONE
        return start_at.astimezone(time_zones.zone(fallback)), fallback, True
    return start_at.astimezone(time_zones.zone(time_zone)), time_zone, False


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


def notifications_for(reminder: ReminderDue, locale: Locale | str = Locale.EN) -> MappedReminder:
    """The notifications for ``reminder`` in ``locale``; unknown values fall back, with warnings."""
    locale = locale if isinstance(locale, Locale) else parse_locale(locale)
    local_start, zone, zone_fallback, wording = _wording(
        reminder.start_at, reminder.time_zone, reminder.kind, reminder.offset_minutes, locale
    )
    warnings = []
    if zone_fallback:
        warnings.append(WARNING_TIME_ZONE_FALLBACK)
    if not wording.known_kind:
        warnings.append(WARNING_UNKNOWN_KIND)
    kind = notification_kind(reminder)
    reminder_id = str(reminder.reminder_id)
    # In the order of the fields (what ``vars()`` lists).
    notifications = tuple(
        _frozen(
            Notification,
            {
                "notification_id": notification_id(reminder_id, user_id),
                "kind": kind,
                "reminder_id": reminder.reminder_id,
                "event_id": reminder.event_id,
                "tenant_id": reminder.tenant_id,
                "recipient_user_id": user_id,
                "recipient_role": role,
                "event_kind": reminder.kind,
                "known_kind": wording.known_kind,
                "start_at": reminder.start_at,
                "local_start": local_start,
                "time_zone": zone,
                "offset_minutes": reminder.offset_minutes,
                "horizon": wording.horizon,
                "text": wording.text,
                "appointment_id": reminder.appointment_id,
                "locale": locale,
            },
        )
        for user_id, role in recipients(reminder)
    )
    return MappedReminder(
        reminder,
        notifications,
        tuple(warnings),
        known_kind=wording.known_kind,
        time_zone_fallback=zone_fallback,
    )


# A burst's reminders share few StartAts, zones, kinds and horizons: the local time and the text
# are pure functions of those, computed once per distinct combination (errors are not cached).
@lru_cache(maxsize=4096)
def _wording(
    start_at: datetime, time_zone: str, kind: str, offset_minutes: int, locale: Locale
) -> tuple[datetime, str, bool, ReminderText]:
    """(local start, zone shown, zone fell back, text) of a reminder; see :func:`local_time`."""
    local_start, zone, zone_fallback = local_time(start_at, time_zone)
    text = reminder_text(kind, offset_minutes, local_start, zone, locale)
    return local_start, zone, zone_fallback, text


def due_at(reminder: ReminderDue) -> datetime | None:
    """The reminder's DueAt (StartAt - OffsetMinutes), or None when that is before year 1."""
    try:
        return reminder.start_at - timedelta(minutes=reminder.offset_minutes)
    except OverflowError:
        return None
