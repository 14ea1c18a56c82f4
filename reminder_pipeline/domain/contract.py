"""The ReminderDueEvent contract (pin.calendar.reminder-due.v1): names, headers and validation."""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from typing import Any

from jsonschema import Draft202012Validator

TOPIC = "pin.calendar.reminder-due.v1"
EVENT_TYPE = "pin.calendar.reminder-due"
CONTRACT_VERSION = 1
PARTITIONS = 3

#: The payload fields of contract v1, in the contract's order. Nothing else goes in a message.
PAYLOAD_FIELDS: tuple[str, ...] = (
    "ReminderId",
    "EventId",
    "TenantId",
    "OwnerUserId",
    "ClientUserId",
    "Kind",
    "StartAt",
    "TimeZone",
    "OffsetMinutes",
    "AppointmentId",
)
#: Fields a consumer must find; ClientUserId and AppointmentId may be null or absent.
REQUIRED_FIELDS: tuple[str, ...] = tuple(
    f for f in PAYLOAD_FIELDS if f not in ("ClientUserId", "AppointmentId")
)

HEADER_CONTRACT_VERSION = "contract-version"
HEADER_EVENT_TYPE = "event-type"
HEADER_REMINDER_ID = "reminder-id"
HEADER_CORRELATION_ID = "correlation-id"
HEADER_CONTENT_TYPE = "content-type"


class ContractViolation(ValueError):
    """A payload does not satisfy the ReminderDueEvent v1 JSON Schema."""


@cache
def schema() -> dict[str, Any]:
    """The JSON Schema shipped in the package."""
    text = resources.files(__package__).joinpath("reminder_due_event.v1.schema.json").read_text()
    return json.loads(text)


@cache
def _validator() -> Draft202012Validator:
    return Draft202012Validator(schema())


def validate(payload: dict[str, Any]) -> None:
    """Raise :class:`ContractViolation` (one line, first error) unless ``payload`` is valid v1."""
    error = next(iter(sorted(_validator().iter_errors(payload), key=lambda e: list(e.path))), None)
    if error is not None:
        where = "/".join(str(p) for p in error.path) or "payload"
        raise ContractViolation(f"{where}: {error.message[:200]}")


def headers(reminder_id: str, correlation_id: str | None) -> dict[str, str]:
    """The Kafka headers every ReminderDueEvent carries."""
    result = {
        HEADER_CONTRACT_VERSION: str(CONTRACT_VERSION),
        HEADER_EVENT_TYPE: EVENT_TYPE,
        HEADER_REMINDER_ID: reminder_id,
        HEADER_CONTENT_TYPE: "application/json",
    }
    if correlation_id:
        result[HEADER_CORRELATION_ID] = correlation_id
    return result
