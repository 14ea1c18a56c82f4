"""The consumer drops a reminder whose StartAt has passed, through the real broker.

A re-published message of an event moved since (its old StartAt) or a message held long enough
reaches the consumer after the meeting began: the contract lets Notifications drop it. It is
committed, counted (a metric and the run's stats) and logged with its ids, never notified; a
"starts now" reminder a few seconds late is still notified, and key order is kept.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest

from reminder_pipeline.consumer.metrics import MESSAGES, PASSED_DROPPED
from reminder_pipeline.logs import fields_of

from .lane import Lane, RecordingSink, a_payload, committed


def _at(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def test_the_consumer_drops_a_passed_start_at(lane: Lane, caplog: pytest.LogCaptureFixture) -> None:
    now = datetime.now(UTC)
    event_id = str(uuid.uuid4())
    passed = a_payload(EventId=event_id, StartAt=_at(now - timedelta(days=3)), OffsetMinutes=60)
    starts_now = a_payload(
        EventId=event_id, StartAt=_at(now - timedelta(seconds=20)), OffsetMinutes=0
    )
    coming = a_payload(EventId=event_id)
    for message in (passed, starts_now, coming):
        lane.produce(message, partition=2)

    sink = RecordingSink()
    consumer = lane.run(sink, max_messages=3)

    assert sink.reminder_ids() == [starts_now["ReminderId"], coming["ReminderId"]]
    assert consumer.stats.passed_dropped == 1 and consumer.stats.messages == 3
    assert committed(lane.kafka, lane.group_id, lane.topic) == {2: 3}
    sample = consumer.metrics.registry.get_sample_value
    assert sample(PASSED_DROPPED) == 1
    assert sample(MESSAGES, {"outcome": "start_passed"}) == 1
    [line] = [fields_of(r) for r in caplog.records if "StartAt has passed" in r.getMessage()]
    assert (line["reminder_id"], line["event_id"]) == (passed["ReminderId"], event_id)
    assert line["seconds_past_start"] > 3 * 86_400 - 60
