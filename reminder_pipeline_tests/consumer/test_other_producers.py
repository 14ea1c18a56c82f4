"""Other producers of the same contract, through the real broker: read, not dead-lettered.

Messages written by hand the way a .NET producer writes them (``DateTimeOffset`` as
``+00:00`` with 7 fraction digits, upper-case GUIDs, camelCase names from the web serializer
defaults) are notified with the right local time; the same reminder arriving in two spellings
is notified once (de-duplication is by the id, not its spelling); a genuinely broken message
still goes to the dead-letter topic while the others flow.
"""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime

from reminder_pipeline.domain import contract
from reminder_pipeline.messaging.dead_letters import HEADER_DLQ_ERROR, HEADER_DLQ_REASON

from .lane import Lane, RecordingSink, headers_of, read_topic


def dotnet_message(reminder_id: uuid.UUID, event_id: uuid.UUID, **overrides: object) -> dict:
    """A payload as System.Text.Json writes a contract record with upper-case Guid strings."""
    data: dict[str, object] = {
        "ReminderId": str(reminder_id).upper(),
        "EventId": str(event_id).upper(),
        "TenantId": str(uuid.uuid4()).upper(),
        "OwnerUserId": str(uuid.uuid4()).upper(),
        "ClientUserId": None,
        "Kind": "Meeting",
        "StartAt": "2026-11-30T23:11:55.1234567+00:00",
        "TimeZone": "Europe/Moscow",
        "OffsetMinutes": 60,
        "AppointmentId": None,
    }
    data.update(overrides)
    return data


def test_messages_of_a_dotnet_producer_are_notified_and_a_spelling_is_no_second_reminder(
    lane: Lane,
) -> None:
    """The issue's three hand-made messages: notified, none dead-lettered; one id, one reminder."""
    event_id = uuid.uuid4()
    first, second, third = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    plain = dotnet_message(first, event_id)
    with_client = dotnet_message(
        second,
        event_id,
        ClientUserId=str(uuid.uuid4()).upper(),
        AppointmentId=str(uuid.uuid4()).upper(),
        Kind="Showing",
        StartAt="2026-12-01T02:11:55.1234567+03:00",
    )
    camel = {
        name[0].lower() + name[1:]: value
        for name, value in dotnet_message(third, event_id, Kind="Task").items()
    }
    # The first reminder again, as our producer spells it: a redelivery, not a new reminder.
    ours = {
        **plain,
        "ReminderId": str(first),
        "EventId": str(event_id),
        "TenantId": plain["TenantId"].lower(),
        "OwnerUserId": plain["OwnerUserId"].lower(),
        "StartAt": "2026-11-30T23:11:55.123456Z",
    }
    broken = dotnet_message(uuid.uuid4(), event_id, StartAt="2026-11-30T23:11:55.1234567")
    key = str(event_id).upper()
    for message in (plain, with_client, camel, ours, broken):
        lane.produce(message, key=key)

    sink = RecordingSink()
    # The messages, with their StartAt (November 2026) kept: never dropped as passed.
    consumer = lane.run(sink, max_messages=5, drop_after_start_seconds=None)

    assert sink.reminder_ids() == [str(first), str(second), str(second), str(third)]
    assert consumer.stats.duplicates == 1 and consumer.stats.dead_lettered == 1
    local = {str(n.reminder_id): n.text for n in sink.delivered}
    # 23:11:55Z is 02:11 the next day in Moscow; +03:00 spells the same instant.
    assert local[str(first)] == "Meeting starts in an hour, at 2026-12-01 02:11 (Europe/Moscow)"
    assert local[str(second)] == (
        "Property showing starts in an hour, at 2026-12-01 02:11 (Europe/Moscow)"
    )
    assert sink.delivered[0].start_at == datetime(2026, 11, 30, 23, 11, 55, 123456, UTC)
    assert [n.kind.value for n in sink.delivered] == [
        "CalendarReminder",
        "AppointmentReminder",
        "AppointmentReminder",
        "CalendarReminder",
    ]

    (dead,) = read_topic(lane.kafka, lane.dlq_topic, 1)
    headers = headers_of(dead)
    assert headers[HEADER_DLQ_REASON] == "incompatible"
    assert (
        headers[HEADER_DLQ_ERROR].startswith("StartAt: ") and "offset" in headers[HEADER_DLQ_ERROR]
    )
    assert json.loads(dead.value()) == broken


def test_the_producers_own_messages_still_pass_the_strict_schema() -> None:
    """Leniency is the consumer's: what we publish stays exactly the shipped schema."""
    strict = contract.schema()
    assert strict["additionalProperties"] is False
    assert strict["properties"]["StartAt"]["$ref"] == "#/$defs/utcTimestamp"
    assert strict["$defs"]["utcTimestamp"]["pattern"].endswith("Z$")
    assert strict["$defs"]["guid"]["pattern"] == (
        "^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$"
    )
