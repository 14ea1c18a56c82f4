"""The ReminderDueEvent contract (pin.calendar.reminder-due.v1): names, headers and validation."""

from __future__ import annotations

import hashlib
import json
import re
import uuid
from collections.abc import Callable
from importlib import resources
from typing import Any, NamedTuple

TOPIC = "pin.calendar.reminder-due.v1"
EVENT_TYPE = "pin.calendar.reminder-due"
CONTRACT_VERSION = 1
PARTITIONS = 3

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


def _load_schema() -> dict[str, Any]:
    text = resources.files(__package__).joinpath("reminder_due_event.v1.schema.json").read_text()
    loaded: dict[str, Any] = json.loads(text)
    return loaded


_SCHEMA = _load_schema()


def schema() -> dict[str, Any]:
    """The JSON Schema shipped in the package: the contract's one home (its fields, their order,
    types and bounds; everything below is read from it)."""
    return _SCHEMA


#: The payload fields of contract v1, in the contract's order (the schema's properties). Nothing
#: else goes in a message.
PAYLOAD_FIELDS: tuple[str, ...] = tuple(_SCHEMA["properties"])
#: Fields a consumer must find with a value; the others may be null or absent.
REQUIRED_FIELDS: tuple[str, ...] = tuple(
    name
    for name in PAYLOAD_FIELDS
    if name in _SCHEMA["required"] and "anyOf" not in _SCHEMA["properties"][name]
)


def _resolve(spec: dict[str, Any]) -> dict[str, Any]:
    ref = spec.get("$ref")
    if ref is None:
        return spec
    resolved: dict[str, Any] = _SCHEMA["$defs"][ref.rsplit("/", 1)[-1]]
    return resolved


class _Rule(NamedTuple):
    """One property's rule as the schema states it: its type (``str`` or ``int``), bounds (a
    string's length, an integer's value), a string's pattern, whether null is allowed, and what
    the refusal says (one line, never the value)."""

    name: str
    nullable: bool
    kind: type
    low: int
    high: int
    search: Callable[[str], object] | None
    message: str


def _rule(name: str, spec: dict[str, Any]) -> _Rule:
    """A property's rule, read from the schema's vocabulary (string, integer, nullable)."""
    spec = _resolve(spec)
    nullable = "anyOf" in spec
    if nullable:
        [spec] = [_resolve(s) for s in spec["anyOf"] if s != {"type": "null"}]
    kind: type
    if spec["type"] == "string":
        low, high = spec.get("minLength", 0), spec.get("maxLength", 2**31)
        search = re.compile(spec["pattern"]).search if "pattern" in spec else None
        what, kind = spec.get("title") or f"a string of {low}..{high} characters", str
    elif spec["type"] == "integer":
        low, high, search = spec["minimum"], spec["maximum"], None
        what, kind = f"an integer in {low}..{high}", int
    else:
        raise NotImplementedError(f"schema type {spec['type']!r} of {name}")
    message = f"{name}: is neither {what} nor null" if nullable else f"{name}: is not {what}"
    return _Rule(name, nullable, kind, low, high, search, message)


_RULES: tuple[_Rule, ...] = tuple(_rule(name, spec) for name, spec in _SCHEMA["properties"].items())
_FIELD_SET = frozenset(PAYLOAD_FIELDS)
_REQUIRED = frozenset(_SCHEMA["required"])


def validate(payload: dict[str, Any]) -> None:
    """Raise :class:`ContractViolation` (one line, naming the field) unless ``payload`` is valid v1.

    Each field's rule is read once from the shipped schema (its patterns, bounds and types; a
    bool is not an integer): it runs once per dispatched row, where a generic JSON Schema
    validator is slow (benchmarks/README.md). The tests' oracle reads the same schema through
    jsonschema and a property test keeps the two in agreement (unit/test_contract_check.py).
    """
    if not isinstance(payload, dict):
        raise ContractViolation("payload: is not an object")
    # Fast path: the builder's dicts carry exactly the contract's keys in the contract's order.
    whole = tuple(payload) == PAYLOAD_FIELDS
    if not whole and not (_REQUIRED <= payload.keys() <= _FIELD_SET):
        missing = [k for k in PAYLOAD_FIELDS if k in _REQUIRED and k not in payload]
        extra = sorted(str(k) for k in payload if k not in _FIELD_SET)
        raise ContractViolation(f"payload: missing {missing}, unexpected {extra}")
    for name, nullable, kind, low, high, search, message in _RULES:
        if not whole and name not in payload:
            continue  # an optional field left out
        value: Any = payload[name]
        cls = value.__class__
        if value is None:
            if nullable:
                continue
        elif (
            cls is kind
            and low <= (len(value) if kind is str else value) <= high
            and (search is None or search(value) is not None)
        ):
            continue
        raise ContractViolation(message)


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
