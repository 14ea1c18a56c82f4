"""Kafka clients built from :class:`~reminder_pipeline.config.KafkaSettings`, and the topic."""

from __future__ import annotations

import contextlib
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


class LibrdkafkaLog:
    """librdkafka's own log lines, at DEBUG in this package's log (never raw ``%3|...|FAIL|``
    lines on stderr). While a broker does not answer it writes one per connection attempt,
    about every second; what uses the client reports the outage once instead (a command's one
    line, the publisher's "kafka deliveries failing" / "kafka deliveries work again")."""

    def log(self, _level: int, message: str, *args: object) -> None:
        """confluent-kafka's ``logger`` interface: every level goes to DEBUG."""
        log.debug(message, *args)


#: Every Kafka client's ``logger`` (the ``logger=`` argument or config key of confluent-kafka).
LIBRDKAFKA_LOG = LibrdkafkaLog()


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
    admin = AdminClient(settings.client_config(), logger=LIBRDKAFKA_LOG)
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


#: How long librdkafka keeps a message and retries it before reporting it failed. Long, so a
#: broker that stops answering for a while (paused, frozen, cut off) is ridden out: a message
#: already sent may be written when the broker resumes, and one that timed out meanwhile would be
#: produced again (a duplicate) and would make the broker fence the producer.
DELIVERY_TIMEOUT_MS = 300_000
#: How long :meth:`KafkaPublisher.publish` waits for reports before handing back; a message
#: still unreported then stays in flight in the producer (see :meth:`KafkaPublisher.publish`).
REPORT_WAIT_SECONDS = 15.0
IN_FLIGHT = "no delivery report yet: still in flight in the producer (not produced again)"
#: A producer refused with one of these never delivers again (after a long pause the broker sees
#: its epoch as stale, and librdkafka does not always raise it as fatal): it is replaced.
FENCED = frozenset(
    {KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH, KafkaError._FENCED}
)


def wire_headers(headers: dict[str, str]) -> list[tuple[str, str | bytes | None]]:
    """A message's headers as produced: as stored, plus the ``message-id`` a reminder's message
    carries on every copy (derived from its ``reminder-id``: the relay's, a drain's hand-over,
    a re-publish and a re-send after a lost commit all say it is the same message).

    Derived here, where every copy passes, rather than stored with the outbox row: the hash in
    the batch statement cost the drain ~8 % of its rows per second, here about 1 %
    (docs/contract.md, "Headers")."""
    pairs: list[tuple[str, str | bytes | None]] = [(k, str(v).encode()) for k, v in headers.items()]
    reminder_id = headers.get(contract.HEADER_REMINDER_ID)
    if reminder_id and contract.HEADER_MESSAGE_ID not in headers:
        pairs.append((contract.HEADER_MESSAGE_ID, contract.message_id(reminder_id).encode()))
    return pairs


