"""The reference notifications consumer of pin.calendar.reminder-due.v1: the contract's other side.

At least once, in key order, never twice:

* a consumer group with manual commits, each made only after its message is handled (notified,
  recognised as a duplicate, or safely in the dead-letter topic);
* a failed attempt holds the message's partition (pause, then seek back once it is handled), so
  later reminders of the same event never overtake it while other partitions keep flowing;
* reading a message into notifications (parsing, the local time, the text) is deterministic: any
  error there, expected or not, counts toward a bounded number of attempts, then the message is
  copied to the dead-letter topic with the reason in its headers and the partition moves on;
* delivering is not: sink and de-duplication store failures are outages, retried with capped
  exponential back-off without limit (the contract: the partition does not move past them);
* no message holds a partition for good: a dead-letter copy too big for the broker is cut to fit
  (the original's position, size and SHA-256 in its headers), and one the broker refuses even
  then is skipped and counted (a permanent outcome of that message, not an outage);
* a rebalance never strands a partition: librdkafka keeps an application's pause across revoke
  and re-assign, so every partition is resumed when it is assigned;
* ReminderId de-duplication in a durable store, so a redelivery never notifies twice (on one
  host with the SQLite file, on every host with the shared PostgreSQL store);
* a reminder whose StartAt passed more than a grace ago is dropped, counted and logged.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
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

from confluent_kafka import (
    TIMESTAMP_NOT_AVAILABLE,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)

from .. import logs
from ..config import ConfigError, KafkaSettings, Settings
from ..domain import contract
from ..logs import event
from ..messaging.kafka import BrokerUnavailable, ensure_topic
from .dedup import DedupStore, DedupStoreError, PostgresDedupStore, SqliteDedupStore
from .metrics import (
    DEFAULT_HOST,
    ConsumerMetrics,
    MetricsPortUnavailable,
    MetricsServer,
    serve_metrics,
)
from .notifications import (
    IncompatibleMessage,
    MappedReminder,
    MessageProblem,
    Notification,
    due_at,
    notifications_for,
    parse_reminder,
)
from .texts import Locale, parse_locale

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
#: The original value's size in bytes and its SHA-256 (hex): a copy cut to fit still names it.
HEADER_DLQ_SIZE = "dlq-original-size"
HEADER_DLQ_DIGEST = "dlq-original-sha256"
#: Present when the copy is not the whole original: what was cut ("value", "headers").
HEADER_DLQ_TRUNCATED = "dlq-truncated"

#: librdkafka's default ``message.max.bytes`` (Kafka's broker default is 1,048,588): any message
#: a default producer could send fits the broker, but its dead-letter copy with our headers
#: may not, so the copy is cut to this.
DEFAULT_DLQ_MAX_BYTES = 1_000_000
#: Room kept for the record's framing (lengths, attributes, the batch header) in that budget.
DLQ_RECORD_OVERHEAD = 1_024

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

DLQ_REASON_DELIVERY_REJECTED = MessageProblem.DELIVERY_REJECTED.value


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
    dead_letters_refused: int = 0
    passed_dropped: int = 0
    retries: int = 0
    warnings: int = 0
    time_zone_fallbacks: int = 0
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
    #: Attempts at reading a message into notifications (unparseable, incompatible, or any
    #: error building them) before it goes to the dead-letter topic. Delivery is not bounded.
    max_attempts: int = 3
    retry_backoff_seconds: float = 0.5
    max_backoff_seconds: float = 30.0
    poll_timeout_seconds: float = 0.5
    dlq_timeout_seconds: float = 15.0
    #: The largest dead-letter copy produced (value, key and headers); a bigger one is cut.
    dlq_max_bytes: int = DEFAULT_DLQ_MAX_BYTES
    #: librdkafka properties of the dead-letter producer layered over the defaults.
    dlq_producer_config: Mapping[str, Any] = field(default_factory=dict)
    #: ``once``: stop when nothing has arrived for this long after joining. Not the high
    #: watermark: brokers (the embedded one among them) may under-report it.
    once_idle_seconds: float = 5.0
    #: librdkafka properties layered over the defaults (tests make group joins faster).
    consumer_config: Mapping[str, Any] = field(default_factory=dict)
    #: The language of the reminder texts (``en``, ``ru``).
    locale: str = Locale.EN.value
    #: A reminder whose StartAt passed more than this long ago is dropped, not notified (the
    #: contract allows it: a re-published or long-held message about a meeting that is over).
    #: The grace keeps "starts now" reminders (OffsetMinutes 0) that arrive seconds late.
    #: None: never drop.
    drop_after_start_seconds: float | None = 300.0

    def __post_init__(self) -> None:
        parse_locale(self.locale)  # a bad locale must stop the start, not dead-letter every message
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        if self.dlq_max_bytes < 4 * DLQ_RECORD_OVERHEAD:
            raise ValueError(f"dlq_max_bytes must be at least {4 * DLQ_RECORD_OVERHEAD}")
        if self.drop_after_start_seconds is not None and self.drop_after_start_seconds < 0:
            raise ValueError("drop_after_start_seconds must be 0 or more (None: never drop)")
        if self.retry_backoff_seconds <= 0 or self.max_backoff_seconds < self.retry_backoff_seconds:
            raise ValueError("need 0 < retry_backoff_seconds <= max_backoff_seconds")

    def backoff(self, failed_attempts: int) -> float:
        """Seconds to wait after ``failed_attempts`` failures: doubling, capped."""
        return min(
            self.max_backoff_seconds, self.retry_backoff_seconds * 2 ** (failed_attempts - 1)
        )


@dataclass
class _Held:
    """A message that failed and holds its partition until it is handled."""

    message: Message
    attempts: int
    read_failures: int
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
    for name, header in (
        ("reminder_id", contract.HEADER_REMINDER_ID),
        ("correlation_id", contract.HEADER_CORRELATION_ID),
    ):
        if headers.get(header):
            where[name] = headers[header][:64]
    return where


def _one_line(error: BaseException) -> str:
    return " ".join(f"{type(error).__name__}: {error}".split())[:300]


def _message_time(message: Message) -> datetime | None:
    """The message's Kafka timestamp (producer create time or log append time), if it has one."""
    kind, millis = message.timestamp()
    if kind == TIMESTAMP_NOT_AVAILABLE or millis is None or millis <= 0:
        return None
    return datetime.fromtimestamp(millis / 1000, UTC)


