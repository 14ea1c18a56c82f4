"""One message identity across copies, on the real database and broker: every copy of a
reminder's message carries the same ``message-id`` header (RFC 9562's name-based UUIDv8 of the
ReminderId, set by the producer on every message it sends) and the same payload: the drain's
hand-over, the re-send after a failover lost the Sent commit (a new run, so a new
correlation-id), the relay's retry of a row whose published mark was lost (sent from the stored
row), and the operator's re-publish.
"""

from __future__ import annotations

import uuid

import sqlalchemy as sa

from reminder_pipeline import cycle
from reminder_pipeline.domain import contract
from reminder_pipeline.messaging.relay import publish_outbox
from reminder_pipeline.operator_jobs.republish import (
    HEADER_REPUBLISHED_BY_RUN,
    Requester,
    resend_day,
)

from ..support import make_due_event, outbox_rows, reminders, wait_for_republished


def test_message_id_is_rfc_9562_name_based_uuid8():
    # RFC 9562, appendix B.2: SHA-256 of the DNS namespace and "www.example.com".
    assert contract.name_based_uuid8(uuid.NAMESPACE_DNS, "www.example.com") == uuid.UUID(
        "5c146b14-3c52-8afd-938a-375d0df1fbf6"
    )
    assert uuid.uuid5(uuid.NAMESPACE_URL, contract.EVENT_TYPE) == contract.MESSAGE_ID_NAMESPACE
    reminder_id = "0b6f7c1e-2d3a-4e5f-8a9b-0c1d2e3f4a5b"
    assert contract.message_id(reminder_id) == str(
        contract.name_based_uuid8(contract.MESSAGE_ID_NAMESPACE, reminder_id)
    )
    for _ in range(1000):  # the producer's formatting is the RFC's UUID, digit for digit
        name = str(uuid.uuid4())
        assert contract.message_id(name) == str(
            contract.name_based_uuid8(contract.MESSAGE_ID_NAMESPACE, name)
        )


def test_every_copy_carries_the_same_message_id_and_payload(engine, publisher, kafka_reader):
    events = [make_due_event(engine, minutes_overdue=0.5) for _ in range(3)]
    ids = [str(reminders(engine, e)[0]["id"]) for e in events]
    lost = ids[0]

    first = cycle.run_cycle(engine, publisher)
    assert first.counts.sent == 3
    assert {str(r["reminder_id"]) for r in outbox_rows(engine)} == set(ids)
    assert len(kafka_reader.wait_for(ids)) == 3  # the drain's hand-over

    # A failover lost the commit of the first row's Sent transition: on the new primary it is
    # Pending with no outbox row, and the next cycle sends it again, under a new run id.
    with engine.begin() as conn:
        conn.execute(sa.text("DELETE FROM outbox WHERE reminder_id = :id"), {"id": lost})
        conn.execute(
            sa.text("UPDATE event_reminders SET status = 'Pending', sent_at = NULL WHERE id = :id"),
            {"id": lost},
        )
    second = cycle.run_cycle(engine, publisher)
    assert second.counts.sent == 1 and second.run_id != first.run_id
    # ... and lost the second row's published mark, with every commit after it (the relay's
    # low-water mark, written after the marks, among them): the relay publishes it again.
    with engine.begin() as conn:
        lost_mark = conn.execute(
            sa.text("UPDATE outbox SET published_at = NULL WHERE reminder_id = :id RETURNING id"),
            {"id": ids[1]},
        ).scalar_one()
        conn.execute(
            sa.text("UPDATE outbox_relay_position SET low_water = least(low_water, :id)"),
            {"id": lost_mark},
        )
    assert publish_outbox(engine, publisher).published == 1
    # An operator re-publishes the day.
    run_id = f"test-{uuid.uuid4()}"
    day = reminders(engine, events[2])[0]["due_at"].date()
    resend_day(engine, publisher, day, Requester(run_id, "message-identity"))

    assert len(wait_for_republished(kafka_reader, ids, 3)) == 3  # each re-published once
    kafka_reader.drain()
    copies = kafka_reader.for_reminders(ids)
    by_id = {rid: [m for m in copies if m.value["ReminderId"] == rid] for rid in ids}
    assert {rid: len(found) for rid, found in by_id.items()} == {
        lost: 3,  # first send, the re-send after the lost commit, the re-publish
        ids[1]: 3,  # first send, the relay's retry, the re-publish
        ids[2]: 2,  # first send, the re-publish
    }
    for rid, found in by_id.items():
        assert {m.headers[contract.HEADER_MESSAGE_ID] for m in found} == {contract.message_id(rid)}
        assert len({m.raw_value for m in found}) == 1  # byte-identical payloads
    # The copies say what they are: the re-send has its own run's correlation-id, the relay's
    # retry the stored one, the re-publish its run's marker.
    assert sorted(m.headers["correlation-id"] for m in by_id[lost]) == sorted(
        [first.run_id, second.run_id, second.run_id]
    )
    assert {m.headers["correlation-id"] for m in by_id[ids[1]]} == {first.run_id}
    assert sum(HEADER_REPUBLISHED_BY_RUN in m.headers for m in copies) == 3