class KafkaPublisher:
    """An idempotent, acks=all producer that reports per-row delivery of outbox rows.

    It heals by itself: a message whose report has not come yet is never produced again by this
    publisher (a later publish waits for that report), and a producer the broker fenced or that
    failed fatally is replaced by a new one (logged once per replacement, counted in
    :attr:`replacements`).
    """

    def __init__(
        self, settings: KafkaSettings, *, message_timeout_ms: int = DELIVERY_TIMEOUT_MS
    ) -> None:
        self.settings = settings
        self.message_timeout_ms = message_timeout_ms
        self._closed = False
        #: Producers replaced after a fatal error (a fenced producer never publishes again).
        self.replacements = 0
        self._reports: dict[int, str | None] = {}  # outbox id -> report not yet handed back
        #: outbox id -> (partition, offset) of its delivery, handed back with its report
        self._landed: dict[int, tuple[int | None, int | None]] = {}
        self._in_flight: set[int] = set()  # produced, no report yet
        self._fatal: str | None = None
        self._generation = 0  # which producer a callback belongs to (a replaced one is ignored)
        self._failing_since: float | None = None  # monotonic start of the current outage
        self._producer = self._new_producer()

    def _new_producer(self) -> Producer:
        self._generation += 1
        generation = self._generation

        def on_error(error: KafkaError) -> None:
            if (error.fatal() or error.code() in FENCED) and generation == self._generation:
                self._fatal = str(error)

        return Producer(
            {
                **self.settings.client_config(),
                "enable.idempotence": True,
                "acks": "all",
                "linger.ms": 5,
                "compression.type": "none",
                # Bounded so a broker that is gone turns into failed deliveries, leaving the rows
                # unpublished for a later pass, instead of holding them for ever (a silent
                # connection is dropped and made again sooner: client_config's socket.timeout.ms).
                "message.timeout.ms": self.message_timeout_ms,
                "error_cb": on_error,
                "logger": LIBRDKAFKA_LOG,
            }
        )

    def _on_delivery(self, outbox_id: int) -> Callable[[KafkaError | None, Message], None]:
        generation = self._generation

        def callback(err: KafkaError | None, msg: Message) -> None:
            if generation != self._generation:
                return  # a replaced producer's report: its row is produced again (or was)
            self._in_flight.discard(outbox_id)
            self._reports[outbox_id] = None if err is None else str(err)
            if err is None:
                self._landed[outbox_id] = (msg.partition(), msg.offset())
            if err is not None and (err.fatal() or err.code() in FENCED):
                self._fatal = str(err)

        return callback

    def publish(
        self, messages: Sequence[ClaimedMessage], timeout: float | None = None
    ) -> list[DeliveryResult]:
        """Produce ``messages`` in order and return each one's delivery report.

        Waits for the reports at most ``timeout`` (by default the delivery timeout, at most
        :data:`REPORT_WAIT_SECONDS`, plus a margin): a slow broker's late acks count as
        deliveries, not failures. A message still without a report then counts as failed for
        this call but stays in flight: it is not produced again by a later call, which waits for
        its report instead (an ack that comes after the broker resumes marks it then), so a
        broker that pauses never gets a row twice from this producer.
        """
        for message in messages:
            if message.id in self._in_flight:
                continue
            self._reports.pop(message.id, None)
            headers = wire_headers(message.headers)
            while True:
                try:
                    self._producer.produce(
                        message.topic,
                        key=message.message_key.encode(),
                        value=message.payload.encode(),
                        headers=headers,
                        on_delivery=self._on_delivery(message.id),
                    )
                    self._in_flight.add(message.id)
                    break
                except BufferError:  # the local queue is full: serve reports, then retry
                    self._producer.poll(0.05)
                except KafkaException as error:  # refused at once (too large, a bad topic): that
                    self._reports[message.id] = str(error)  # row fails; it stays in the outbox
                    break
        # No poll(0) per message: each one releases and re-takes the GIL, and while another
        # thread runs Python (the dispatcher, during a catch-up) every re-take waits for the
        # interpreter's switch interval. The reports are served by flush() below.
        if timeout is None:
            wait = min(self.message_timeout_ms / 1000, REPORT_WAIT_SECONDS)
            timeout = wait + REPORT_MARGIN_SECONDS
        deadline = time.monotonic() + timeout
        ids = [m.id for m in messages]
        while any(i in self._in_flight for i in ids) and time.monotonic() < deadline:
            self._producer.flush(min(1.0, max(deadline - time.monotonic(), 0.0)))
            if self._fatal is not None:
                break
        pending = IN_FLIGHT
        if self._fatal is not None:
            pending = f"producer fenced or failed fatally, replaced: {self._fatal}"
            self._replace()
        results = [
            DeliveryResult(
                i,
                self._reports.pop(i) if i in self._reports else pending,
                *self._landed.pop(i, (None, None)),
            )
            for i in ids
        ]
        self._note_outage(results)
        return results

    def _note_outage(self, results: list[DeliveryResult]) -> None:
        """Log an outage once when deliveries start failing and once when they work again."""
        error = next((r.error for r in results if r.error is not None), None)
        if error is not None and self._failing_since is None:
            self._failing_since = time.monotonic()
            event(
                log,
                logging.WARNING,
                "kafka deliveries failing; the outbox rows wait",
                error=" ".join(error.split())[:300],
            )
        elif results and error is None and self._failing_since is not None:
            event(
                log,
                logging.INFO,
                "kafka deliveries work again",
                outage_seconds=round(time.monotonic() - self._failing_since, 1),
            )
            self._failing_since = None

    def _replace(self) -> None:
        """A fatal error (the broker fenced this producer): nothing it holds will be delivered,
        and it refuses every new message. Start a new one; the rows go out with it."""
        event(
            log,
            logging.WARNING,
            "kafka producer fenced or failed fatally; replaced by a new one",
            error=" ".join((self._fatal or "").split())[:300],
            in_flight=len(self._in_flight),
        )
        old = self._producer
        self._producer = self._new_producer()  # the old one's reports are ignored from now
        self._fatal = None
        self.replacements += 1
        self._in_flight.clear()  # their rows stay unpublished and are produced again
        with contextlib.suppress(KafkaException, RuntimeError):
            old.purge()
            old.flush(0)
            old.close()  # its connections go with it

    def close(self, timeout: float = 10.0) -> int:
        """Flush what is still queued, then close the producer: its connections go with it, so a
        broker stopping later (or one that is down) is no news to it. Returns how many messages
        were left undelivered after ``timeout``; those are dropped from the producer, never
        marked published, so they stay in the outbox for the next relay (at least once)."""
        if self._closed:
            return 0
        left = int(self._producer.flush(timeout))
        if left:
            self._producer.purge()
            self._producer.flush(0)  # serve the purged messages' reports
        self._producer.close()
        self._closed = True
        return left