class ReminderConsumer:
    """Consumes reminder-due messages and delivers their notifications to a sink."""

    def __init__(
        self,
        kafka: KafkaSettings,
        sink: NotificationSink,
        dedup: DedupStore,
        options: ConsumerOptions | None = None,
        metrics: ConsumerMetrics | None = None,
    ) -> None:
        self.kafka = kafka
        self.sink = sink
        self.dedup = dedup
        self.options = options or ConsumerOptions()
        self.locale = parse_locale(self.options.locale)
        self.metrics = metrics or ConsumerMetrics()
        self.stats = ConsumeStats()
        self.assigned = threading.Event()
        #: Partitions this member owns now, and how many assignments it has received (tests
        #: and operators can see a rebalance happen).
        self.owned: frozenset[int] = frozenset()
        self.assignments = 0
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

    def held_partitions(self) -> list[int]:
        """Partitions stopped on a message that waits for a retry."""
        # A snapshot: another thread (a test, a health probe) may ask while the loop runs.
        return sorted(partition for _topic, partition in list(self._held))

    # -- the loop --------------------------------------------------------------------------------

    def run(
        self,
        *,
        stop: threading.Event | None = None,
        max_messages: int | None = None,
        idle_timeout: float | None = None,
        join_timeout: float = 60.0,
    ) -> ConsumeStats:
        """Consume until ``stop`` is set, ``max_messages`` are handled, or ``idle_timeout`` passes.

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
            [options.topic],
            on_assign=self._on_assign,
            on_revoke=self._on_revoke,
            on_lost=self._on_revoke,
        )
        event(
            log,
            logging.INFO,
            "consumer started",
            group_id=options.group_id,
            topic=options.topic,
            dlq_topic=options.dlq_topic,
            locale=self.locale.value,
        )
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
                            event(
                                log,
                                logging.INFO,
                                "consumer idle; stopping",
                                group_id=options.group_id,
                                idle_seconds=idle_timeout,
                            )
                            break
                    elif now - started >= join_timeout:
                        event(
                            log,
                            logging.WARNING,
                            "no partitions assigned in time; stopping",
                            group_id=options.group_id,
                            join_timeout_seconds=join_timeout,
                        )
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
                self._process(message, attempt=1, read_failures=0)
        finally:
            self._close()
        event(
            log, logging.INFO, "consumer stopped", group_id=options.group_id, **self.stats.as_dict()
        )
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
            self._process(held.message, attempt=held.attempts + 1, read_failures=held.read_failures)

    def _process(self, message: Message, attempt: int, read_failures: int) -> None:
        """Attempt ``message``; commit when handled, else hold its partition until the retry."""
        assert self._consumer is not None
        topic, partition, offset = _position(message)
        key = (topic, partition)
        try:
            retry = self._handle(message, attempt, read_failures)
        except Exception as exc:  # noqa: BLE001 - an outage or a bug must not skip a reminder
            retry_in = self.options.backoff(attempt)
            self.metrics.retries.labels("deliver").inc()
            event(
                log,
                logging.ERROR,
                "message handling failed; will retry",
                **_where(message),
                attempt=attempt,
                retry_in_seconds=retry_in,
                error=_one_line(exc),
            )
            retry = _Retry(retry_in, read_failed=False)
        if retry is not None:
            self.stats.retries += 1
            if key not in self._held:
                self._consumer.pause([TopicPartition(topic, partition)])
            self._held[key] = _Held(
                message,
                attempt,
                read_failures + retry.read_failed,
                time.monotonic() + retry.seconds,
            )
            self.metrics.held_partitions.set(len(self._held))
            return
        self._commit(message)
        self.stats.messages += 1
        if self._held.pop(key, None) is not None:
            self.metrics.held_partitions.set(len(self._held))
            # Messages prefetched behind the held one were dropped: read them again from here.
            self._consumer.seek(TopicPartition(topic, partition, offset + 1))
            self._consumer.resume([TopicPartition(topic, partition)])

    def _handle(self, message: Message, attempt: int, read_failures: int) -> _Retry | None:
        """One attempt at ``message``: None when handled, else when and why to try again."""
        where = _where(message)
        # Reading: deterministic, so whatever fails here fails again; bounded, then the DLQ.
        try:
            if attempt == 1:
                self._check_version(message, where)
            reminder = parse_reminder(message.value())
            mapped = notifications_for(reminder, self.locale)
        except IncompatibleMessage as exc:
            return self._read_failed(message, exc.problem, str(exc), attempt, read_failures)
        except Exception as exc:  # noqa: BLE001 - e.g. OverflowError: still a bounded failure
            return self._read_failed(
                message, MessageProblem.UNPROCESSABLE, _one_line(exc), attempt, read_failures
            )
        # Delivering: failures are outages, retried without limit.
        return self._deliver(message, mapped, attempt, where)

    def _read_failed(
        self,
        message: Message,
        problem: MessageProblem,
        error: str,
        attempt: int,
        read_failures: int,
    ) -> _Retry | None:
        """Retry a message that could not be read, or dead-letter it after ``max_attempts``."""
        failures = read_failures + 1
        if failures < self.options.max_attempts:
            retry_in = self.options.backoff(attempt)
            self.metrics.retries.labels("read").inc()
            event(
                log,
                logging.WARNING,
                "message cannot be read; will retry",
                **_where(message),
                reason=problem.value,
                error=error,
                attempt=attempt,
                retry_in_seconds=retry_in,
            )
            return _Retry(retry_in, read_failed=True)
        return self._dead_letter(message, problem.value, error, failures)

    def _deliver(
        self, message: Message, mapped: MappedReminder, attempt: int, where: dict[str, Any]
    ) -> _Retry | None:
        """Deliver each recipient's notification once; None when the reminder is done."""
        reminder = mapped.reminder
        ids = {
            **where,
            "reminder_id": str(reminder.reminder_id),
            "event_id": str(reminder.event_id),
            "tenant_id": str(reminder.tenant_id),
        }
        past = self._seconds_past_start(reminder.start_at)
        if past is not None:
            self.stats.passed_dropped += 1
            self.metrics.passed_dropped.inc()
            self.metrics.messages.labels("start_passed").inc()
            event(
                log,
                logging.WARNING,
                "reminder dropped: its StartAt has passed",
                **ids,
                start_at=reminder.start_at.isoformat(),
                seconds_past_start=past,
            )
            return None
        if self.dedup.is_handled(reminder.reminder_id):
            self.stats.duplicates += 1
            self.metrics.duplicates.inc()
            self.metrics.messages.labels("duplicate").inc()
            event(log, logging.INFO, "duplicate reminder ignored", **ids)
            return None
        for notification in mapped.notifications:
            recipient = notification.recipient_user_id
            if self.dedup.is_delivered(reminder.reminder_id, recipient):
                continue  # delivered by an earlier attempt that failed on another recipient
            try:
                self.sink.deliver(notification)
            except DeliveryRejected as exc:
                return self._dead_letter(
                    message, DLQ_REASON_DELIVERY_REJECTED, _one_line(exc), attempt
                )
            except Exception as exc:  # noqa: BLE001 - any sink failure is presumed transient
                retry_in = self.options.backoff(attempt)
                self.metrics.retries.labels("deliver").inc()
                event(
                    log,
                    logging.WARNING,
                    "delivery failed; will retry",
                    **ids,
                    recipient_user_id=str(recipient),
                    attempt=attempt,
                    retry_in_seconds=retry_in,
                    exception=type(exc).__name__,
                )
                return _Retry(retry_in, read_failed=False)
            self.dedup.mark_delivered(reminder.reminder_id, recipient, notification.notification_id)
            self.stats.notifications += 1
            self.metrics.notifications.labels(
                notification.kind.value, notification.recipient_role.value
            ).inc()
        self.dedup.mark_handled(reminder.reminder_id, reminder.event_id)
        self._notified(message, mapped, attempt, ids)
        return None

    def _seconds_past_start(self, start_at: datetime) -> float | None:
        """How long ago StartAt passed, when beyond the grace that still notifies; else None."""
        grace = self.options.drop_after_start_seconds
        if grace is None:
            return None
        past = (datetime.now(UTC) - start_at).total_seconds()
        return round(past, 3) if past > grace else None

    def _notified(
        self, message: Message, mapped: MappedReminder, attempt: int, ids: dict[str, Any]
    ) -> None:
        """Count, time and log a reminder whose every recipient has been notified."""
        reminder = mapped.reminder
        now = datetime.now(UTC)
        self.stats.reminders_notified += 1
        self.metrics.messages.labels("notified").inc()
        self.metrics.last_notified.set(now.timestamp())
        since_due = _seconds_since(due_at(reminder), now)
        since_message = _seconds_since(_message_time(message), now)
        # Early counts as on time (0): a reminder notified before its DueAt is not late, and a
        # negative observation would make the histogram's _sum step back.
        if since_due is not None:
            self.metrics.due_to_notified.observe(max(since_due, 0.0))
        if since_message is not None:
            self.metrics.message_to_notified.observe(max(since_message, 0.0))
        # Warned once per reminder, when it is notified (not on each failed delivery attempt).
        if mapped.time_zone_fallback:
            self.stats.time_zone_fallbacks += 1
            self.metrics.time_zone_fallbacks.inc()
        if not mapped.known_kind:
            self.metrics.unknown_kinds.inc()
        for warning in mapped.warnings:
            self.stats.warnings += 1
            event(
                log,
                logging.WARNING,
                warning,
                **ids,
                kind=reminder.kind[:64],
                time_zone=reminder.time_zone[:64],
            )
        event(
            log,
            logging.INFO,
            "reminder notified",
            **ids,
            notification_kind=str(mapped.notifications[0].kind),
            recipients=len(mapped.notifications),
            offset_minutes=reminder.offset_minutes,
            attempts=attempt,
            due_to_notified_seconds=since_due,
            message_to_notified_seconds=since_message,
        )

    def _check_version(self, message: Message, where: dict[str, Any]) -> None:
        """Warn on a ContractVersion other than ours; the message is still processed (contract)."""
        version = _headers(message).get(contract.HEADER_CONTRACT_VERSION)
        if version is None or version.strip() != str(contract.CONTRACT_VERSION):
            self.stats.warnings += 1
            self.metrics.version_mismatches.inc()
            event(
                log,
                logging.WARNING,
                "contract version mismatch; processing anyway",
                **where,
                contract_version=None if version is None else version[:16],
                expected=str(contract.CONTRACT_VERSION),
            )

    def _dead_letter(
        self, message: Message, reason: str, error: str, attempts: int
    ) -> _Retry | None:
        """Copy ``message`` to the dead-letter topic; None once it is there or refused for good."""
        options = self.options
        where = _where(message)
        topic, partition, offset = _position(message)
        # The original headers first (ids, contract version), then why and whence.
        origin = [
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
            message.key(), message.value(), _raw_headers(message), origin, options.dlq_max_bytes
        )
        failure = self._produce_dead_letter(copy)
        if failure is not None and failure.code() in _REFUSALS and copy.truncated != _ALL_CUT:
            # The broker (or a topic's max.message.bytes) allows less than we assumed: the
            # origin headers alone still let an operator find the original.
            copy = dead_letter_copy(
                message.key(), message.value(), _raw_headers(message), copy.origin, 0
            )
            failure = self._produce_dead_letter(copy)
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
            return _Retry(retry_in, read_failed=False)
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

    def _produce_dead_letter(self, copy: DeadLetterCopy) -> KafkaError | None:
        """Produce ``copy`` and wait for the broker: None when acknowledged, else the error."""
        outcome: list[KafkaError | None] = []
        producer = self._dlq_producer()
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

    def _dlq_producer(self) -> Producer:
        if self._dlq is None:
            self._dlq = Producer(
                {
                    **self.kafka.client_config(),
                    "enable.idempotence": True,
                    "acks": "all",
                    "message.timeout.ms": int(self.options.dlq_timeout_seconds * 1000),
                    "message.max.bytes": self.options.dlq_max_bytes,
                    **self.options.dlq_producer_config,
                }
            )
        return self._dlq

    def _commit(self, message: Message) -> None:
        """Commit past ``message``; a failure means a redelivery, possibly to another member.

        De-duplication absorbs it only where that member sees the same store: always with
        ``--dedup-url`` (PostgreSQL), only on this host with the SQLite file.
        """
        assert self._consumer is not None
        try:
            self._consumer.commit(message=message, asynchronous=False)
        except KafkaException as exc:
            self.stats.commit_failures += 1
            event(
                log,
                logging.WARNING,
                "offset commit failed; the message may be redelivered",
                **_where(message),
                error=str(exc.args[0]) if exc.args else str(exc),
            )

    # -- group membership and errors ---------------------------------------------------------------

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        # librdkafka keeps an application's pause across revoke and re-assign: a partition
        # paused for a message held before a rebalance would never deliver again. Nothing is
        # held for a partition just assigned (its held message was forgotten on revoke and is
        # read again from the committed offset), so every one of them flows.
        if partitions:
            consumer.resume(partitions)
        self.owned = self.owned | {p.partition for p in partitions}
        self.assignments += 1
        self._assigned_at = time.monotonic()
        self.assigned.set()
        self.metrics.assigned_partitions.set(len(self.owned))
        event(
            log,
            logging.INFO,
            "partitions assigned",
            group_id=self.options.group_id,
            partitions=sorted(p.partition for p in partitions),
        )

    def _on_revoke(self, _consumer: Consumer, partitions: list[TopicPartition]) -> None:
        # A held message belongs to its partition's next owner now: it resumes from the
        # committed offset, which is still before the held message.
        for p in partitions:
            self._held.pop((p.topic, p.partition), None)
        self.owned = self.owned - {p.partition for p in partitions}
        self.metrics.held_partitions.set(len(self._held))
        self.metrics.assigned_partitions.set(len(self.owned))
        event(
            log,
            logging.INFO,
            "partitions revoked",
            group_id=self.options.group_id,
            partitions=sorted(p.partition for p in partitions),
        )

    def _on_error(self, error: KafkaError) -> None:
        if error.fatal():
            raise KafkaException(error)
        event(
            log,
            logging.WARNING,
            "consumer error",
            group_id=self.options.group_id,
            code=error.name(),
            error=error.str(),
        )

    def _close(self) -> None:
        if self._dlq is not None:
            left = self._dlq.flush(self.options.dlq_timeout_seconds)
            if left:
                event(
                    log,
                    logging.WARNING,
                    "dead-letter producer closed with messages unsent",
                    count=left,
                )
            self._dlq = None
        if self._consumer is not None:
            # Leaves the group; nothing is committed here, so held messages are redelivered.
            self._consumer.close()
            self._consumer = None
        self._held.clear()
        self.owned = frozenset()
        self.metrics.held_partitions.set(0)
        self.metrics.assigned_partitions.set(0)


