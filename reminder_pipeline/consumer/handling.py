"""One attempt at a batch of one partition's messages: read, deliver once, record, or say why not.

A batch is handled in the partition's order: every message is read first (pure), the store is
asked once which (reminder, recipient) pairs are already delivered, the rest are delivered in
order, and everything delivered is recorded in one write; the runner then commits the offsets of
the messages handled. A message that needs another attempt ends the batch there: what came
before it is recorded and committed, it holds its partition, and what came after it is read
again once it is handled (key order). Deliveries whose record could not be written (the store
went away) are kept and recorded first on the next call, so a retry does not notify them again.
The batch's counters go to the metrics once, as it ends, and its "reminder notified" lines (one
per reminder, built only when INFO is logged) are one log record.

Reading (parsing, the local time, the text) is deterministic: any error there, expected or not,
counts toward ``max_attempts``, then the message is dead-lettered. Delivering is not: sink and
de-duplication store failures are outages, retried with capped back-off without limit. A
reminder whose StartAt passed more than a grace ago is dropped, counted and logged.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from confluent_kafka import Message

from ..domain import contract
from ..logs import event, events
from . import kafka_messages
from .dead_letters import DeadLetters
from .dedup import DedupStore, Known, Records
from .metrics import ConsumerMetrics
from .notifications import (
    IncompatibleMessage,
    MappedReminder,
    MessageProblem,
    Notification,
    ReminderDue,
    due_at,
    notifications_for,
    parse_reminder,
)
from .options import ConsumerOptions, ConsumeStats
from .sinks import DeliveryRejected, NotificationSink
from .texts import Locale

log = logging.getLogger(__name__)

DLQ_REASON_DELIVERY_REJECTED = MessageProblem.DELIVERY_REJECTED.value


@dataclass(frozen=True)
class Retry:
    """Why and when a message is attempted again."""

    seconds: float
    #: The attempt failed at reading the message (these are bounded by ``max_attempts``).
    read_failed: bool


@dataclass(frozen=True)
class PartitionProgress:
    """How many leading messages of a batch are handled (to commit) and the next one's retry."""

    done: int
    #: When set, ``messages[done]`` holds its partition until this retry.
    retry: Retry | None = None


@dataclass
class _Batch:
    """What a batch knows as it goes: the store's answer plus its own deliveries, to record, and
    what it counts and logs per reminder, added to the metrics and written once per batch."""

    handled: set[Any]
    delivered: set[tuple[Any, Any]]
    records: Records = field(default_factory=Records)
    #: Notifications sent by (kind, recipient role), reminders notified, and the fallbacks.
    sent: Counter[tuple[str, str]] = field(default_factory=Counter)
    notified: int = 0
    last_notified: float | None = None
    time_zone_fallbacks: int = 0
    unknown_kinds: int = 0
    #: The "reminder notified" lines (only when INFO is logged).
    notified_lines: list[dict[str, Any]] = field(default_factory=list)


