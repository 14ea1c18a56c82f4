"""The reference notifications consumer of pin.calendar.reminder-due.v1: the contract's other side.

At least once, in key order, never twice:

* a consumer group with manual commits, each made only after its message is handled (notified,
  recognised as a duplicate, or safely in the dead-letter topic);
* a failed attempt holds the message's partition (pause, then seek back once it is handled), so
  later reminders of the same event never overtake it while other partitions keep flowing;
* sink failures are transient: retried with capped exponential back-off, without limit;
* an unparseable or incompatible message is retried a bounded number of times, then copied to
  the dead-letter topic with the reason in its headers, and the partition moves on;
* ReminderId de-duplication in a durable store, so a redelivery never notifies twice.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import signal
import sqlite3
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol, TextIO

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition

from .. import logs
from ..config import ConfigError, KafkaSettings, Settings
from ..domain import contract
from ..logs import event
from ..messaging.kafka import BrokerUnavailable, ensure_topic
from .dedup import DedupStore, DedupStoreError, SqliteDedupStore
from .notifications import (
    IncompatibleMessage,
    Notification,
    lateness,
    notifications_for,
    parse_reminder,
)

log = logging.getLogger(__name__)

DEFAULT_GROUP_ID = "notifications-reference"
DLQ_TOPIC = f"{contract.TOPIC}.dlq"

HEADER_DLQ_REASON = "dlq-reason"
HEADER_DLQ_ERROR = "dlq-error"
HEADER_DLQ_ATTEMPTS = "dlq-attempts"
HEADER_DLQ_TOPIC = "dlq-original-topic"
HEADER_DLQ_PARTITION = "dlq-original-partition"
HEADER_DLQ_OFFSET = "dlq-original-offset"
HEADER_DLQ_GROUP = "dlq-consumer-group"
HEADER_DLQ_FAILED_AT = "dlq-failed-at"

DLQ_REASON_DELIVERY_REJECTED = "delivery-rejected"

class NotificationSink(Protocol):
    """Where notifications go (push, email, ...). Raising means "not delivered, try again later"."""

    def deliver(self, notification: Notification) -> None:
        """Deliver one notification or raise; :class:`DeliveryRejected` means never."""


class DeliveryRejected(Exception):
    """A sink's permanent refusal: retrying cannot help, so the message is dead-lettered."""


def format_notification(notification: Notification) -> str:
    """One line for people: kind, recipient, identifiers, horizon and local time (no PII exists)."""
    n = notification
    return (
        f"{n.kind} to {n.recipient_role} {n.recipient_user_id} | {n.text} | "
        f"reminder={n.reminder_id} event={n.event_id} tenant={n.tenant_id} "
        f"offset={n.offset_minutes}m"
    )


class StdoutSink:
    """The default sink: prints one line per notification."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self._stream = stream

    def deliver(self, notification: Notification) -> None:
        """Print the notification's line and flush, so a pipe sees it at once."""
        print(format_notification(notification), file=self._stream or sys.stdout, flush=True)


@dataclass
class ConsumeStats:
    """What a run did; ``messages`` counts messages handled and committed."""

    messages: int = 0
    reminders_notified: int = 0
    notifications: int = 0
    duplicates: int = 0
    dead_lettered: int = 0
    retries: int = 0
    warnings: int = 0
    commit_failures: int = 0

    def as_dict(self) -> dict[str, int]:
        """Flat dict for logs."""
        return asdict(self)


@dataclass(frozen=True)
class ConsumerOptions:
    """How the consumer runs; the defaults are the production ones."""

    group_id: str = DEFAULT_GROUP_ID
    topic: str = contract.TOPIC
    dlq_topic: str = DLQ_TOPIC
    #: Attempts at an unparseable/incompatible message before it goes to the dead-letter topic.
    max_attempts: int = 3
    retry_backoff_seconds: float = 0.5
    max_backoff_seconds: float = 30.0
    poll_timeout_seconds: float = 0.5
    dlq_timeout_seconds: float = 15.0
    #: ``once``: stop when nothing has arrived for this long after joining. Not the high
    #: watermark: brokers (the embedded one among them) may under-report it.
    once_idle_seconds: float = 5.0
    #: librdkafka properties layered over the defaults (tests make group joins faster).
    consumer_config: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        if self.retry_backoff_seconds <= 0 or self.max_backoff_seconds < self.retry_backoff_seconds:
            raise ValueError("need 0 < retry_backoff_seconds <= max_backoff_seconds")

    def backoff(self, failed_attempts: int) -> float:
        """Seconds to wait after ``failed_attempts`` failures: doubling, capped."""
        return min(self.max_backoff_seconds, self.retry_backoff_seconds * 2 ** (failed_attempts - 1))


