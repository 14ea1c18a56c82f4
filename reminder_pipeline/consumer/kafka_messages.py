"""What the consumer reads off a consumed Kafka message: headers, position, ids for logs, timing."""

from __future__ import annotations

import re
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from confluent_kafka import TIMESTAMP_NOT_AVAILABLE, Message

from ..domain import contract


def _header_pairs(message: Message) -> Iterable[tuple[str, str | bytes | None]]:
    # A consumed message gives a list of pairs; the client's type also allows a dict (a message
    # built by hand), taken in its order.
    found = message.headers()
    if not found:
        return ()
    return found.items() if isinstance(found, dict) else found


def raw_headers(message: Message) -> list[tuple[str, str | bytes | None]]:
    """The message's headers as (name, value) pairs, in order (names may repeat)."""
    return [(str(name), value) for name, value in _header_pairs(message)]


def header_texts(message: Message) -> dict[str, str]:
    """The message's headers as text (the last value of a repeated name wins)."""
    return {
        str(name): value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
        for name, value in _header_pairs(message)
    }


def position(message: Message) -> tuple[str, int, int]:
    """(topic, partition, offset) of a consumed message (always set for those)."""
    topic, partition, offset = message.topic(), message.partition(), message.offset()
    assert topic is not None and partition is not None and offset is not None
    return topic, partition, offset


def where(message: Message, found: dict[str, str] | None = None) -> dict[str, Any]:
    """Identifiers of a message for logs: position and the ids the producer put in headers
    (``found``: the message's :func:`header_texts`, when the caller has them already)."""
    if found is None:
        found = header_texts(message)
    topic, partition, offset = position(message)
    result: dict[str, Any] = {"topic": topic, "partition": partition, "offset": offset}
    for name, header in (
        ("reminder_id", contract.HEADER_REMINDER_ID),
        ("run_id", contract.HEADER_CORRELATION_ID),  # the wire's correlation-id
        ("message_id", contract.HEADER_MESSAGE_ID),
    ):
        if found.get(header):
            result[name] = logged_id(found[header])
    return result


#: What a log line shows for a header that should hold an id and does not.
NOT_AN_ID = "(not an id)"
_ID = re.compile(r"[0-9A-Za-z._:{}()-]{1,64}")


def logged_id(value: str) -> str:
    """An id header's value as a log line may show it: an identifier's characters only (a GUID,
    a run id), else :data:`NOT_AN_ID`: a faulty producer's text is never echoed (it may be PII)."""
    return value if _ID.fullmatch(value) and any(c.isdigit() for c in value) else NOT_AN_ID


def one_line(error: BaseException) -> str:
    """An error as one short line for logs and dead-letter headers: its type and message."""
    return " ".join(f"{type(error).__name__}: {error}".split())[:300]


def message_time(message: Message) -> datetime | None:
    """The message's Kafka timestamp (producer create time or log append time), if it has one."""
    kind, millis = message.timestamp()
    if kind == TIMESTAMP_NOT_AVAILABLE or millis is None or millis <= 0:
        return None
    return datetime.fromtimestamp(millis / 1000, UTC)


def message_seconds(message: Message) -> float | None:
    """:func:`message_time` as seconds since the epoch (no datetime built: every message asks)."""
    kind, millis = message.timestamp()
    if kind == TIMESTAMP_NOT_AVAILABLE or millis is None or millis <= 0:
        return None
    return millis / 1000


def seconds_since(moment: datetime | None, now: datetime) -> float | None:
    """Seconds from ``moment`` to ``now`` (ms precision), or None without a moment."""
    return None if moment is None else round((now - moment).total_seconds(), 3)
