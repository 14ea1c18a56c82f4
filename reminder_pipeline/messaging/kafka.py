"""Kafka clients built from :class:`~reminder_pipeline.config.KafkaSettings`, and the topic."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from confluent_kafka import KafkaError, KafkaException, Message, Producer
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from ..config import KafkaSettings
from ..domain import contract
from ..domain.model import ClaimedMessage
from ..logs import event

log = logging.getLogger(__name__)


#: Waited for delivery reports beyond the producer's own message timeout (its reports are
#: served by flush() in 1 s slices).
REPORT_MARGIN_SECONDS = 5.0


class BrokerUnavailable(ConnectionError):
    """The broker could not be reached in time; the message is one line naming the setting."""


def ensure_topic(
    settings: KafkaSettings,
    topic: str = contract.TOPIC,
    partitions: int = contract.PARTITIONS,
    replication_factor: int = -1,
    timeout: float = 15.0,
) -> bool:
    """Create ``topic`` with ``partitions`` if it is missing; True when it was created.

    Producing to a missing topic would auto-create it with the broker's default partition
    count, not the contract's 3, so the topic is created explicitly before the first publish.
    ``replication_factor=-1`` takes the cluster's default.
    """
    admin = AdminClient(settings.client_config())
    try:
        metadata = admin.list_topics(timeout=timeout)
    except KafkaException as exc:
        raise BrokerUnavailable(
            f"KAFKA_BOOTSTRAP_SERVERS: the broker at {settings.bootstrap_servers} did not answer "
            f"within {timeout:.0f}s ({exc.args[0].str() if exc.args else exc})"
        ) from None
    existing = metadata.topics.get(topic)
    if existing is not None and existing.error is None:
        if len(existing.partitions) != partitions:
            event(
                log,
                logging.WARNING,
                "topic has an unexpected partition count",
                topic=topic,
                partitions=len(existing.partitions),
                expected=partitions,
            )
        return False
    futures = admin.create_topics(
        [NewTopic(topic, num_partitions=partitions, replication_factor=replication_factor)],
        operation_timeout=timeout,
    )
    try:
        futures[topic].result(timeout=timeout)
    except KafkaException as exc:
        if exc.args and exc.args[0].code() == KafkaError.TOPIC_ALREADY_EXISTS:
            return False
        raise
    event(log, logging.INFO, "topic created", topic=topic, partitions=partitions)
    # Wait until the metadata shows the topic, so the first produce does not auto-create it.
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = admin.list_topics(topic=topic, timeout=timeout).topics.get(topic)
        if found is not None and found.error is None and len(found.partitions) == partitions:
            break
        time.sleep(0.05)
    return True


@dataclass(frozen=True)
class DeliveryResult:
    """The broker's answer for one outbox row: None error means acknowledged, and then where the
    message landed (``partition``, ``offset``, from the delivery report)."""

    outbox_id: int
    error: str | None
    partition: int | None = None
    offset: int | None = None


class KafkaPublisher:
    """An idempotent, acks=all producer that reports per-row delivery of outbox rows."""

    def __init__(self, settings: KafkaSettings, *, message_timeout_ms: int = 15_000) -> None:
        self.settings = settings
        self.message_timeout_ms = message_timeout_ms
        self._producer = Producer(
            {
                **settings.client_config(),
                "enable.idempotence": True,
                "acks": "all",
                "linger.ms": 5,
                "compression.type": "none",
                # Bounded so a broker outage turns into failed deliveries within the cycle,
                # leaving the rows unpublished for the next one, instead of hanging.
                "message.timeout.ms": message_timeout_ms,
                "socket.connection.setup.timeout.ms": 5_000,
            }
        )

    def publish(
        self, messages: Sequence[ClaimedMessage], timeout: float | None = None
    ) -> list[DeliveryResult]:
        """Produce ``messages`` in order and return each one's delivery report.

        librdkafka reports every message within ``message.timeout.ms`` of producing it (an
        acknowledgement, or a failure once its retries are spent), so by default this waits for
        all reports, bounded by that timeout plus a margin: a slow broker's late acks count as
        deliveries, not failures. ``timeout`` bounds the wait instead; a message still without a
        report then counts as failed (it stays unpublished and goes out again: at least once).
        """
        results: dict[int, str | None] = {}
        landed: dict[int, tuple[int | None, int | None]] = {}

        def on_delivery(outbox_id: int) -> Callable[[KafkaError | None, Message], None]:
            def callback(err: KafkaError | None, msg: Message) -> None:
                if err is None:
                    landed[outbox_id] = (msg.partition(), msg.offset())
                results[outbox_id] = None if err is None else str(err)

            return callback

        for message in messages:
            while True:
                try:
                    self._producer.produce(
                        message.topic,
                        key=message.message_key.encode(),
                        value=message.payload.encode(),
                        headers=[(k, str(v).encode()) for k, v in message.headers.items()],
                        on_delivery=on_delivery(message.id),
                    )
                    break
                except BufferError:  # the local queue is full: serve reports, then retry
                    self._producer.poll(0.05)
                except KafkaException as error:  # refused at once (too large, a bad topic): that
                    results[message.id] = str(error)  # row fails; it stays in the outbox
                    break
        # No poll(0) per message: each one releases and re-takes the GIL, and while another
        # thread runs Python (the dispatcher, during a catch-up) every re-take waits for the
        # interpreter's switch interval. The reports are served by flush() below.
        if timeout is None:
            timeout = self.message_timeout_ms / 1000 + REPORT_MARGIN_SECONDS
        deadline = time.monotonic() + timeout
        while len(results) < len(messages) and time.monotonic() < deadline:
            self._producer.flush(min(1.0, max(deadline - time.monotonic(), 0.0)))
        return [
            DeliveryResult(
                m.id,
                results.get(m.id, "no delivery report within the timeout"),
                *landed.get(m.id, (None, None)),
            )
            for m in messages
        ]

    def close(self, timeout: float = 10.0) -> int:
        """Flush what is still queued; returns how many messages were left undelivered."""
        return self._producer.flush(timeout)