_ALL_CUT = ("value", "headers", "key")


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
    budget -= _header_bytes([(HEADER_DLQ_TRUNCATED, ",".join(_ALL_CUT))])
    cut: list[str] = []
    if len(key or b"") > budget // 4:
        key, cut = None, [*cut, "key"]
    if _header_bytes(headers) > budget // 4:
        headers, cut = [], [*cut, "headers"]
    room = max(budget - len(key or b"") - _header_bytes([*headers, *origin]), 0)
    if value is not None and size > room:
        value, cut = data[:room] or None, ["value", *cut]
    order = tuple(part for part in _ALL_CUT if part in cut)
    marked = [*headers, *origin, (HEADER_DLQ_TRUNCATED, ",".join(order).encode())]
    return DeadLetterCopy(key, value, marked, origin, size, digest, order)


@dataclass(frozen=True)
class _Retry:
    """Why and when a message is attempted again."""

    seconds: float
    #: The attempt failed at reading the message (these are bounded by ``max_attempts``).
    read_failed: bool


def _seconds_since(moment: datetime | None, now: datetime) -> float | None:
    return None if moment is None else round((now - moment).total_seconds(), 3)


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
    dedup_url: str | None = None,
    once: bool = False,
    bootstrap_servers: str | None = None,
    sink: NotificationSink | None = None,
    stop: threading.Event | None = None,
    options: ConsumerOptions | None = None,
    metrics_port: int | None = None,
    locale: str = Locale.EN.value,
) -> int:
    """``reminder-pipeline consume``: print reminders as they arrive; 0 on a clean stop.

    ``bootstrap_servers`` names the embedded broker when ``settings`` do not (the CLI knows it).
    ``once`` stops after the topic has been quiet for ``options.once_idle_seconds``. ``options``
    overrides everything but ``group_id`` and ``locale`` (tests: topic names, fast group joins).
    ``dedup_url`` keeps delivered ReminderIds in PostgreSQL, shared by consumers on any number of
    hosts, instead of the SQLite file ``dedup_path`` (one host; both is an error).
    ``metrics_port`` serves the consumer's Prometheus metrics on ``REMINDER_METRICS_HOST``
    (default 127.0.0.1) at that port. A bad value is a one-line error and exit code 2.
    """
    logs.configure()
    stop = stop or threading.Event()
    server: MetricsServer | None = None
    try:
        if dedup_url is not None and dedup_path is not None:
            raise ConfigError("give --dedup-url or --dedup-path, not both")
        if metrics_port is not None and not 1 <= metrics_port <= 65535:
            raise ConfigError(f"--metrics-port {metrics_port} is not a port (1..65535)")
        try:
            options = dataclasses.replace(
                options or ConsumerOptions(), group_id=group_id, locale=locale
            )
        except ValueError as exc:
            raise ConfigError(f"--locale: {exc}") from None
        kafka = settings.kafka(bootstrap_servers)
        metrics = ConsumerMetrics()
        if metrics_port is not None:
            host = settings.env.get("REMINDER_METRICS_HOST") or DEFAULT_HOST
            server = serve_metrics(metrics, host, metrics_port)
        # The DLQ is ours to create with the contract's partition count (auto-creation would
        # pick the broker's default); the source topic too, so starting before the
        # dispatcher's first publish subscribes to a topic with the right partitions. Where
        # ACLs allow this consumer no CREATE (docker/compose.yaml), both exist already and
        # DESCRIBE is enough.
        ensure_topic(kafka, topic=options.topic)
        ensure_topic(kafka, topic=options.dlq_topic)
        store: PostgresDedupStore | SqliteDedupStore = (
            PostgresDedupStore(dedup_url)
            if dedup_url is not None
            else SqliteDedupStore(dedup_path or default_dedup_path(settings, group_id))
        )
        with store as dedup, stop_on_signals(stop):
            consumer = ReminderConsumer(kafka, sink or StdoutSink(), dedup, options, metrics)
            consumer.run(stop=stop, idle_timeout=options.once_idle_seconds if once else None)
    except (ConfigError, BrokerUnavailable, DedupStoreError, sqlite3.Error, OSError) as exc:
        print(f"reminder-pipeline consume: {exc}", file=sys.stderr)
        return 2 if isinstance(exc, ConfigError | MetricsPortUnavailable) else 1
    except KafkaException as exc:
        print(f"reminder-pipeline consume: Kafka error: {exc}", file=sys.stderr)
        return 1
    finally:
        if server is not None:
            server.stop()
    return 0