class MessageHandling:
    """Handles messages for one run of the consumer, counting into its stats and metrics."""

    def __init__(
        self,
        sink: NotificationSink,
        dedup: DedupStore,
        options: ConsumerOptions,
        locale: Locale,
        stats: ConsumeStats,
        metrics: ConsumerMetrics,
        dead_letters: DeadLetters,
    ) -> None:
        self.sink = sink
        self.dedup = dedup
        self.options = options
        self.locale = locale
        self.stats = stats
        self.metrics = metrics
        self.dead_letters = dead_letters
        #: Deliveries (and handled reminders) the store has not recorded yet.
        self._pending = Records()

    def handle_batch(
        self, messages: list[Message], attempt: int = 1, read_failures: int = 0
    ) -> PartitionProgress:
        """One attempt at ``messages`` (one partition, in order; ``attempt`` is the first one's)."""
        self._record_pending()
        read: list[tuple[Message, MappedReminder | None, tuple[MessageProblem, str] | None]] = []
        # Reading: deterministic, so whatever fails here fails again; bounded, then the DLQ. The
        # batch stops at the first message that cannot be read (it is attempted in its turn).
        for message in messages:
            try:
                mapped = notifications_for(parse_reminder(message.value()), self.locale)
            except IncompatibleMessage as exc:
                read.append((message, None, (exc.problem, str(exc))))
                break
            except Exception as exc:  # noqa: BLE001 - e.g. OverflowError: still a bounded failure
                problem = (MessageProblem.UNPROCESSABLE, kafka_messages.one_line(exc))
                read.append((message, None, problem))
                break
            read.append((message, mapped, None))
        ids = [m.reminder.reminder_id for _, m, _ in read if m is not None]
        known = self.dedup.known(ids) if ids else Known()
        batch = _Batch(set(known.handled), set(known.delivered))
        outcome = PartitionProgress(len(read))
        try:
            for index, (message, reminder, failure) in enumerate(read):
                first = index == 0
                found = kafka_messages.header_texts(message)
                if attempt == 1 or not first:
                    self._check_version(message, found)
                tries, failures = (attempt, read_failures) if first else (1, 0)
                if failure is not None:
                    retry = self._read_failed(message, *failure, tries, failures)
                else:
                    assert reminder is not None
                    retry = self._deliver(message, reminder, tries, found, batch)
                if retry is not None:
                    outcome = PartitionProgress(index, retry)
                    break
        finally:
            self._count(batch)
            # Delivered is delivered: recorded whatever stopped the batch (a crash before this
            # write is the one window where a restart notifies again; the notification id is the
            # channel's idempotency key for it).
            self._pending.deliveries.extend(batch.records.deliveries)
            self._pending.handled.extend(batch.records.handled)
            self._record_pending()
        return outcome

    def _count(self, batch: _Batch) -> None:
        """Add what the batch notified to the metrics and log its reminders (a line each)."""
        metrics = self.metrics
        for (kind, role), sent in batch.sent.items():
            metrics.notifications.labels(kind, role).inc(sent)
        if batch.notified:
            metrics.messages.labels("notified").inc(batch.notified)
        if batch.last_notified is not None:
            metrics.last_notified.set(batch.last_notified)
        if batch.time_zone_fallbacks:
            metrics.time_zone_fallbacks.inc(batch.time_zone_fallbacks)
        if batch.unknown_kinds:
            metrics.unknown_kinds.inc(batch.unknown_kinds)
        events(log, logging.INFO, "reminder notified", batch.notified_lines)

    def _record_pending(self) -> None:
        """Write what was delivered and not yet recorded (raises if the store is away)."""
        if self._pending:
            self.dedup.record(self._pending)
            self._pending = Records()

    def _read_failed(
        self,
        message: Message,
        problem: MessageProblem,
        error: str,
        attempt: int,
        read_failures: int,
    ) -> Retry | None:
        """Retry a message that could not be read, or dead-letter it after ``max_attempts``."""
        failures = read_failures + 1
        if failures < self.options.max_attempts:
            retry_in = self.options.backoff(attempt)
            self.metrics.retries.labels("read").inc()
            event(
                log,
                logging.WARNING,
                "message cannot be read; will retry",
                **kafka_messages.where(message),
                reason=problem.value,
                error=error,
                attempt=attempt,
                retry_in_seconds=retry_in,
            )
            return Retry(retry_in, read_failed=True)
        return self._dead_letter(message, problem.value, error, failures)

    def _deliver(
        self,
        message: Message,
        mapped: MappedReminder,
        attempt: int,
        found: dict[str, str],
        batch: _Batch,
    ) -> Retry | None:
        """Deliver each recipient's notification once; None when the reminder is done."""
        reminder = mapped.reminder
        past = self._seconds_past_start(reminder.start_at)
        if past is not None:
            self.stats.passed_dropped += 1
            self.metrics.passed_dropped.inc()
            self.metrics.messages.labels("start_passed").inc()
            event(
                log,
                logging.WARNING,
                "reminder dropped: its StartAt has passed",
                **_ids(message, found, reminder),
                start_at=reminder.start_at.isoformat(),
                seconds_past_start=past,
            )
            return None
        if reminder.reminder_id in batch.handled:
            self.stats.duplicates += 1
            self.metrics.duplicates.inc()
            self.metrics.messages.labels("duplicate").inc()
            event(log, logging.INFO, "duplicate reminder ignored", **_ids(message, found, reminder))
            return None
        delivered = batch.delivered
        for notification in mapped.notifications:
            recipient = notification.recipient_user_id
            if delivered and (reminder.reminder_id, recipient) in delivered:
                continue  # delivered by an earlier attempt that failed on another recipient
            try:
                self.sink.deliver(notification)
            except DeliveryRejected as exc:
                self._delivered_so_far(mapped, notification, batch)
                return self._dead_letter(
                    message, DLQ_REASON_DELIVERY_REJECTED, kafka_messages.one_line(exc), attempt
                )
            except Exception as exc:  # noqa: BLE001 - any sink failure is presumed transient
                self._delivered_so_far(mapped, notification, batch)
                retry_in = self.options.backoff(attempt)
                self.metrics.retries.labels("deliver").inc()
                event(
                    log,
                    logging.WARNING,
                    "delivery failed; will retry",
                    **_ids(message, found, reminder),
                    recipient_user_id=str(recipient),
                    attempt=attempt,
                    retry_in_seconds=retry_in,
                    exception=type(exc).__name__,
                )
                return Retry(retry_in, read_failed=False)
            batch.records.deliveries.append(
                (reminder.reminder_id, recipient, notification.notification_id)
            )
            self.stats.notifications += 1
            batch.sent[notification.kind.value, notification.recipient_role.value] += 1
        batch.handled.add(reminder.reminder_id)
        batch.records.handled.append((reminder.reminder_id, reminder.event_id))
        self._notified(message, mapped, attempt, found, batch)
        return None

    @staticmethod
    def _delivered_so_far(mapped: MappedReminder, failed: Notification, batch: _Batch) -> None:
        """The recipients of a reminder that stops at ``failed`` delivered before it, known to
        the batch (a later copy of the reminder in it skips them; a reminder that completes is
        in ``batch.handled`` instead, which a later copy meets first)."""
        reminder_id = mapped.reminder.reminder_id
        for notification in mapped.notifications:
            if notification is failed:
                return
            batch.delivered.add((reminder_id, notification.recipient_user_id))

    def _seconds_past_start(self, start_at: datetime) -> float | None:
        """How long ago StartAt passed, when beyond the grace that still notifies; else None."""
        grace = self.options.drop_after_start_seconds
        if grace is None:
            return None
        past = (datetime.now(UTC) - start_at).total_seconds()
        return round(past, 3) if past > grace else None

    def _notified(
        self,
        message: Message,
        mapped: MappedReminder,
        attempt: int,
        found: dict[str, str],
        batch: _Batch,
    ) -> None:
        """Count, time and log a reminder whose every recipient has been notified (the counters
        and the INFO line go out with the batch, :meth:`_count`)."""
        reminder = mapped.reminder
        now = datetime.now(UTC)
        self.stats.reminders_notified += 1
        batch.notified += 1
        batch.last_notified = now.timestamp()
        since_due = kafka_messages.seconds_since(due_at(reminder), now)
        sent_at = kafka_messages.message_seconds(message)
        since_message = None if sent_at is None else round(batch.last_notified - sent_at, 3)
        # Early counts as on time (0): a reminder notified before its DueAt is not late, and a
        # negative observation would make the histogram's _sum step back.
        if since_due is not None:
            self.metrics.due_to_notified.observe(max(since_due, 0.0))
        if since_message is not None:
            self.metrics.message_to_notified.observe(max(since_message, 0.0))
        # Warned once per reminder, when it is notified (not on each failed delivery attempt).
        if mapped.time_zone_fallback:
            self.stats.time_zone_fallbacks += 1
            batch.time_zone_fallbacks += 1
        if not mapped.known_kind:
            batch.unknown_kinds += 1
        for warning in mapped.warnings:
            self.stats.warnings += 1
            event(
                log,
                logging.WARNING,
                warning,
                **_ids(message, found, reminder),
                kind=reminder.kind[:64],
                time_zone=reminder.time_zone[:64],
            )
        if log.isEnabledFor(logging.INFO):
            batch.notified_lines.append(
                {
                    **_ids(message, found, reminder),
                    "notification_kind": str(mapped.notifications[0].kind),
                    "recipients": len(mapped.notifications),
                    "offset_minutes": reminder.offset_minutes,
                    "attempts": attempt,
                    "due_to_notified_seconds": since_due,
                    "message_to_notified_seconds": since_message,
                }
            )

    def _check_version(self, message: Message, found: dict[str, str]) -> None:
        """Warn on a ContractVersion other than ours (``found``: the message's headers); the
        message is still processed (contract)."""
        version = found.get(contract.HEADER_CONTRACT_VERSION)
        if version is None or version.strip() != str(contract.CONTRACT_VERSION):
            self.stats.warnings += 1
            self.metrics.version_mismatches.inc()
            event(
                log,
                logging.WARNING,
                "contract version mismatch; processing anyway",
                **kafka_messages.where(message, found),
                contract_version=None if version is None else version[:16],
                expected=str(contract.CONTRACT_VERSION),
            )

    def _dead_letter(
        self, message: Message, reason: str, error: str, attempts: int
    ) -> Retry | None:
        """Dead-letter ``message``; None once it is there or refused for good, else the retry."""
        retry_in = self.dead_letters.send(message, reason, error, attempts)
        return None if retry_in is None else Retry(retry_in, read_failed=False)


def _ids(message: Message, found: dict[str, str], reminder: ReminderDue) -> dict[str, Any]:
    """A message's identifiers for a log line: its position and headers' ids, and the reminder's."""
    return {
        **kafka_messages.where(message, found),
        "reminder_id": str(reminder.reminder_id),
        "event_id": str(reminder.event_id),
        "tenant_id": str(reminder.tenant_id),
    }
