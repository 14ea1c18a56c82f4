"""Rebalances during a sink outage, through the real broker: two consumers in one group.

While the sink is down every partition is paused on a held message. A member joining or leaving
the group moves partitions between the two; librdkafka keeps an application's pause across
revoke and re-assign, so a partition paused before the rebalance would never flow again unless
the consumer resumes what it is assigned. Once the sink is back, every reminder must be notified
exactly once (the members share one de-duplication file, as consumers of one host do) and every
partition's committed offset must reach its end.
"""

from __future__ import annotations

import threading
import uuid
from collections import Counter
from collections.abc import Callable

from reminder_pipeline.consumer import Notification, ReminderConsumer, SqliteDedupStore
from reminder_pipeline.domain import contract

from .lane import Lane, a_payload, committed, wait_until

PER_PARTITION = 4
#: Generous bounds for a slow shared machine; a consumer that never resumes waits them out.
JOIN_TIMEOUT = 60.0
DRAIN_TIMEOUT = 90.0


class OutageSink:
    """A sink shared by the group's members: down until told otherwise; records who tried what."""

    def __init__(self, partition_of: dict[str, int]) -> None:
        self.partition_of = partition_of
        self.down = True
        self.lock = threading.Lock()
        self.delivered: Counter[tuple[str, str]] = Counter()
        self.delivered_by: dict[str, set[str]] = {}
        self.tried: dict[str, set[int]] = {}

    def member(self, name: str) -> _MemberSink:
        return _MemberSink(self, name)

    def reminders_delivered(self) -> set[str]:
        with self.lock:
            return {reminder for reminder, _recipient in self.delivered}


class _MemberSink:
    def __init__(self, shared: OutageSink, name: str) -> None:
        self.shared, self.name = shared, name

    def deliver(self, notification: Notification) -> None:
        rid = str(notification.reminder_id)
        shared = self.shared
        with shared.lock:
            shared.tried.setdefault(self.name, set()).add(shared.partition_of[rid])
            if shared.down:
                raise ConnectionError("push gateway unavailable")
            shared.delivered[(rid, str(notification.recipient_user_id))] += 1
            shared.delivered_by.setdefault(self.name, set()).add(rid)


class Member:
    """One consumer of the group, running on a thread of its own."""

    def __init__(self, lane: Lane, sink: OutageSink, name: str) -> None:
        self.name = name
        self.stop = threading.Event()
        self.dedup = SqliteDedupStore(lane.dedup_path)
        self.consumer = ReminderConsumer(lane.kafka, sink.member(name), self.dedup, lane.options())
        self.errors: list[BaseException] = []
        self.thread = threading.Thread(target=self._run, name=f"consumer-{name}", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.consumer.run(stop=self.stop)
        except BaseException as exc:  # noqa: BLE001 - reported by the test, not lost in a thread
            self.errors.append(exc)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=30)
        self.dedup.close()
        assert not self.thread.is_alive(), f"consumer {self.name} did not stop"
        assert not self.errors, f"consumer {self.name} failed: {self.errors!r}"


def _await(condition: Callable[[], bool], what: str, timeout: float) -> None:
    wait_until(condition, then=lambda: None, timeout=timeout)
    assert condition(), f"timed out waiting for {what}"


def _produce_everywhere(lane: Lane) -> dict[str, int]:
    """PER_PARTITION reminders on each partition (half with a client); reminder id -> partition."""
    partition_of: dict[str, int] = {}
    for partition in range(contract.PARTITIONS):
        for i in range(PER_PARTITION):
            message = a_payload(ClientUserId=str(uuid.uuid4()) if i % 2 else None)
            lane.produce(message, partition=partition)
            partition_of[message["ReminderId"]] = partition
    return partition_of


def _assert_each_notified_once_and_nothing_stuck(
    lane: Lane, sink: OutageSink, partition_of: dict[str, int]
) -> None:
    _await(
        lambda: sink.reminders_delivered() == set(partition_of),
        "every reminder to be notified",
        DRAIN_TIMEOUT,
    )
    expected_end = dict.fromkeys(range(contract.PARTITIONS), PER_PARTITION)
    _await(
        lambda: committed(lane.kafka, lane.group_id, lane.topic) == expected_end,
        "every partition's committed offset to reach its end",
        DRAIN_TIMEOUT,
    )
    with sink.lock:
        twice = {key: n for key, n in sink.delivered.items() if n != 1}
        recipients = len(sink.delivered)
    assert not twice, f"notified more than once: {twice}"
    assert recipients == len(partition_of) + len(partition_of) // 2  # owners + half with a client


def test_a_member_joining_during_an_outage_strands_no_partition(lane: Lane) -> None:
    """Outage; A holds all 3 partitions; B joins (rebalance); the sink returns: all flow, once."""
    partition_of = _produce_everywhere(lane)
    sink = OutageSink(partition_of)
    first = Member(lane, sink, "a")
    second: Member | None = None
    try:
        _await(
            lambda: (
                sink.tried.get("a", set()) == {0, 1, 2}
                and len(first.consumer.held_partitions()) == 3
            ),
            "A to hold a message on every partition",
            JOIN_TIMEOUT,
        )
        assignments_before = first.consumer.assignments

        second = Member(lane, sink, "b")
        _await(
            lambda: (
                first.consumer.assignments > assignments_before
                and second.consumer.owned
                and first.consumer.owned
                and len(first.consumer.owned | second.consumer.owned) == 3
            ),
            "the rebalance to split the partitions between A and B",
            JOIN_TIMEOUT,
        )

        with sink.lock:
            sink.down = False
        _assert_each_notified_once_and_nothing_stuck(lane, sink, partition_of)
        assert sink.delivered_by.get("a") and sink.delivered_by.get("b")
    finally:
        first.close()
        if second is not None:
            second.close()


def test_a_member_leaving_during_an_outage_strands_no_partition(lane: Lane) -> None:
    """A and B each hold their partitions; B leaves (rebalance); the sink returns: all flow, once."""
    sink = OutageSink({})
    first = Member(lane, sink, "a")
    second = Member(lane, sink, "b")
    try:
        _await(
            lambda: (
                first.consumer.owned
                and second.consumer.owned
                and len(first.consumer.owned | second.consumer.owned) == 3
            ),
            "A and B to share the partitions",
            JOIN_TIMEOUT,
        )
        sink.partition_of.update(_produce_everywhere(lane))
        _await(
            lambda: (
                len(first.consumer.held_partitions()) == len(first.consumer.owned)
                and len(second.consumer.held_partitions()) == len(second.consumer.owned)
            ),
            "both members to hold a message on each of their partitions",
            JOIN_TIMEOUT,
        )
        held_by_a = set(first.consumer.held_partitions())
        assignments_before = first.consumer.assignments

        second.close()
        _await(
            lambda: (
                first.consumer.assignments > assignments_before
                and first.consumer.owned == {0, 1, 2}
            ),
            "A to be assigned every partition",
            JOIN_TIMEOUT,
        )
        assert held_by_a  # A had paused partitions before the rebalance and owns them again

        with sink.lock:
            sink.down = False
        _assert_each_notified_once_and_nothing_stuck(lane, sink, sink.partition_of)
        assert sink.delivered_by.get("a") == set(sink.partition_of)
    finally:
        first.close()
        if second.thread.is_alive():
            second.close()
