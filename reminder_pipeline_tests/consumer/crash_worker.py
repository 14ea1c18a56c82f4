"""A consumer member that SIGKILLs itself at one point of a batch (``test_crash_points.py``).

``python -m reminder_pipeline_tests.consumer.crash_worker POINT BOOTSTRAP TOPIC GROUP STORE OUT``
runs one :class:`ReminderConsumer` member (STORE: a SQLite path, or a postgresql:// URL) whose
sink appends ``reminder_id recipient_id notification_id`` lines to OUT (``O_APPEND`` writes: a
line written is a notification delivered, even if the process dies right after), and kills
itself with SIGKILL at POINT:

* ``after_deliver``: the batch's notifications delivered, before they are recorded;
* ``after_record``: recorded in the store, before the offsets are committed;
* ``during_rebalance``: in the revoke callback of a rebalance, after it delivered something.

The sink sleeps a little per notification, so batches are small and a rebalance meets it busy.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from typing import Any

from confluent_kafka import Consumer, TopicPartition

from reminder_pipeline.config import KafkaSettings
from reminder_pipeline.consumer import ConsumerOptions, Notification, ReminderConsumer
from reminder_pipeline.consumer.dedup import PostgresDedupStore, Records, SqliteDedupStore

from .lane import FAST_GROUP

POINTS = ("after_deliver", "after_record", "during_rebalance")


def die(point: str) -> None:
    print(f"crashing at {point}", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


class FileSink:
    """Appends one line per delivered notification (the line is the delivery)."""

    def __init__(self, path: str, delay: float = 0.0) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self.delay = delay
        self.count = 0

    def deliver(self, notification: Notification) -> None:
        time.sleep(self.delay)
        line = f"{notification.reminder_id} {notification.recipient_user_id} "
        os.write(self.fd, f"{line}{notification.notification_id}\n".encode())
        self.count += 1


class KillingStore:
    """The real store, with a kill just before or just after the batch's one write."""

    def __init__(self, store: Any, point: str) -> None:
        self.store, self.point = store, point

    def ping(self) -> None:
        self.store.ping()

    def known(self, reminder_ids: Any) -> Any:
        return self.store.known(reminder_ids)

    def record(self, records: Records) -> None:
        if self.point == "after_deliver" and records.deliveries:
            die(self.point)
        self.store.record(records)
        if self.point == "after_record" and records.deliveries:
            die(self.point)


class KilledInRebalance(ReminderConsumer):
    """Dies in the revoke callback of a rebalance once it has delivered something."""

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        if partitions and isinstance(self.sink, FileSink) and self.sink.count:
            die("during_rebalance")
        super()._on_revoke(consumer, partitions)


def options(topic: str, group: str) -> ConsumerOptions:
    """The options every member of a crash test runs with (fast group joins)."""
    return ConsumerOptions(
        group_id=group,
        topic=topic,
        dlq_topic=f"{topic}.dlq",
        retry_backoff_seconds=0.05,
        max_backoff_seconds=0.4,
        poll_timeout_seconds=0.1,
        consumer_config=FAST_GROUP,
    )


def open_store(where: str) -> Any:
    return PostgresDedupStore(where) if "://" in where else SqliteDedupStore(where)


def main(argv: list[str]) -> int:
    point, bootstrap, topic, group, where, out = argv
    kafka = KafkaSettings.from_env(os.environ, bootstrap)
    store = open_store(where)
    rebalance = point == "during_rebalance"
    sink = FileSink(out, delay=0.05 if rebalance else 0.0)
    member = (KilledInRebalance if rebalance else ReminderConsumer)(
        kafka, sink, store if rebalance else KillingStore(store, point), options(topic, group)
    )
    member.run(idle_timeout=60.0)
    print("finished without crashing", flush=True)
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
