"""The record of dead-letter replays: which dead letters were sent back, when and by whom.

``dlq replay`` writes one record per dead letter the broker acknowledged sending back, to
``<dead-letter topic>.replays`` (key: the dead letter's ``partition:offset``; value: JSON with
when, by whom and to which topic). ``dlq replay --all`` leaves out the dead letters it names, so
running it twice sends nothing more; ``dlq list`` shows them. The record lives on the broker
next to the dead letters it describes, written after them, so it outlives them under the same
retention, and the dead-letter tools still need no database.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from confluent_kafka import KafkaError, Producer

from ..config import KafkaSettings
from .dead_letters import DeadLetter, read_dead_letters
from .kafka import LIBRDKAFKA_LOG, BrokerUnavailable, ensure_topic

#: The replay record's topic is the dead-letter topic's name with this after it.
REPLAYS_SUFFIX = ".replays"


def replays_topic(dlq_topic: str) -> str:
    """The topic recording the replays of ``dlq_topic``'s dead letters."""
    return f"{dlq_topic}{REPLAYS_SUFFIX}"


@dataclass(frozen=True)
class Replayed:
    """What the record says of one dead letter: its last replay and how many there were."""

    replayed_at: str
    replayed_by: str
    topic: str
    replays: int

    def plain(self) -> dict[str, Any]:
        """As builtins (``dlq list --json``)."""
        return {
            "replayed_at": self.replayed_at,
            "replayed_by": self.replayed_by,
            "replays": self.replays,
        }


def read_replays(
    kafka: KafkaSettings, dlq_topic: str, timeout: float = 60.0
) -> dict[tuple[int, int], Replayed]:
    """Every recorded replay of ``dlq_topic``'s dead letters, by (partition, offset); a record
    that cannot be read is ignored (it names nothing)."""
    found: dict[tuple[int, int], Replayed] = {}
    for record in read_dead_letters(kafka, replays_topic(dlq_topic), timeout):
        try:
            data = json.loads(record.value or b"")
            where = (int(data["dlq_partition"]), int(data["dlq_offset"]))
            before = found.get(where)
            found[where] = Replayed(
                str(data["replayed_at"]),
                str(data["replayed_by"]),
                str(data["topic"]),
                (before.replays if before else 0) + 1,
            )
        except (ValueError, KeyError, TypeError):
            continue
    return found


def record_replays(
    kafka: KafkaSettings,
    dlq_topic: str,
    letters: Sequence[DeadLetter],
    *,
    actor: str,
    topic: str,
    timeout: float = 30.0,
) -> None:
    """Record that ``letters`` were replayed to ``topic`` by ``actor`` now; waits for the
    broker's acknowledgement (:class:`BrokerUnavailable` naming how many were not recorded)."""
    if not letters:
        return
    target = replays_topic(dlq_topic)
    ensure_topic(kafka, topic=target, partitions=1)
    producer = Producer(
        {
            **kafka.client_config(),
            "enable.idempotence": True,
            "acks": "all",
            "message.timeout.ms": int(timeout * 1000),
            "logger": LIBRDKAFKA_LOG,
        }
    )
    now = datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
    errors: list[KafkaError] = []
    for letter in letters:
        value = {
            "dlq_topic": dlq_topic,
            "dlq_partition": letter.dlq_partition,
            "dlq_offset": letter.dlq_offset,
            "replayed_at": now,
            "replayed_by": actor,
            "topic": topic,
        }
        producer.produce(
            target,
            key=letter.position.encode(),
            value=json.dumps(value).encode(),
            on_delivery=lambda err, _msg: errors.append(err) if err is not None else None,
        )
    left = producer.flush(timeout + 5.0)
    if errors or left:
        raise BrokerUnavailable(
            f"KAFKA_BOOTSTRAP_SERVERS: the replays went out but {len(errors) + left} of "
            f"{len(letters)} were not recorded in {target} "
            f"({errors[0].str() if errors else 'timed out'}): a later --all may send them again"
        )
