"""The reference notifications consumer: pin.calendar.reminder-due.v1 to notifications, per the contract."""

from .dedup import DedupStore, SqliteDedupStore
from .notifications import (
    IncompatibleMessage,
    MappedReminder,
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

__all__ = [
    "DLQ_TOPIC",
    "ConsumeStats",
    "ConsumerOptions",
    "DedupStore",
    "DeliveryRejected",
    "IncompatibleMessage",
    "MappedReminder",
    "Notification",
    "NotificationKind",
    "NotificationSink",
    "RecipientRole",
    "ReminderConsumer",
    "ReminderDue",
    "SqliteDedupStore",
    "StdoutSink",
    "consume_main",
    "notifications_for",
    "parse_reminder",
]
