"""The reference notifications consumer: pin.calendar.reminder-due.v1 to notifications.

Its rooms: the message read into notifications (notifications.py, texts.py, spellings.py), one
attempt at a partition's batch (handling.py), the consumer loop and its group (runner.py), the
outages of the broker and the de-dup store (outages.py), the dead-letter
record and its producer (dead_letter_copy.py, dead_letters.py), the sinks (sinks.py), options and
stats (options.py), a Kafka message's parts (kafka_messages.py), de-duplication (dedup.py),
metrics (metrics.py), and the main the CLI runs (main.py: raises, never exits).
"""

from ..messaging.dead_letters import DLQ_TOPIC
from .dedup import DedupStore, PostgresDedupStore, SqliteDedupStore
from .main import run_consumer
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
from .options import ConsumerOptions, ConsumeStats
from .runner import ReminderConsumer
from .sinks import DeliveryRejected, NotificationSink, StdoutSink
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
    "notifications_for",
    "parse_reminder",
    "run_consumer",
]