@dataclass
class _Held:
    """A message that failed and holds its partition until it is handled."""

    message: Message
    attempts: int
    retry_at: float


def _headers(message: Message) -> dict[str, str]:
    result: dict[str, str] = {}
    for name, value in _raw_headers(message):
        result[name] = value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
    return result


def _raw_headers(message: Message) -> list[tuple[str, str | bytes | None]]:
    """The message's headers as (name, value) pairs, in order (names may repeat)."""
    return [(str(h[0]), h[1]) for h in message.headers() or []]


def _position(message: Message) -> tuple[str, int, int]:
    """(topic, partition, offset) of a consumed message (always set for those)."""
    topic, partition, offset = message.topic(), message.partition(), message.offset()
    assert topic is not None and partition is not None and offset is not None
    return topic, partition, offset


def _where(message: Message) -> dict[str, Any]:
    """Identifiers of a message for logs: position and the ids the producer put in headers."""
    headers = _headers(message)
    topic, partition, offset = _position(message)
    where: dict[str, Any] = {"topic": topic, "partition": partition, "offset": offset}
    for name, header in (("reminder_id", contract.HEADER_REMINDER_ID),
                         ("correlation_id", contract.HEADER_CORRELATION_ID)):
        if headers.get(header):
            where[name] = headers[header]
    return where


