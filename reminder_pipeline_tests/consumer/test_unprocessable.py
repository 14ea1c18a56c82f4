"""Errors while turning a message into notifications are bounded, through the real broker.

A payload the schema accepts can still fail to become a notification: StartAt 9999-12-31T23:00Z
in Asia/Tokyo is past year 9999 in local time (OverflowError). Such an error, like an
incompatible message, counts toward the bounded attempts and then goes to the dead-letter topic
with the reason and the error in its headers; the reminders behind it on the same partition and
on the others keep flowing. Overflows that do not stop a reminder (a DueAt before year 1) do not.
"""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta

import pytest

from reminder_pipeline.consumer import MessageProblem, notifications_for, parse_reminder
from reminder_pipeline.consumer.metrics import DEAD_LETTERS, MESSAGES, RETRIES
from reminder_pipeline.domain import contract
from reminder_pipeline.messaging.dead_letters import (
    HEADER_DLQ_ATTEMPTS,
    HEADER_DLQ_ERROR,
    HEADER_DLQ_OFFSET,
    HEADER_DLQ_REASON,
)

from .lane import Lane, RecordingSink, a_payload, committed, headers_of, read_topic


def test_the_local_time_past_year_9999_is_an_overflow_error_of_the_mapping() -> None:
    """The issue's example: the schema accepts it, the conversion to local time overflows."""
    payload = a_payload(StartAt="9999-12-31T23:00:00Z", TimeZone="Asia/Tokyo")
    contract.validate(payload)
    with pytest.raises(OverflowError):
        notifications_for(parse_reminder(json.dumps(payload)))


def test_overflows_go_to_the_dlq_after_bounded_attempts_and_the_rest_flow(lane: Lane) -> None:
    """Overflow in local time → unprocessable; past 9999 in UTC → incompatible; both bounded."""
    event_id = str(uuid.uuid4())
    tokyo = a_payload(EventId=event_id, StartAt="9999-12-31T23:00:00Z", TimeZone="Asia/Tokyo")
    behind = a_payload(EventId=event_id)
    beyond_utc = a_payload(EventId=event_id, StartAt="9999-12-31T23:59:59-01:00")
    # DueAt = StartAt - 2^31-1 minutes is before year 1: no DueAt latency, still notified.
    far_ahead = a_payload(EventId=event_id, OffsetMinutes=2**31 - 1)
    elsewhere = a_payload()
    for message in (tokyo, behind, beyond_utc, far_ahead):
        lane.produce(message, partition=0)
    lane.produce(elsewhere, partition=1)

    sink = RecordingSink()
    consumer = lane.run(sink, max_messages=5, max_attempts=3)

    assert sorted(sink.reminder_ids()) == sorted(
        [behind["ReminderId"], far_ahead["ReminderId"], elsewhere["ReminderId"]]
    )
    same_key = [r for r in sink.reminder_ids() if r != elsewhere["ReminderId"]]
    assert same_key == [behind["ReminderId"], far_ahead["ReminderId"]]  # key order kept
    dead = {
        json.loads(m.value())["ReminderId"]: headers_of(m)
        for m in read_topic(lane.kafka, lane.dlq_topic, 2)
    }
    assert set(dead) == {tokyo["ReminderId"], beyond_utc["ReminderId"]}
    overflow = dead[tokyo["ReminderId"]]
    assert overflow[HEADER_DLQ_REASON] == MessageProblem.UNPROCESSABLE.value
    assert overflow[HEADER_DLQ_ERROR].startswith("OverflowError: ")
    assert overflow[HEADER_DLQ_ATTEMPTS] == "3" and overflow[HEADER_DLQ_OFFSET] == "0"
    utc = dead[beyond_utc["ReminderId"]]
    assert utc[HEADER_DLQ_REASON] == MessageProblem.INCOMPATIBLE.value
    assert utc[HEADER_DLQ_ERROR].startswith("StartAt: ") and utc[HEADER_DLQ_ATTEMPTS] == "3"
    assert committed(lane.kafka, lane.group_id, lane.topic) == {0: 4, 1: 1}

    sample = consumer.metrics.registry.get_sample_value
    assert sample(DEAD_LETTERS, {"reason": "unprocessable"}) == 1
    assert sample(DEAD_LETTERS, {"reason": "incompatible"}) == 1
    assert sample(MESSAGES, {"outcome": "notified"}) == 3
    assert sample(RETRIES, {"stage": "read"}) == 4  # 2 failed attempts before each dead letter
    assert sample(RETRIES, {"stage": "deliver"}) == 0


def test_a_bug_in_the_sink_is_an_outage_retried_without_limit_not_a_dead_letter(
    lane: Lane,
) -> None:
    """Delivery is not bounded: a sink failing past max_attempts still gets the reminder later."""
    message = a_payload(StartAt=(datetime.now(UTC) + timedelta(hours=1)).isoformat())
    lane.produce(message)
    sink = RecordingSink(fail={message["ReminderId"]: 5})
    consumer = lane.run(sink, max_messages=1, max_attempts=2)
    assert sink.reminder_ids() == [message["ReminderId"]]
    assert sink.attempts[message["ReminderId"]] == 6
    assert consumer.stats.dead_lettered == 0
