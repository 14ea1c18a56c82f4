"""No message holds a partition for good, through the real broker.

A non-JSON value just under the producer's 1,000,000-byte limit is readable by the broker and
any producer can send it, but its dead-letter copy (the value, its headers and the dead-letter
headers) is over that limit. The consumer cuts the copy to fit, keeps the original's topic,
partition, offset, size and SHA-256 in its headers, and the valid reminder behind it on the same
partition is delivered. A dead-letter copy the broker refuses is a permanent outcome for that
message (a smaller copy, else skipped and counted), never a retry loop.
"""

from __future__ import annotations

import hashlib
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

from reminder_pipeline.consumer import MessageProblem
from reminder_pipeline.consumer.dead_letter_copy import DEFAULT_DLQ_MAX_BYTES, dead_letter_copy
from reminder_pipeline.consumer.metrics import MESSAGES, RETRIES
from reminder_pipeline.domain import contract
from reminder_pipeline.messaging.dead_letters import (
    HEADER_DLQ_DIGEST,
    HEADER_DLQ_OFFSET,
    HEADER_DLQ_PARTITION,
    HEADER_DLQ_REASON,
    HEADER_DLQ_SIZE,
    HEADER_DLQ_TOPIC,
    HEADER_DLQ_TRUNCATED,
)

from .lane import Lane, RecordingSink, a_payload, committed, headers_of, read_topic


@contextmanager
def give_up_after(sink: RecordingSink, seconds: float = 60.0) -> Iterator[None]:
    """Stop the run after ``seconds``: a partition held for good fails the test, not hangs it."""
    timer = threading.Timer(seconds, sink.stop.set)
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


#: The issue's size: under the producer's and the broker's default limits.
BIG = 999_701


def test_a_message_just_under_the_limit_is_dead_lettered_cut_and_the_reminder_behind_flows(
    lane: Lane,
) -> None:
    """~1 MB of non-JSON and a ~1 MB JSON bomb ahead of a valid reminder on one partition."""
    big = b"\xff" + uuid.uuid4().bytes * (BIG // 16) + b"x" * (BIG % 16 - 1)
    assert len(big) == BIG
    # A JSON bomb of the same size: nesting deeper than any parser's recursion.
    bomb = b"[" * (BIG // 2) + b"]" * (BIG // 2)
    behind = a_payload()
    key = behind["EventId"]
    lane.produce(big, key=key, headers=contract.headers(str(uuid.uuid4()), None), partition=0)
    lane.produce(bomb, key=key, partition=0)
    lane.produce(behind, partition=0)

    sink = RecordingSink([behind["ReminderId"]], expect=1)
    with give_up_after(sink):
        consumer = lane.run(sink, max_messages=3, max_attempts=2)

    assert sink.reminder_ids() == [behind["ReminderId"]]
    by_offset = {
        headers_of(m)[HEADER_DLQ_OFFSET]: m for m in read_topic(lane.kafka, lane.dlq_topic, 2)
    }
    assert set(by_offset) == {"0", "1"}
    bomb_headers = headers_of(by_offset["1"])
    assert bomb_headers[HEADER_DLQ_SIZE] == str(len(bomb))
    assert bomb_headers[HEADER_DLQ_DIGEST] == hashlib.sha256(bomb).hexdigest()
    dead = by_offset["0"]
    headers = headers_of(dead)
    assert headers[HEADER_DLQ_REASON] == MessageProblem.UNPARSEABLE.value
    assert (headers[HEADER_DLQ_TOPIC], headers[HEADER_DLQ_PARTITION]) == (lane.topic, "0")
    assert headers[HEADER_DLQ_OFFSET] == "0"
    assert headers[HEADER_DLQ_SIZE] == str(BIG)
    assert headers[HEADER_DLQ_DIGEST] == hashlib.sha256(big).hexdigest()
    assert headers[HEADER_DLQ_TRUNCATED] == "value"
    value = dead.value()
    assert big.startswith(value) and 0 < len(value) < BIG
    assert dead.key() == key.encode()  # the key is small: kept, so the DLQ keeps key order
    assert committed(lane.kafka, lane.group_id, lane.topic) == {0: 3}
    sample = consumer.metrics.registry.get_sample_value
    assert consumer.stats.dead_lettered == 2
    assert sample(RETRIES, {"stage": "dead_letter"}) == 0  # never taken for an outage


def test_a_dead_letter_the_broker_refuses_is_permanent_not_an_outage_loop(lane: Lane) -> None:
    """The dead-letter producer allows less than assumed: a minimal copy, then the partition moves."""
    unreadable = b"not json " * 600  # 5,400 bytes
    behind = a_payload()
    lane.produce(unreadable, key=behind["EventId"], partition=1)
    lane.produce(behind, partition=1)

    sink = RecordingSink([behind["ReminderId"]], expect=1)
    # librdkafka's smallest message.max.bytes: the whole copy is refused at produce().
    with give_up_after(sink):
        consumer = lane.run(
            sink, max_messages=2, max_attempts=1, dlq_producer_config={"message.max.bytes": 1000}
        )

    assert sink.reminder_ids() == [behind["ReminderId"]]
    [dead] = read_topic(lane.kafka, lane.dlq_topic, 1)
    headers = headers_of(dead)
    assert headers[HEADER_DLQ_TRUNCATED] == "value,headers,key"
    assert headers[HEADER_DLQ_SIZE] == str(len(unreadable))
    assert headers[HEADER_DLQ_DIGEST] == hashlib.sha256(unreadable).hexdigest()
    assert headers[HEADER_DLQ_PARTITION] == "1" and headers[HEADER_DLQ_OFFSET] == "0"
    assert not dead.value()
    sample = consumer.metrics.registry.get_sample_value
    assert sample(RETRIES, {"stage": "dead_letter"}) == 0
    assert sample(MESSAGES, {"outcome": "dead_lettered"}) == 1


def test_a_copy_that_fits_is_whole_and_a_cut_one_fits_the_budget() -> None:
    """The cut is sized by the same arithmetic librdkafka checks (value, key and headers)."""
    origin = [(HEADER_DLQ_REASON, b"unparseable")]
    whole = dead_letter_copy(b"k", b"v" * 100, [("h", b"x")], origin, DEFAULT_DLQ_MAX_BYTES)
    assert whole.truncated == () and whole.value == b"v" * 100
    huge_headers = [(f"h{i}", b"x" * 1000) for i in range(400)]
    cut = dead_letter_copy(b"k" * 500_000, b"v" * BIG, huge_headers, origin, DEFAULT_DLQ_MAX_BYTES)
    assert cut.truncated == ("value", "headers", "key")
    size = len(cut.value or b"") + sum(len(n) + len(v or b"") for n, v in cut.headers)
    assert size <= DEFAULT_DLQ_MAX_BYTES - 1024
    assert (HEADER_DLQ_SIZE, str(BIG).encode()) in cut.headers
