"""The dead-letter topic from the operator's side: its header names, reading it, replaying from it.

The reference consumer (:mod:`reminder_pipeline.consumer.dead_letters`) copies a message it cannot
handle to ``<topic>.dlq``: the original key, value and headers, then ``dlq-*`` headers saying why
and whence. :func:`read_dead_letters` reads them back (assigned partitions, no group join) and
:func:`replay_letters` produces the original key, value and headers again, marked as a replay.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)

from ..config import KafkaSettings
from ..domain import contract
from .kafka import LIBRDKAFKA_LOG, BrokerUnavailable

DLQ_TOPIC = f"{contract.TOPIC}.dlq"

HEADER_DLQ_REASON = "dlq-reason"
HEADER_DLQ_ERROR = "dlq-error"
HEADER_DLQ_ATTEMPTS = "dlq-attempts"
HEADER_DLQ_TOPIC = "dlq-original-topic"
HEADER_DLQ_PARTITION = "dlq-original-partition"
HEADER_DLQ_OFFSET = "dlq-original-offset"
HEADER_DLQ_GROUP = "dlq-consumer-group"
HEADER_DLQ_FAILED_AT = "dlq-failed-at"
#: The original value's size in bytes and its SHA-256 (hex): a copy cut to fit still names it.
HEADER_DLQ_SIZE = "dlq-original-size"
HEADER_DLQ_DIGEST = "dlq-original-sha256"
#: Present when the copy is not the whole original: what was cut ("value", "headers").
HEADER_DLQ_TRUNCATED = "dlq-truncated"
#: Every header the dead-lettering adds starts with this; a replay drops them all.
DLQ_HEADER_PREFIX = "dlq-"
#: The header a replayed message carries: ``<dlq topic>:<partition>:<offset>`` it came from, one
#: only: the replay of a dead letter whose message was itself a replay names the first dead letter.
HEADER_REPLAY_OF = "replay-of-dlq"

Headers = list[tuple[str, str | bytes | None]]


@dataclass(frozen=True)
class DeadLetter:
    """One record of the dead-letter topic: where it is, what it says of the original."""

    dlq_partition: int
    dlq_offset: int
    key: bytes | None
    value: bytes | None
    headers: Headers

    def header(self, name: str) -> str | None:
        """The last value of header ``name`` as text, or None."""
        found = None
        for header, value in self.headers:
            if header == name:
                found = value.decode("utf-8", "replace") if isinstance(value, bytes) else value
        return found

    @property
    def replay_of(self) -> str | None:
        """The dead letter (``<dlq topic>:<partition>:<offset>``) whose replay this dead letter's
        message was (it failed again after a replay), or None for a first failure. The first
        such header: copies replayed before issue 35 carry one per replay."""
        for header, value in self.headers:
            if header == HEADER_REPLAY_OF:
                return value.decode("utf-8", "replace") if isinstance(value, bytes) else value
        return None

    def _int(self, name: str) -> int | None:
        text = self.header(name)
        return int(text) if text is not None and text.strip().lstrip("-").isdigit() else None

    @property
    def position(self) -> str:
        """``partition:offset`` in the dead-letter topic (how ``dlq replay`` names one)."""
        return f"{self.dlq_partition}:{self.dlq_offset}"

    @property
    def cut(self) -> tuple[str, ...]:
        """What was cut to fit (``value``, ``headers``, ``key``); empty for a whole copy."""
        marker = self.header(HEADER_DLQ_TRUNCATED)
        return tuple(part for part in (marker or "").split(",") if part)

    def original_headers(self) -> Headers:
        """The original's headers, in order: the copy's without the ``dlq-*`` ones."""
        return [(n, v) for n, v in self.headers if not n.startswith(DLQ_HEADER_PREFIX)]

    def plain(self) -> dict[str, Any]:
        """Identifiers, reason, counts and sizes only (never the value: it may hold PII)."""
        key = self.key.decode("utf-8", "replace")[:64] if self.key is not None else None
        return {
            "dlq_partition": self.dlq_partition,
            "dlq_offset": self.dlq_offset,
            "topic": self.header(HEADER_DLQ_TOPIC),
            "partition": self._int(HEADER_DLQ_PARTITION),
            "offset": self._int(HEADER_DLQ_OFFSET),
            "key": key,
            "reminder_id": (self.header(contract.HEADER_REMINDER_ID) or "")[:64] or None,
            "reason": self.header(HEADER_DLQ_REASON),
            "attempts": self._int(HEADER_DLQ_ATTEMPTS),
            "failed_at": self.header(HEADER_DLQ_FAILED_AT),
            "size": self._int(HEADER_DLQ_SIZE),
            "truncated": bool(self.cut),
            "cut": list(self.cut),
            "replay_of": self.replay_of,
        }


def _reader(kafka: KafkaSettings) -> Consumer:
    return Consumer(
        {
            **kafka.client_config(),
            "group.id": f"reminder-pipeline-dlq-reader-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "logger": LIBRDKAFKA_LOG,
        }
    )


def read_dead_letters(
    kafka: KafkaSettings, dlq_topic: str = DLQ_TOPIC, timeout: float = 60.0
) -> list[DeadLetter]:
    """Every record of ``dlq_topic`` from the start to the end of each partition (no group join,
    no commit: reading changes nothing). A missing topic has none."""
    reader = _reader(kafka)
    try:
        try:
            metadata = reader.list_topics(topic=dlq_topic, timeout=min(timeout, 15.0))
        except KafkaException as exc:  # the broker did not answer
            raise BrokerUnavailable(
                f"KAFKA_BOOTSTRAP_SERVERS: the broker at {kafka.bootstrap_servers} did not "
                f"answer ({exc})"
            ) from None
        found = metadata.topics.get(dlq_topic)
        if found is None or found.error is not None or not found.partitions:
            return []
        partitions = sorted(found.partitions)
        reader.assign([TopicPartition(dlq_topic, p, OFFSET_BEGINNING) for p in partitions])
        # Read to each partition's end (the EOF event), not to a high watermark read up front.
        open_partitions, letters = set(partitions), []
        deadline = time.monotonic() + timeout
        while open_partitions and time.monotonic() < deadline:
            for message in reader.consume(500, timeout=0.5):
                error = message.error()
                if error is not None and error.code() == KafkaError._PARTITION_EOF:
                    open_partitions.discard(message.partition())
                elif error is None:
                    letters.append(
                        DeadLetter(
                            message.partition() or 0,
                            message.offset() or 0,
                            message.key(),
                            message.value(),
                            [(str(h[0]), h[1]) for h in message.headers() or []],
                        )
                    )
        if open_partitions:
            raise BrokerUnavailable(
                f"the dead-letter topic {dlq_topic} could not be read to its end within "
                f"{timeout:.0f}s (partitions {sorted(open_partitions)})"
            )
    finally:
        reader.close()
    return sorted(letters, key=lambda letter: (letter.dlq_partition, letter.dlq_offset))


def replay_letters(
    kafka: KafkaSettings,
    letters: Sequence[DeadLetter],
    topic: str = contract.TOPIC,
    dlq_topic: str = DLQ_TOPIC,
    timeout: float = 30.0,
    sent: list[DeadLetter] | None = None,
) -> int:
    """Produce each letter's original key, value and headers to ``topic``, marked with one
    :data:`HEADER_REPLAY_OF` naming the first dead letter; waits for every acknowledgement and
    returns how many (``sent`` gets the letters acknowledged, even when some were not). The key
    picks the partition as it did for the original, so per-event order holds."""
    producer = Producer(
        {
            **kafka.client_config(),
            "enable.idempotence": True,
            "acks": "all",
            "message.timeout.ms": int(timeout * 1000),
            "logger": LIBRDKAFKA_LOG,
        }
    )
    errors: list[str] = []
    acked = 0

    def on_delivery(letter: DeadLetter) -> Callable[[KafkaError | None, Any], None]:
        def delivered(err: KafkaError | None, _msg: Any) -> None:
            nonlocal acked
            if err is None:
                acked += 1
                if sent is not None:
                    sent.append(letter)
            else:
                errors.append(err.str())

        return delivered

    for letter in letters:
        first = letter.replay_of or f"{dlq_topic}:{letter.position}"
        kept = [(n, v) for n, v in letter.original_headers() if n != HEADER_REPLAY_OF]
        producer.produce(
            topic,
            key=letter.key,
            value=letter.value,
            headers=[*kept, (HEADER_REPLAY_OF, first.encode())],
            on_delivery=on_delivery(letter),
        )
    left = producer.flush(timeout + 5.0)
    if errors or left:
        raise BrokerUnavailable(
            f"KAFKA_BOOTSTRAP_SERVERS: {acked} of {len(letters)} replayed messages acknowledged "
            f"by the broker at {kafka.bootstrap_servers} ({errors[0] if errors else 'timed out'})"
        )
    return acked
