"""The reference notifications consumer: pin.calendar.reminder-due.v1 to notifications."""

from .dedup import DedupStore, PostgresDedupStore, SqliteDedupStore
from .metrics import ConsumerMetrics
from .notifications import (
    IncompatibleMessage,
    MappedReminder,
    MessageProblem,
    Notification,
    NotificationKind,
    RecipientRole,
    ReminderDue,
    notifications_for,
    parse_reminder,
)
from .runner import (
    DLQ_TOPIC,
    ConsumerOptions,
    ConsumeStats,
    DeliveryRejected,
    NotificationSink,
    ReminderConsumer,
    StdoutSink,
    consume_main,
)
from .texts import Locale

__all__ = [
    "DLQ_TOPIC",
    "ConsumeStats",
    "ConsumerMetrics",
    "ConsumerOptions",
    "DedupStore",
    "DeliveryRejected",
    "IncompatibleMessage",
    "Locale",
    "MappedReminder",
    "MessageProblem",
    "Notification",
    "NotificationKind",
    "NotificationSink",
    "PostgresDedupStore",
    "RecipientRole",
    "ReminderConsumer",
    "ReminderDue",
    "SqliteDedupStore",
    "StdoutSink",
    "consume_main",
    "notifications_for",
    "parse_reminder",
]
