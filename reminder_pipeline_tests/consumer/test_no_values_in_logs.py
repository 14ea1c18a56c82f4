"""A faulty producer's field values never reach our logs or dead-letter headers (issue 35).

Through the real broker: a message whose OwnerUserId holds a name and a phone number, one whose
StartAt does, and one whose ``reminder-id`` header does. The consumer's "cannot be read" and
"dead-lettered" lines and the ``dlq-*`` headers name the field and what is wrong with it only.
"""

from __future__ import annotations

import logging

import pytest

from reminder_pipeline.consumer.kafka_messages import NOT_AN_ID
from reminder_pipeline.domain import contract
from reminder_pipeline.logs import fields_of, items_of
from reminder_pipeline.messaging.dead_letters import DLQ_HEADER_PREFIX, HEADER_DLQ_ERROR

from .lane import Lane, RecordingSink, a_payload, headers_of, read_topic

PII = "Ivanov Ivan +7 900 123-45-67"


def test_the_field_is_named_and_its_value_never_echoed(
    lane: Lane, caplog: pytest.LogCaptureFixture
) -> None:
    owner = a_payload(OwnerUserId=PII)
    start = a_payload(StartAt=PII)
    header = a_payload(OwnerUserId=PII)
    lane.produce(owner)
    lane.produce(start)
    lane.produce(header, headers={contract.HEADER_REMINDER_ID: PII})

    with caplog.at_level(logging.DEBUG):
        consumer = lane.run(RecordingSink(), max_messages=3, max_attempts=2)

    assert consumer.stats.dead_lettered == 3
    records = caplog.records
    assert any("cannot be read" in r.getMessage() for r in records)
    assert any("dead-lettered" in r.getMessage() for r in records)
    for record in records:
        logged = f"{record.getMessage()} {fields_of(record)} {items_of(record)}"
        assert "Ivanov" not in logged and "900" not in logged, logged
    assert any(fields_of(r).get("reminder_id") == NOT_AN_ID for r in records)

    errors = set()
    for message in read_topic(lane.kafka, lane.dlq_topic, 3):
        ours = {k: v for k, v in headers_of(message).items() if k.startswith(DLQ_HEADER_PREFIX)}
        assert not [v for v in ours.values() if "Ivanov" in v or "900" in v], ours
        errors.add(ours[HEADER_DLQ_ERROR])
    assert errors == {
        "OwnerUserId: is not a GUID (28 characters)",
        "StartAt: is not an ISO-8601 date-time with a UTC offset (28 characters)",
    }
