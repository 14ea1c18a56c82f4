"""Dead-lettering: a message copied to the dead-letter topic, or refused by the broker for good.

A copy is safely in the topic only once the broker acknowledges it; until then the message keeps
its partition (an outage, retried with back-off). A copy too big for the broker is cut to fit,
and one the broker refuses even then is skipped and counted: a permanent outcome of that
message, so no message holds a partition for good.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from ..config import KafkaSettings
from ..logs import event
from ..messaging.dead_letters import (
    HEADER_DLQ_ATTEMPTS,
    HEADER_DLQ_ERROR,
    HEADER_DLQ_FAILED_AT,
    HEADER_DLQ_GROUP,
    HEADER_DLQ_OFFSET,
    HEADER_DLQ_PARTITION,
    HEADER_DLQ_REASON,
    HEADER_DLQ_TOPIC,
)
from ..messaging.kafka import LIBRDKAFKA_LOG
from . import kafka_messages
from .dead_letter_copy import ALL_CUT, DeadLetterCopy, dead_letter_copy
from .metrics import ConsumerMetrics
from .options import ConsumerOptions, ConsumeStats

log = logging.getLogger(__name__)

#: Produce errors that belong to the message, not to the broker's health: retrying the same
#: copy cannot succeed, so they are a permanent outcome, never an outage loop.
_REFUSALS = frozenset(
    {
        KafkaError.MSG_SIZE_TOO_LARGE,
        KafkaError.RECORD_LIST_TOO_LARGE,
        KafkaError.INVALID_MSG_SIZE,
        KafkaError.INVALID_MSG,
        KafkaError.INVALID_RECORD,
    }
)


class DeadLetters:
    """The dead-letter producer of one run: copies messages, counts and logs the outcome."""

    def __init__(
        self,
        kafka: KafkaSettings,
        options: ConsumerOptions,
        stats: ConsumeStats,
        metrics: ConsumerMetrics,
    ) -> None:
        self.kafka = kafka
        self.options = options
        self.stats = stats
        self.metrics = metrics
        self._producer: Producer | None = None

    def send(self, message: Message, reason: str, error: str, attempts: int) -> float | None:
        """Copy ``message`` to the dead-letter topic; None once it is there or refused for good,
        else the seconds to wait before trying again (the partition stays on it)."""
        options = self.options
        where = kafka_messages.where(message)
        topic, partition, offset = kafka_messages.position(message)
        # The original headers first (ids, contract version), then why and whence.
        origin: list[tuple[str, str | bytes | None]] = [
            (HEADER_DLQ_REASON, reason.encode()),
            (HEADER_DLQ_ERROR, error.encode()),
            (HEADER_DLQ_ATTEMPTS, str(attempts).encode()),
            (HEADER_DLQ_TOPIC, topic.encode()),
            (HEADER_DLQ_PARTITION, str(partition).encode()),
            (HEADER_DLQ_OFFSET, str(offset).encode()),
            (HEADER_DLQ_GROUP, options.group_id.encode()),
            (HEADER_DLQ_FAILED_AT, datetime.now(UTC).isoformat(timespec="milliseconds").encode()),
        ]
        copy = dead_letter_copy(
            message.key(),
            message.value(),
            kafka_messages.raw_headers(message),
            origin,
            options.dlq_max_bytes,
        )
        failure = self._produce(copy)
        if failure is not None and failure.code() in _REFUSALS and copy.truncated != ALL_CUT:
            # The broker (or a topic's max.message.bytes) allows less than we assumed: the
            # origin headers alone still let an operator find the original.
            copy = dead_letter_copy(
                message.key(), message.value(), kafka_messages.raw_headers(message), copy.origin, 0
            )
            failure = self._produce(copy)
        if failure is not None and failure.code() in _REFUSALS:
            # Permanent: the same record is refused however often it is sent. Holding the
            # partition for it would stop every reminder behind it for good.
            self.stats.dead_letters_refused += 1
            self.metrics.dead_letters_refused.labels(reason).inc()
            self.metrics.messages.labels("dead_letter_refused").inc()
            event(
                log,
                logging.ERROR,
                "dead letter refused by the broker; message skipped",
                **where,
                dlq_topic=options.dlq_topic,
                reason=reason,
                size=copy.size,
                sha256=copy.digest,
                error=failure.str(),
            )
            return None
        if failure is not None:
            # Not safely in the DLQ (broker down, no ACL): keep the partition on this message.
            retry_in = options.backoff(attempts)
            self.metrics.retries.labels("dead_letter").inc()
            event(
                log,
                logging.ERROR,
                "dead-lettering failed; will retry",
                **where,
                dlq_topic=options.dlq_topic,
                retry_in_seconds=retry_in,
                error=failure.str(),
            )
            return retry_in
        self.stats.dead_lettered += 1
        self.metrics.dead_letters.labels(reason).inc()
        self.metrics.messages.labels("dead_lettered").inc()
        event(
            log,
            logging.ERROR,
            "message dead-lettered",
            **where,
            dlq_topic=options.dlq_topic,
            reason=reason,
            error=error,
            attempts=attempts,
            size=copy.size,
            sha256=copy.digest,
            truncated=",".join(copy.truncated) or None,
        )
        return None

    def _produce(self, copy: DeadLetterCopy) -> KafkaError | None:
        """Produce ``copy`` and wait for the broker: None when acknowledged, else the error."""
        outcome: list[KafkaError | None] = []
        producer = self._dead_letter_producer()
        try:
            producer.produce(
                self.options.dlq_topic,
                key=copy.key,
                value=copy.value,
                headers=copy.headers,
                on_delivery=lambda err, _msg: outcome.append(err),
            )
        except KafkaException as exc:  # refused before sending (e.g. MSG_SIZE_TOO_LARGE)
            error = exc.args[0] if exc.args else None
            return error if isinstance(error, KafkaError) else KafkaError(KafkaError._FAIL)
        except BufferError:  # the local queue is full: transient
            return KafkaError(KafkaError._QUEUE_FULL)
        producer.flush(self.options.dlq_timeout_seconds)
        if not outcome:
            return KafkaError(KafkaError._MSG_TIMED_OUT)
        return outcome[0]

    def _dead_letter_producer(self) -> Producer:
        if self._producer is None:
            self._producer = Producer(
                {
                    **self.kafka.client_config(),
                    "enable.idempotence": True,
                    "acks": "all",
                    "message.timeout.ms": int(self.options.dlq_timeout_seconds * 1000),
                    "message.max.bytes": self.options.dlq_max_bytes,
                    "logger": LIBRDKAFKA_LOG,
                    **self.options.dlq_producer_config,
                }
            )
        return self._producer

    def close(self) -> None:
        """Flush what is still queued (bounded by ``dlq_timeout_seconds``) and drop the producer."""
        if self._producer is not None:
            left = self._producer.flush(self.options.dlq_timeout_seconds)
            if left:
                event(
                    log,
                    logging.WARNING,
                    "dead-letter producer closed with messages unsent",
                    count=left,
                )
            self._producer = None
