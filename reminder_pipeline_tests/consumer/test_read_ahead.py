"""The next batch read while a batch's write is waited for: the order of deliveries, writes and
commits is the one without it, and a write that fails fails the batch as before."""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Collection
from typing import Any

import pytest
from confluent_kafka import Message

from reminder_pipeline.consumer.dead_letters import DeadLetters
from reminder_pipeline.consumer.dedup import DedupStoreUnavailable, Known, Records
from reminder_pipeline.consumer.handling import MessageHandling
from reminder_pipeline.consumer.metrics import ConsumerMetrics
from reminder_pipeline.consumer.options import ConsumerOptions, ConsumeStats
from reminder_pipeline.consumer.texts import Locale

from .payloads import payload


def _messages(count: int, start: int = 0) -> list[Message]:
    return [
        Message(
            topic="t",
            partition=0,
            offset=start + i,
            value=json.dumps(payload(StartAt="2099-01-01T10:00:00Z")).encode(),
            headers=[("ContractVersion", b"1")],
        )
        for i in range(count)
    ]


class _Journal:
    """A store and a sink writing one journal: what happened, in order, on which thread."""

    def __init__(self) -> None:
        self.entries: list[tuple[str, Any]] = []
        self.handled: set[uuid.UUID] = set()
        self.fail_next_write = False
        self.write_started = threading.Event()

    def ping(self) -> None:
        pass

    def known(self, reminder_ids: Collection[uuid.UUID]) -> Known:
        self.entries.append(("known", len(reminder_ids)))
        return Known(frozenset(self.handled & set(reminder_ids)))

    def record(self, records: Records) -> None:
        self.write_started.set()
        if self.fail_next_write:
            self.fail_next_write = False
            raise DedupStoreUnavailable("OperationalError: the server went away")
        self.handled |= {r for r, _ in records.handled}
        self.entries.append(("record", len(records.handled)))

    def deliver(self, notification: Any) -> None:
        self.entries.append(("deliver", notification.reminder_id))


def _handling(journal: _Journal) -> MessageHandling:
    options, stats, metrics = ConsumerOptions(), ConsumeStats(), ConsumerMetrics()
    return MessageHandling(
        journal,
        journal,
        options,
        Locale.EN,
        stats,
        metrics,
        DeadLetters(None, options, stats, metrics),  # type: ignore[arg-type]
    )


def test_the_next_batch_is_read_during_the_write_and_handled_in_its_own_turn() -> None:
    journal = _Journal()
    handling = _handling(journal)
    first, second = _messages(3), _messages(2, start=3)
    reads: list[int] = []
    read = handling._read
    handling._read = lambda messages: reads.append(len(messages)) or read(messages)  # type: ignore[method-assign]
    assert handling.handle_batch(first, read_next=second).done == 3
    assert reads == [3, 2] and journal.write_started.is_set()
    # Only the first batch was delivered and written; the second is read, nothing more.
    assert [kind for kind, _ in journal.entries] == ["known", *["deliver"] * 3, "record"]
    assert handling.handle_batch(second).done == 2
    assert [kind for kind, _ in journal.entries[5:]] == ["known", "deliver", "deliver", "record"]
    assert handling.stats.reminders_notified == 5
    assert reads == [3, 2]  # the second batch was not read again


def test_a_write_that_fails_during_the_read_ahead_fails_the_batch_and_is_written_first_next() -> (
    None
):
    journal = _Journal()
    handling = _handling(journal)
    first, second = _messages(2), _messages(2, start=2)
    journal.fail_next_write = True
    with pytest.raises(DedupStoreUnavailable):
        handling.handle_batch(first, read_next=second)
    # The batch is attempted again: its deliveries are written first, then it is a duplicate.
    assert handling.handle_batch(first, attempt=2).done == 2
    delivered = [value for kind, value in journal.entries if kind == "deliver"]
    assert len(delivered) == 2 and handling.stats.duplicates == 2
    assert handling.handle_batch(second).done == 2
    assert handling.stats.reminders_notified == 4
