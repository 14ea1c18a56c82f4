"""The ReminderDueEvent contract (pin.calendar.reminder-due.v1): names, headers and validation."""

from __future__ import annotations

import hashlib
import json
import re
import uuid
from functools import cache
from importlib import resources
from typing import Any

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
HEADER_MESSAGE_ID = "message-id"

#: The namespace of message ids, ``uuid5(NAMESPACE_URL, EVENT_TYPE)``: fixed for good (changing it
#: would give a reminder's next copy another id).
MESSAGE_ID_NAMESPACE = uuid.UUID("42da0ede-c3e9-538d-b648-a2c8af30482b")


class ContractViolation(ValueError):
    """A payload does not satisfy the ReminderDueEvent v1 JSON Schema."""


@cache
def schema() -> dict[str, Any]:
    """The JSON Schema shipped in the package."""
    text = resources.files(__package__).joinpath("reminder_due_event.v1.schema.json").read_text()
    loaded: dict[str, Any] = json.loads(text)
    return loaded


_GUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
_START_AT = re.compile(r"^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,6})?Z$")
_GUID_FIELDS = ("ReminderId", "EventId", "TenantId", "OwnerUserId")
_NULLABLE_GUID_FIELDS = ("ClientUserId", "AppointmentId")
_FIELD_SET = frozenset(PAYLOAD_FIELDS)
_INT32_MAX = 2147483647


def validate(payload: dict[str, Any]) -> None:
    """Raise :class:`ContractViolation` (one line, naming the field) unless ``payload`` is valid v1.

    Straight-line code that accepts exactly what the shipped JSON Schema accepts (same patterns,
    bounds and types; a bool is not an integer): it runs once per dispatched row, where the
    generic validator is slow (benchmarks/README.md). The shipped schema is the reference: the
    tests' oracle reads it through jsonschema and a property test keeps the two in agreement
    (unit/test_contract_check.py).
    """
    if not isinstance(payload, dict):
        raise ContractViolation("payload: is not an object")
    # Fast path: the builder's dicts carry exactly the contract's keys in the contract's order.
    if tuple(payload) != PAYLOAD_FIELDS and payload.keys() != _FIELD_SET:
        missing = [k for k in PAYLOAD_FIELDS if k not in payload]
        extra = sorted(str(k) for k in payload if k not in _FIELD_SET)
        raise ContractViolation(f"payload: missing {missing}, unexpected {extra}")
    for name in _GUID_FIELDS:
        value = payload[name]
        if not isinstance(value, str) or _GUID.search(value) is None:
            raise ContractViolation(f"{name}: is not a lowercase guid")
    for name in _NULLABLE_GUID_FIELDS:
        value = payload[name]
        if value is not None and (not isinstance(value, str) or _GUID.search(value) is None):
            raise ContractViolation(f"{name}: is neither a lowercase guid nor null")
    for name in ("Kind", "TimeZone"):
        value = payload[name]
        if not isinstance(value, str) or not 1 <= len(value) <= 64:
            raise ContractViolation(f"{name}: is not a string of 1..64 characters")
    value = payload["StartAt"]
    if not isinstance(value, str) or _START_AT.search(value) is None:
        raise ContractViolation("StartAt: is not an ISO-8601 UTC timestamp (…Z)")
    value = payload["OffsetMinutes"]
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _INT32_MAX:
        raise ContractViolation(f"OffsetMinutes: is not an integer in 0..{_INT32_MAX}")


def name_based_uuid8(namespace: uuid.UUID, name: str) -> uuid.UUID:
    """RFC 9562's name-based UUIDv8 (its appendix B.2): the first 128 bits of SHA-256 over the
    namespace's bytes and the name's UTF-8, with version 8 and the RFC's variant set (what any
    language computes from a SHA-256, no UUIDv5 library needed)."""
    digest = bytearray(hashlib.sha256(namespace.bytes + name.encode()).digest()[:16])
    digest[6] = (digest[6] & 0x0F) | 0x80
    digest[8] = (digest[8] & 0x3F) | 0x80
    return uuid.UUID(bytes=bytes(digest))


_NAMESPACE_BYTES = MESSAGE_ID_NAMESPACE.bytes
#: The hex digit at the variant's place, by the digest's: its two high bits set to 10.
_VARIANT = {c: "89ab"[int(c, 16) & 3] for c in "0123456789abcdef"}


def message_id(reminder_id: str) -> str:
    """The id of the message for ``reminder_id``, the same on every copy (a re-send after a lost
    commit, a relay retry, a re-publish): :func:`name_based_uuid8` of
    :data:`MESSAGE_ID_NAMESPACE` and the ReminderId's canonical text, formatted straight from the
    digest's hex (it runs once per message the producer sends)."""
    h = hashlib.sha256(_NAMESPACE_BYTES + reminder_id.encode()).hexdigest()
    return f"{h[:8]}-{h[8:12]}-8{h[13:16]}-{_VARIANT[h[16]]}{h[17:20]}-{h[20:32]}"


def headers(reminder_id: str, run_id: str | None) -> dict[str, str]:
    """The Kafka headers stored with every ReminderDueEvent (the producer adds its
    ``message-id``: ``messaging.kafka.wire_headers``); the run id goes in ``correlation-id``."""
    result = {
        HEADER_CONTRACT_VERSION: str(CONTRACT_VERSION),
        HEADER_EVENT_TYPE: EVENT_TYPE,
        HEADER_REMINDER_ID: reminder_id,
        HEADER_CONTENT_TYPE: "application/json",
    }
    if run_id:
        result[HEADER_CORRELATION_ID] = run_id
    return result
