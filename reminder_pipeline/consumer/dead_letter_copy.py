"""The dead-letter record of a message: the topic, the header names, and the copy cut to fit.

A message the consumer cannot read (or a sink refuses for good) is copied to the dead-letter
topic with why and whence in its headers; a copy too big for the broker is cut to fit, the
original's position, size and SHA-256 still naming it (:mod:`.dead_letters` produces it).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

# The topic and header names live with the operator's side (`reminder-pipeline dlq`), which
# reads what this writes: :mod:`reminder_pipeline.messaging.dead_letters`.
from ..messaging.dead_letters import HEADER_DLQ_DIGEST, HEADER_DLQ_SIZE, HEADER_DLQ_TRUNCATED

#: librdkafka's default ``message.max.bytes`` (Kafka's broker default is 1,048,588): any message
#: a default producer could send fits the broker, but its dead-letter copy with our headers
#: may not, so the copy is cut to this.
DEFAULT_DLQ_MAX_BYTES = 1_000_000
#: Room kept for the record's framing (lengths, attributes, the batch header) in that budget.
DLQ_RECORD_OVERHEAD = 1_024

#: Everything a copy can lose, in the order the marker header names it.
ALL_CUT = ("value", "headers", "key")


@dataclass(frozen=True)
class DeadLetterCopy:
    """The record written to the dead-letter topic for one message."""

    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, str | bytes | None]]
    #: The dead-letter headers naming the original (reason, position, size, digest).
    origin: list[tuple[str, str | bytes | None]]
    size: int
    digest: str
    #: What was cut to fit ("value", "headers", "key"); empty for a whole copy.
    truncated: tuple[str, ...]


def _header_bytes(headers: list[tuple[str, str | bytes | None]]) -> int:
    # Each header costs its name, its value and two length varints (at most 5 bytes each).
    return sum(
        len(n.encode()) + len(v.encode() if isinstance(v, str) else v or b"") + 10
        for n, v in headers
    )


def dead_letter_copy(
    key: bytes | None,
    value: bytes | None,
    headers: list[tuple[str, str | bytes | None]],
    origin: list[tuple[str, str | bytes | None]],
    max_bytes: int,
) -> DeadLetterCopy:
    """The dead-letter record of a message: whole if it fits ``max_bytes``, else cut to fit.

    The original's size and SHA-256 always go into the headers, so a cut copy still identifies
    the message kept at its topic, partition and offset. ``max_bytes`` 0 keeps only ``origin``.
    """
    data = value or b""
    size, digest = len(data), hashlib.sha256(data).hexdigest()
    if HEADER_DLQ_SIZE not in {name for name, _ in origin}:
        origin = [
            *origin,
            (HEADER_DLQ_SIZE, str(size).encode()),
            (HEADER_DLQ_DIGEST, digest.encode()),
        ]
    budget = max_bytes - DLQ_RECORD_OVERHEAD
    if len(key or b"") + size + _header_bytes([*headers, *origin]) <= budget:
        return DeadLetterCopy(key, value, [*headers, *origin], origin, size, digest, ())
    # Room for the marker header itself, then cut what is biggest and least needed first: a
    # key or original headers over a quarter of the budget, then the value.
    budget -= _header_bytes([(HEADER_DLQ_TRUNCATED, ",".join(ALL_CUT))])
    cut: list[str] = []
    if len(key or b"") > budget // 4:
        key, cut = None, [*cut, "key"]
    if _header_bytes(headers) > budget // 4:
        headers, cut = [], [*cut, "headers"]
    room = max(budget - len(key or b"") - _header_bytes([*headers, *origin]), 0)
    if value is not None and size > room:
        value, cut = data[:room] or None, ["value", *cut]
    order = tuple(part for part in ALL_CUT if part in cut)
    marked = [*headers, *origin, (HEADER_DLQ_TRUNCATED, ",".join(order).encode())]
    return DeadLetterCopy(key, value, marked, origin, size, digest, order)
