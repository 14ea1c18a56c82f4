"""The consumer's own Prometheus metrics, served by ``reminder-pipeline consume --metrics-port``.

Unlike the dispatcher's exporter (which reads a ledger in PostgreSQL, because dispatch runs are
short-lived processes), the consumer is one long-running process per group member: its counters
live in its memory and Prometheus adds the members up (``sum by``). A restart resets them to 0,
which ``rate``/``increase`` handle. Every label value is created at 0 on start, so the first
dead letter is an increase Prometheus can see (a series born at 1 is not).

Latency is measured where the contract puts its promises: from the message's Kafka timestamp to
the moment the last recipient is notified (the consumer's SLA, < 1 minute), and from DueAt
(StartAt - OffsetMinutes) to that moment (end to end, the design's SLO of 2 minutes).
"""

from __future__ import annotations

import logging

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from ..logs import event
from ..observability.metrics_http import MetricsPortUnavailable, MetricsServer, serve_registry
from .notifications import MessageProblem, NotificationKind, RecipientRole

log = logging.getLogger(__name__)

PREFIX = "notifications_reminder_consumer_"
MESSAGES = PREFIX + "messages_total"
NOTIFICATIONS = PREFIX + "notifications_sent_total"
DUPLICATES = PREFIX + "duplicates_dropped_total"
PASSED_DROPPED = PREFIX + "passed_reminders_dropped_total"
DEAD_LETTERS = PREFIX + "dead_letters_total"
DEAD_LETTERS_REFUSED = PREFIX + "dead_letters_refused_total"
RETRIES = PREFIX + "retries_total"
TIME_ZONE_FALLBACKS = PREFIX + "time_zone_fallbacks_total"
UNKNOWN_KINDS = PREFIX + "unknown_kinds_total"
VERSION_MISMATCHES = PREFIX + "contract_version_mismatches_total"
DUE_TO_NOTIFIED = PREFIX + "due_to_notified_seconds"
MESSAGE_TO_NOTIFIED = PREFIX + "message_to_notified_seconds"
HELD_PARTITIONS = PREFIX + "held_partitions"
ASSIGNED_PARTITIONS = PREFIX + "assigned_partitions"
LAST_NOTIFIED = PREFIX + "last_notified_timestamp_seconds"
DEPENDENCY_UP = PREFIX + "dependency_up"
OUTAGES = PREFIX + "outages_total"

#: Every metric family the consumer serves (the dashboard and the rules use only these).
METRIC_NAMES: tuple[str, ...] = (
    MESSAGES,
    NOTIFICATIONS,
    DUPLICATES,
    PASSED_DROPPED,
    DEAD_LETTERS,
    DEAD_LETTERS_REFUSED,
    RETRIES,
    TIME_ZONE_FALLBACKS,
    UNKNOWN_KINDS,
    VERSION_MISMATCHES,
    DUE_TO_NOTIFIED,
    MESSAGE_TO_NOTIFIED,
    HELD_PARTITIONS,
    ASSIGNED_PARTITIONS,
    LAST_NOTIFIED,
    DEPENDENCY_UP,
    OUTAGES,
)

OUTCOMES = ("notified", "duplicate", "start_passed", "dead_lettered", "dead_letter_refused")
#: Where a failed attempt failed: reading the message, delivering it, or writing the dead letter.
RETRY_STAGES = ("read", "deliver", "dead_letter")
#: The servers whose outages the consumer rides out (``outages.py``).
DEPENDENCIES = ("broker", "dedup_store")
#: Around the two promises (60 s, 120 s), fine enough below them to see the usual few seconds.
LATENCY_BUCKETS = (0.25, 0.5, 1, 2.5, 5, 10, 15, 30, 45, 60, 90, 120, 180, 300, 600, 1800, 3600)


class ConsumerMetrics:
    """The consumer's counters, histograms and gauges in a registry of their own."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry(auto_describe=True)
        r = self.registry
        self.messages = Counter(
            MESSAGES, "Messages handled and committed, by outcome.", ["outcome"], registry=r
        )
        self.notifications = Counter(
            NOTIFICATIONS, "Notifications the sink accepted.", ["kind", "recipient"], registry=r
        )
        self.duplicates = Counter(
            DUPLICATES, "Messages of an already notified ReminderId, dropped.", registry=r
        )
        self.passed_dropped = Counter(
            PASSED_DROPPED,
            "Reminders dropped, not notified, because their StartAt had passed.",
            registry=r,
        )
        self.dead_letters = Counter(
            DEAD_LETTERS,
            "Messages copied to the dead-letter topic, by dlq-reason.",
            ["reason"],
            registry=r,
        )
        self.dead_letters_refused = Counter(
            DEAD_LETTERS_REFUSED,
            "Messages whose dead-letter copy the broker refused for good (skipped, logged).",
            ["reason"],
            registry=r,
        )
        self.retries = Counter(
            RETRIES, "Failed attempts that will be retried, by stage.", ["stage"], registry=r
        )
        self.time_zone_fallbacks = Counter(
            TIME_ZONE_FALLBACKS,
            "Reminders whose TimeZone is not a canonical IANA name (local time shown in UTC).",
            registry=r,
        )
        self.unknown_kinds = Counter(
            UNKNOWN_KINDS,
            "Reminders of a Kind this consumer does not know (neutral text).",
            registry=r,
        )
        self.version_mismatches = Counter(
            VERSION_MISMATCHES,
            "Messages whose contract-version header is not 1 (processed).",
            registry=r,
        )
        self.due_to_notified = Histogram(
            DUE_TO_NOTIFIED,
            "Seconds from DueAt (StartAt - OffsetMinutes) to notified.",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.message_to_notified = Histogram(
            MESSAGE_TO_NOTIFIED,
            "Seconds from the message's Kafka timestamp to notified.",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.held_partitions = Gauge(
            HELD_PARTITIONS, "Partitions stopped on a message that waits for a retry.", registry=r
        )
        self.assigned_partitions = Gauge(
            ASSIGNED_PARTITIONS, "Partitions assigned to this group member.", registry=r
        )
        self.last_notified = Gauge(
            LAST_NOTIFIED, "Unix time of the last reminder notified.", registry=r
        )
        self.dependency_up = Gauge(
            DEPENDENCY_UP,
            "1 while the dependency answers, 0 during an outage (work held until it answers).",
            ["dependency"],
            registry=r,
        )
        self.outages = Counter(
            OUTAGES,
            "Outages of a dependency: each counted once, when it starts.",
            ["dependency"],
            registry=r,
        )
        for dependency in DEPENDENCIES:
            self.dependency_up.labels(dependency).set(1)
            self.outages.labels(dependency)
        for outcome in OUTCOMES:
            self.messages.labels(outcome)
        for kind in NotificationKind:
            for role in RecipientRole:
                self.notifications.labels(kind.value, role.value)
        for reason in MessageProblem:
            self.dead_letters.labels(reason.value)
            self.dead_letters_refused.labels(reason.value)
        for stage in RETRY_STAGES:
            self.retries.labels(stage)


def serve_metrics(metrics: ConsumerMetrics, host: str, port: int) -> MetricsServer:
    """Serve ``metrics`` on ``http://host:port/metrics`` in a background thread."""
    try:
        server = serve_registry(metrics.registry, host, port)
    except OSError as exc:
        raise MetricsPortUnavailable(
            f"--metrics-port {port}: cannot listen on {host}:{port} ({exc.strerror or exc})"
        ) from None
    event(log, logging.INFO, "consumer metrics listening", host=host, port=port)
    return server
