"""One attempt at a message: read it into notifications, deliver them once, or say why not.

Reading (parsing, the local time, the text) is deterministic: any error there, expected or not,
counts toward ``max_attempts``, then the message is dead-lettered. Delivering is not: sink and
de-duplication store failures are outages, retried with capped back-off without limit. A
reminder whose StartAt passed more than a grace ago is dropped, counted and logged.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from confluent_kafka import Message

from ..domain import contract
from ..logs import event
from . import kafka_messages
from .dead_letters import DeadLetters
from .dedup import DedupStore
from .metrics import ConsumerMetrics
from .notifications import (
    IncompatibleMessage,
    MappedReminder,
    MessageProblem,
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

    def handle(self, message: Message, attempt: int, read_failures: int) -> Retry | None:
        """One attempt at ``message``: None when handled, else when and why to try again."""
        where = kafka_messages.where(message)
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
                message,
                MessageProblem.UNPROCESSABLE,
                kafka_messages.one_line(exc),
                attempt,
                read_failures,
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
        self, message: Message, mapped: MappedReminder, attempt: int, where: dict[str, Any]
    ) -> Retry | None:
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
                    message, DLQ_REASON_DELIVERY_REJECTED, kafka_messages.one_line(exc), attempt
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
                return Retry(retry_in, read_failed=False)
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
        since_due = kafka_messages.seconds_since(due_at(reminder), now)
        since_message = kafka_messages.seconds_since(kafka_messages.message_time(message), now)
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
        version = kafka_messages.headers(message).get(contract.HEADER_CONTRACT_VERSION)
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
    ) -> Retry | None:
        """Dead-letter ``message``; None once it is there or refused for good, else the retry."""
        retry_in = self.dead_letters.send(message, reason, error, attempts)
        return None if retry_in is None else Retry(retry_in, read_failed=False)
