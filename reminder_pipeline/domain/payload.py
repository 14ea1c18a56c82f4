"""A due reminder's message: built in Python from the row its batch locked and read, once.

Every field of the contract comes from the row's attribute of the same name in snake case
(``ReminderId`` from ``reminder_id``, ``StartAt`` from ``start_at``), so the contract's field list
has one home, the shipped schema (:data:`~reminder_pipeline.domain.contract.PAYLOAD_FIELDS`): a
new field is a property in the schema, a field of the row and its column in the statements that
read it (docs/architecture.md, "Adding a field to the contract"). A time is written in ISO-8601
UTC with a ``Z`` and microseconds only when it has them.

The text is the message exactly as the outbox stores it: PostgreSQL's own text of the ``jsonb``
value (keys by length, then by bytes; ``": "`` and ``", "``; strings escaped as ``jsonb`` escapes
them), so the message a drain's relay publishes from the batch and the one any later relay or
re-publish reads back from the outbox are the same bytes (integration/test_one_statement_batch.py
holds the two equal).
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from json.encoder import encode_basestring
from typing import Any

from . import contract
from .model import DueReminder


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


#: (payload field, the row's attribute it is read from), in the contract's order.
SOURCES: tuple[tuple[str, str], ...] = tuple(
    (name, _snake(name)) for name in contract.PAYLOAD_FIELDS
)
#: The fields in the order PostgreSQL's ``jsonb`` keeps an object's keys: shorter first, then by
#: their bytes.
_JSONB_ORDER: tuple[str, ...] = tuple(
    sorted(contract.PAYLOAD_FIELDS, key=lambda name: (len(name.encode()), name.encode()))
)
_KEYS = {name: encode_basestring(name) for name in contract.PAYLOAD_FIELDS}


def utc_text(moment: datetime) -> str:
    """``2026-12-01T09:30:00Z``, with ``.ffffff`` only when it has microseconds."""
    utc = moment.astimezone(UTC).replace(tzinfo=None)
    return utc.isoformat(timespec="microseconds" if utc.microsecond else "seconds") + "Z"


def build(row: DueReminder) -> dict[str, Any]:
    """The payload of contract v1 for ``row``, each field from the attribute of its name (a time
    as :func:`utc_text`; a time out of range is None: the contract check refuses it)."""
    payload: dict[str, Any] = {}
    for name, attribute in SOURCES:
        value = getattr(row, attribute)
        payload[name] = utc_text(value) if isinstance(value, datetime) else value
    return payload


def _json(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, str):
        return str(encode_basestring(value))
    return str(int(value))  # type: ignore[call-overload]


def text(payload: dict[str, Any]) -> str:
    """``payload`` as the outbox stores it: PostgreSQL's text of the ``jsonb`` value."""
    parts = [f"{_KEYS[name]}: {_json(payload[name])}" for name in _JSONB_ORDER]
    return "{" + ", ".join(parts) + "}"
