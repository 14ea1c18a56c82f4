"""A private lane through the real broker for consumer tests: topics, a group, a recording sink."""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

from reminder_pipeline.config import KafkaSettings
from reminder_pipeline.consumer import (
    ConsumerOptions,
    Notification,
    ReminderConsumer,
    SqliteDedupStore,
)
from reminder_pipeline.domain import contract
from reminder_pipeline.logs import fields_of
from reminder_pipeline.messaging.kafka import ensure_topic

from .payloads import payload

#: The embedded broker answers a JoinGroup after about half the session timeout: keep it short
#: here so each test's join costs ~1 s (production keeps the runner's defaults).
FAST_GROUP = {"session.timeout.ms": 2000, "heartbeat.interval.ms": 250, "fetch.wait.max.ms": 100}
#: Upper bound for a bounded run: a broken consumer fails the test instead of hanging it.
IDLE_TIMEOUT = 20.0


class RecordingSink:
    """Records notifications of the wanted reminders; fails on demand; stops the run when complete."""

    def __init__(
        self,
        wanted: Iterable[uuid.UUID | str] | None = None,
        *,
        expect: int | None = None,
        fail: dict[str, int] | None = None,
    ) -> None:
        self.wanted = None if wanted is None else {str(w) for w in wanted}
        self.expect = expect
        self.fail = dict(fail or {})  # reminder id -> how many more attempts fail
        self.delivered: list[Notification] = []
        self.attempts: Counter[str] = Counter()
        self.attempt_times: dict[str, list[float]] = {}
        self.stop = threading.Event()

    def deliver(self, notification: Notification) -> None:
        rid = str(notification.reminder_id)
        if self.wanted is not None and rid not in self.wanted:
            return
        self.attempts[rid] += 1
        self.attempt_times.setdefault(rid, []).append(time.monotonic())
        if self.fail.get(rid, 0) > 0:
            self.fail[rid] -= 1
            raise ConnectionError("push gateway unavailable")
        self.delivered.append(notification)
        if self.expect is not None and len(self.delivered) >= self.expect:
            self.stop.set()

    def reminder_ids(self) -> list[str]:
        return [str(n.reminder_id) for n in self.delivered]


@dataclass
class Lane:
    """A private topic, dead-letter topic and consumer group for one test."""

    kafka: KafkaSettings
    topic: str
    dlq_topic: str
    group_id: str
    dedup_path: Path
    producer: Producer = field(init=False)

    def __post_init__(self) -> None:
        self.producer = Producer({**self.kafka.client_config(), "enable.idempotence": True})

    def options(self, **overrides: Any) -> ConsumerOptions:
        values: dict[str, Any] = {
            "group_id": self.group_id,
            "topic": self.topic,
            "dlq_topic": self.dlq_topic,
            "retry_backoff_seconds": 0.05,
            "max_backoff_seconds": 0.4,
            "poll_timeout_seconds": 0.1,
            "consumer_config": FAST_GROUP,
        }
        values.update(overrides)
        return ConsumerOptions(**values)

    def produce(
        self,
        value: dict[str, Any] | bytes,
        *,
        key: str | None = None,
        headers: dict[str, str] | None = None,
        partition: int | None = None,
    ) -> None:
        """Produce one message the way the dispatcher does: key = EventId, contract headers."""
        data = value if isinstance(value, bytes) else json.dumps(value).encode()
        if key is None and isinstance(value, dict):
            key = str(value.get("EventId") or uuid.uuid4())
        if headers is None:
            reminder_id = value.get("ReminderId", "") if isinstance(value, dict) else ""
            headers = contract.headers(str(reminder_id), None)
        extra = {} if partition is None else {"partition": partition}
        self.producer.produce(
            self.topic, key=(key or "").encode(), value=data, headers=list(headers.items()), **extra
        )
        assert self.producer.flush(10) == 0

    def run(
        self, sink: RecordingSink, *, max_messages: int | None = None, **options: Any
    ) -> ReminderConsumer:
        """Run a consumer in the foreground until ``max_messages``, the sink's stop, or idle."""
        opts = self.options(**options)
        with SqliteDedupStore(self.dedup_path) as dedup:
            consumer = ReminderConsumer(self.kafka, sink, dedup, opts)
            consumer.run(stop=sink.stop, max_messages=max_messages, idle_timeout=IDLE_TIMEOUT)
        return consumer


def new_lane(kafka: KafkaSettings, tmp_path: Path) -> Lane:
    """A lane on topics of its own, created with the contract's partition count."""
    name = f"test.reminder-due.{uuid.uuid4().hex[:10]}"
    ensure_topic(kafka, topic=name)
    ensure_topic(kafka, topic=f"{name}.dlq")
    return Lane(
        kafka,
        name,
        f"{name}.dlq",
        f"test-notifications-{uuid.uuid4().hex[:8]}",
        tmp_path / "dedup.sqlite3",
    )


def a_payload(**overrides: Any) -> dict[str, Any]:
    """A valid contract v1 payload for an event starting in two hours (``...`` removes a field)."""
    start = (datetime.now(UTC) + timedelta(hours=2)).replace(microsecond=0)
    return payload(**{"StartAt": start.strftime("%Y-%m-%dT%H:%M:%SZ"), **overrides})


def read_topic(kafka: KafkaSettings, topic: str, count: int, timeout: float = 15.0) -> list[Any]:
    """Read ``count`` messages from ``topic`` without joining a group (assign from the start)."""
    consumer = Consumer(
        {
            **kafka.client_config(),
            "group.id": f"reader-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
        }
    )
    consumer.assign(
        [TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(contract.PARTITIONS)]
    )
    messages: list[Any] = []
    deadline = time.monotonic() + timeout
    try:
        while len(messages) < count and time.monotonic() < deadline:
            messages.extend(m for m in consumer.consume(100, timeout=0.5) if not m.error())
    finally:
        consumer.close()
    return messages


def committed(kafka: KafkaSettings, group_id: str, topic: str) -> dict[int, int]:
    """The group's committed offset per partition that has one (no group join needed)."""
    consumer = Consumer(
        {**kafka.client_config(), "group.id": group_id, "enable.auto.commit": False}
    )
    try:
        offsets = consumer.committed(
            [TopicPartition(topic, p) for p in range(contract.PARTITIONS)], timeout=10
        )
    finally:
        consumer.close()
    return {tp.partition: tp.offset for tp in offsets if tp.offset >= 0}


def headers_of(message: Any) -> dict[str, str]:
    return {k: v.decode() for k, v in (message.headers() or [])}


def warnings_in(caplog: pytest.LogCaptureFixture, text: str) -> list[dict[str, Any]]:
    return [
        fields_of(r)
        for r in caplog.records
        if r.levelno == logging.WARNING and text in r.getMessage()
    ]


def wait_until(condition: Any, *, then: Any, timeout: float = 30.0) -> None:
    """Poll ``condition`` (cheap, in-process state) until true or ``timeout``, then call ``then``."""
    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.02)
    then()