class ReminderConsumer:
    """Consumes reminder-due messages and delivers their notifications to a sink."""

    def __init__(
        self,
        kafka: KafkaSettings,
        sink: NotificationSink,
        dedup: DedupStore,
        options: ConsumerOptions | None = None,
    ) -> None:
        self.kafka = kafka
        self.sink = sink
        self.dedup = dedup
        self.options = options or ConsumerOptions()
        self.stats = ConsumeStats()
        self.assigned = threading.Event()
        self._consumer: Consumer | None = None
        self._dlq: Producer | None = None
        self._held: dict[tuple[str, int], _Held] = {}
        self._assigned_at = 0.0

    def consumer_config(self) -> dict[str, Any]:
        """librdkafka properties of the consumer."""
        return {
            **self.kafka.client_config(),
            "group.id": self.options.group_id,
            "client.id": "reminder-notifications",
            # Commits are made by hand, one per handled message: never ahead of the work.
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            # A new group starts from the oldest retained reminder rather than missing the ones
            # published before it first joined (duplicates are harmless, losses are not).
            "auto.offset.reset": "earliest",
            # Shorter than librdkafka's 45 s: a dead consumer's partitions move on well within
            # the contract's one-minute SLA (and the embedded broker joins in ~session/2).
            "session.timeout.ms": 10_000,
            "heartbeat.interval.ms": 3_000,
            "enable.partition.eof": False,
            **self.options.consumer_config,
        }

    # -- the loop --------------------------------------------------------------------------------

    def run(
        self,
        *,
        stop: threading.Event | None = None,
        max_messages: int | None = None,
        idle_timeout: float | None = None,
        join_timeout: float = 60.0,
    ) -> ConsumeStats:
        """Consume until ``stop`` is set, ``max_messages`` are handled, or idle for ``idle_timeout``.

        The idle clock starts once partitions are assigned and does not run while a message is
        held for retry. ``join_timeout`` bounds the wait for an assignment when ``idle_timeout``
        is given (a bounded run must end even if the group never forms).
        """
        stop = stop or threading.Event()
        options = self.options
        self.stats = ConsumeStats()
        self.assigned.clear()
        consumer = Consumer(self.consumer_config())
        self._consumer = consumer
        started = time.monotonic()
        last_activity = started
        consumer.subscribe(
            [options.topic], on_assign=self._on_assign, on_revoke=self._on_revoke,
            on_lost=self._on_revoke,
        )
        event(log, logging.INFO, "consumer started", group_id=options.group_id,
              topic=options.topic, dlq_topic=options.dlq_topic)
        try:
            while not stop.is_set():
                if max_messages is not None and self.stats.messages >= max_messages:
                    break
                self._retry_due(time.monotonic())
                message = consumer.poll(self._poll_timeout())
                now = time.monotonic()
                if message is None:
                    if idle_timeout is None or self._held:
                        continue
                    if self.assigned.is_set():
                        if now - max(last_activity, self._assigned_at) >= idle_timeout:
                            event(log, logging.INFO, "consumer idle; stopping",
                                  group_id=options.group_id, idle_seconds=idle_timeout)
                            break
                    elif now - started >= join_timeout:
                        event(log, logging.WARNING, "no partitions assigned in time; stopping",
                              group_id=options.group_id, join_timeout_seconds=join_timeout)
                        break
                    continue
                error = message.error()
                if error is not None:
                    self._on_error(error)
                    continue
                last_activity = now
                if _position(message)[:2] in self._held:
                    # Prefetched behind a held message: dropped now, read again after the seek.
                    continue
                self._process(message, attempt=1)
        finally:
            self._close()
        event(log, logging.INFO, "consumer stopped", group_id=options.group_id,
              **self.stats.as_dict())
        return self.stats

    def _poll_timeout(self) -> float:
        """Poll no longer than until the next held message is due for another attempt."""
        timeout = self.options.poll_timeout_seconds
        if self._held:
            next_retry = min(h.retry_at for h in self._held.values())
            timeout = min(timeout, max(next_retry - time.monotonic(), 0.0))
        return timeout

    def _retry_due(self, now: float) -> None:
        for held in [h for h in self._held.values() if h.retry_at <= now]:
            self._process(held.message, attempt=held.attempts + 1)

    def _process(self, message: Message, attempt: int) -> None:
        """Attempt ``message``; commit when handled, else hold its partition until the retry."""
        assert self._consumer is not None
        topic, partition, offset = _position(message)
        key = (topic, partition)
        try:
            retry_in = self._handle(message, attempt)
        except Exception as exc:  # noqa: BLE001 - a bug or an outage must not skip a reminder
            retry_in = self.options.backoff(attempt)
            event(log, logging.ERROR, "message handling failed; will retry", **_where(message),
                  attempt=attempt, retry_in_seconds=retry_in, exception=type(exc).__name__,
                  error=" ".join(str(exc).split())[:300])
        if retry_in is not None:
            self.stats.retries += 1
            if key not in self._held:
                self._consumer.pause([TopicPartition(topic, partition)])
            self._held[key] = _Held(message, attempt, time.monotonic() + retry_in)
            return
        self._commit(message)
        self.stats.messages += 1
        if self._held.pop(key, None) is not None:
            # Messages prefetched behind the held one were dropped: read them again from here.
            self._consumer.seek(TopicPartition(topic, partition, offset + 1))
            self._consumer.resume([TopicPartition(topic, partition)])

    def _handle(self, message: Message, attempt: int) -> float | None:
        """One attempt at ``message``: None when handled, else seconds until the next attempt."""
        where = _where(message)
        if attempt == 1:
            self._check_version(message, where)
        try:
            reminder = parse_reminder(message.value())
        except IncompatibleMessage as exc:
            if attempt < self.options.max_attempts:
                retry_in = self.options.backoff(attempt)
                event(log, logging.WARNING, "incompatible message; will retry", **where,
                      reason=exc.problem.value, error=str(exc), attempt=attempt,
                      retry_in_seconds=retry_in)
                return retry_in
            return self._dead_letter(message, exc.problem.value, str(exc), attempt)

        ids = {**where, "reminder_id": str(reminder.reminder_id),
               "event_id": str(reminder.event_id), "tenant_id": str(reminder.tenant_id)}
        if self.dedup.is_handled(reminder.reminder_id):
            self.stats.duplicates += 1
            event(log, logging.INFO, "duplicate reminder ignored", **ids)
            return None
        mapped = notifications_for(reminder)
        if attempt == 1:
            for warning in mapped.warnings:
                self.stats.warnings += 1
                event(log, logging.WARNING, warning, **ids, kind=reminder.kind,
                      time_zone=reminder.time_zone)
        for notification in mapped.notifications:
            recipient = notification.recipient_user_id
            if self.dedup.is_delivered(reminder.reminder_id, recipient):
                continue  # delivered by an earlier attempt that failed on another recipient
            try:
                self.sink.deliver(notification)
            except DeliveryRejected as exc:
                return self._dead_letter(message, DLQ_REASON_DELIVERY_REJECTED, str(exc), attempt)
            except Exception as exc:  # noqa: BLE001 - any sink failure is presumed transient
                retry_in = self.options.backoff(attempt)
                event(log, logging.WARNING, "delivery failed; will retry", **ids,
                      recipient_user_id=str(recipient), attempt=attempt,
                      retry_in_seconds=retry_in, exception=type(exc).__name__)
                return retry_in
            self.dedup.mark_delivered(reminder.reminder_id, recipient, notification.notification_id)
            self.stats.notifications += 1
        self.dedup.mark_handled(reminder.reminder_id, reminder.event_id)
        self.stats.reminders_notified += 1
        event(log, logging.INFO, "reminder notified", **ids,
              notification_kind=str(mapped.notifications[0].kind),
              recipients=len(mapped.notifications), offset_minutes=reminder.offset_minutes,
              attempts=attempt,
              lateness_seconds=round(lateness(reminder, datetime.now(UTC)).total_seconds(), 3))
        return None

    def _check_version(self, message: Message, where: dict[str, Any]) -> None:
        """Warn on a ContractVersion other than ours; the message is still processed (contract)."""
        version = _headers(message).get(contract.HEADER_CONTRACT_VERSION)
        if version != str(contract.CONTRACT_VERSION):
            self.stats.warnings += 1
            event(log, logging.WARNING, "contract version mismatch; processing anyway", **where,
                  contract_version=version, expected=str(contract.CONTRACT_VERSION))

    def _dead_letter(self, message: Message, reason: str, error: str, attempts: int) -> float | None:
        """Copy ``message`` to the dead-letter topic; None once the broker acknowledged it."""
        options = self.options
        where = _where(message)
        topic, partition, offset = _position(message)
        # The original headers first (ids, contract version), then why and whence.
        headers = _raw_headers(message) + [
            (HEADER_DLQ_REASON, reason.encode()),
            (HEADER_DLQ_ERROR, error.encode()),
            (HEADER_DLQ_ATTEMPTS, str(attempts).encode()),
            (HEADER_DLQ_TOPIC, topic.encode()),
            (HEADER_DLQ_PARTITION, str(partition).encode()),
            (HEADER_DLQ_OFFSET, str(offset).encode()),
            (HEADER_DLQ_GROUP, options.group_id.encode()),
            (HEADER_DLQ_FAILED_AT, datetime.now(UTC).isoformat(timespec="milliseconds").encode()),
        ]
        outcome: list[KafkaError | None] = []
        producer = self._dlq_producer()
        producer.produce(
            options.dlq_topic, key=message.key(), value=message.value(), headers=headers,
            on_delivery=lambda err, _msg: outcome.append(err),
        )
        producer.flush(options.dlq_timeout_seconds)
        if not outcome or outcome[0] is not None:
            # Not safely in the DLQ: keep the partition on this message rather than lose it.
            retry_in = options.backoff(attempts)
            event(log, logging.ERROR, "dead-lettering failed; will retry", **where,
                  dlq_topic=options.dlq_topic, retry_in_seconds=retry_in,
                  error=str(outcome[0]) if outcome else "no delivery report")
            return retry_in
        self.stats.dead_lettered += 1
        event(log, logging.ERROR, "message dead-lettered", **where, dlq_topic=options.dlq_topic,
              reason=reason, error=error, attempts=attempts)
        return None

    def _dlq_producer(self) -> Producer:
        if self._dlq is None:
            self._dlq = Producer(
                {
                    **self.kafka.client_config(),
                    "enable.idempotence": True,
                    "acks": "all",
                    "message.timeout.ms": int(self.options.dlq_timeout_seconds * 1000),
                }
            )
        return self._dlq

    def _commit(self, message: Message) -> None:
        """Commit past ``message``; a failure only means a redelivery, which dedup absorbs."""
        assert self._consumer is not None
        try:
            self._consumer.commit(message=message, asynchronous=False)
        except KafkaException as exc:
            self.stats.commit_failures += 1
            event(log, logging.WARNING, "offset commit failed; the message may be redelivered",
                  **_where(message), error=str(exc.args[0]) if exc.args else str(exc))

    # -- group membership and errors ---------------------------------------------------------------

    def _on_assign(self, _consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._assigned_at = time.monotonic()
        self.assigned.set()
        event(log, logging.INFO, "partitions assigned", group_id=self.options.group_id,
              partitions=sorted(p.partition for p in partitions))

    def _on_revoke(self, _consumer: Consumer, partitions: list[TopicPartition]) -> None:
        # A held message belongs to its partition's next owner now: it resumes from the
        # committed offset, which is still before the held message.
        for p in partitions:
            self._held.pop((p.topic, p.partition), None)
        event(log, logging.INFO, "partitions revoked", group_id=self.options.group_id,
              partitions=sorted(p.partition for p in partitions))

    def _on_error(self, error: KafkaError) -> None:
        if error.fatal():
            raise KafkaException(error)
        event(log, logging.WARNING, "consumer error", group_id=self.options.group_id,
              code=error.name(), error=error.str())

    def _close(self) -> None:
        if self._dlq is not None:
            left = self._dlq.flush(self.options.dlq_timeout_seconds)
            if left:
                event(log, logging.WARNING, "dead-letter producer closed with messages unsent",
                      count=left)
            self._dlq = None
        if self._consumer is not None:
            # Leaves the group; nothing is committed here, so held messages are redelivered.
            self._consumer.close()
            self._consumer = None
        self._held.clear()


@contextlib.contextmanager
def stop_on_signals(stop: threading.Event) -> Iterator[None]:
    """Set ``stop`` on SIGINT/SIGTERM while inside (main thread only; elsewhere a no-op)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    signals = (signal.SIGINT, signal.SIGTERM)
    previous = {sig: signal.getsignal(sig) for sig in signals}

    def request_stop(signum: int, _frame: object) -> None:
        event(log, logging.INFO, "stop requested", signal=signal.Signals(signum).name)
        stop.set()

    for sig in signals:
        signal.signal(sig, request_stop)
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def default_dedup_path(settings: Settings, group_id: str) -> Path:
    """Where the consumer remembers handled reminders: one file per consumer group."""
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in group_id)
    return settings.home / "notifications" / f"{safe}.dedup.sqlite3"


def consume_main(
    settings: Settings,
    *,
    group_id: str = DEFAULT_GROUP_ID,
    dedup_path: Path | None = None,
    once: bool = False,
    bootstrap_servers: str | None = None,
    sink: NotificationSink | None = None,
    stop: threading.Event | None = None,
    options: ConsumerOptions | None = None,
) -> int:
    """``reminder-pipeline consume``: print reminders as they arrive; 0 on a clean stop.

    ``bootstrap_servers`` names the embedded broker when ``settings`` do not (the CLI knows it).
    ``once`` stops after the topic has been quiet for ``options.once_idle_seconds``. ``options``
    overrides everything but ``group_id`` (tests: topic names, fast group joins).
    """
    logs.configure()
    options = dataclasses.replace(options or ConsumerOptions(), group_id=group_id)
    stop = stop or threading.Event()
    try:
        kafka = settings.kafka(bootstrap_servers)
        # The DLQ is ours to create with the contract's partition count (auto-creation would
        # pick the broker's default); the source topic too, so starting before the
        # dispatcher's first publish subscribes to a topic with the right partitions.
        ensure_topic(kafka, topic=options.topic)
        ensure_topic(kafka, topic=options.dlq_topic)
        path = dedup_path or default_dedup_path(settings, group_id)
        with SqliteDedupStore(path) as dedup, stop_on_signals(stop):
            consumer = ReminderConsumer(kafka, sink or StdoutSink(), dedup, options)
            consumer.run(stop=stop, idle_timeout=options.once_idle_seconds if once else None)
    except (ConfigError, BrokerUnavailable, DedupStoreError, sqlite3.Error, OSError) as exc:
        print(f"reminder-pipeline consume: {exc}", file=sys.stderr)
        return 2 if isinstance(exc, ConfigError) else 1
    except KafkaException as exc:
        print(f"reminder-pipeline consume: Kafka error: {exc}", file=sys.stderr)
        return 1
    return 0
