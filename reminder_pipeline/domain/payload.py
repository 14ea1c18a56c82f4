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
from datetime import UTC, datetime, timedelta
from json.encoder import encode_basestring
from operator import attrgetter
from typing import Any

from . import contract
from .model import DueReminder

_ZERO = timedelta(0)


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


#: The row's attribute each payload field is read from, in the contract's order.
_ATTRIBUTES: tuple[str, ...] = tuple(_snake(name) for name in contract.PAYLOAD_FIELDS)
_read = attrgetter(*_ATTRIBUTES)
#: The fields that carry a time (the schema's ``utcTimestamp``).
_TIMES: tuple[str, ...] = tuple(
    name
    for name, spec in contract.schema()["properties"].items()
    if spec.get("$ref", "").endswith("/utcTimestamp")
)
#: The fields in the order PostgreSQL's ``jsonb`` keeps an object's keys: shorter first, then by
#: their bytes; and the object's text with a place for each value.
_JSONB_ORDER: tuple[str, ...] = tuple(
    sorted(contract.PAYLOAD_FIELDS, key=lambda name: (len(name.encode()), name.encode()))
)
_TEMPLATE = "{" + ", ".join(f"{encode_basestring(name)}: %s" for name in _JSONB_ORDER) + "}"


def utc_text(moment: datetime) -> str:
    """``2026-12-01T09:30:00Z``, with ``.ffffff`` only when it has microseconds."""
    if moment.utcoffset() != _ZERO:
        moment = moment.astimezone(UTC)
    return moment.replace(tzinfo=None).isoformat() + "Z"


def build(row: DueReminder) -> dict[str, Any]:
    """The payload of contract v1 for ``row``, each field from the attribute of its name (a time
    as :func:`utc_text`; a time out of range is None: the contract check refuses it)."""
    payload = dict(zip(contract.PAYLOAD_FIELDS, _read(row), strict=True))
    for name in _TIMES:
        if payload[name] is not None:
            payload[name] = utc_text(payload[name])
    return payload


def _json(value: object) -> str:
    if value is None:
        return "null"
    if value.__class__ is str:
        return str(encode_basestring(value))
    return str(value)


def text(payload: dict[str, Any]) -> str:
    """``payload`` as the outbox stores it: PostgreSQL's text of the ``jsonb`` value (a payload
    that passed the contract check: strings, integers and nulls)."""
    return _TEMPLATE % tuple([_json(payload[name]) for name in _JSONB_ORDER])
