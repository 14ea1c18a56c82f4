"""The outbox relay against real brokers: at-least-once, marked only after acknowledgement, outages survived."""

from __future__ import annotations

from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pytest

from reminder_pipeline import cycle
from reminder_pipeline.config import KafkaSettings
from reminder_pipeline.local.servers import EmbeddedBroker, free_port
from reminder_pipeline.messaging.kafka import KafkaPublisher, ensure_topic
from reminder_pipeline.messaging.relay import publish_outbox

from ..support import KafkaReader, make_due_event, outbox_rows, reminders, utcnow


@pytest.fixture
def own_broker(tmp_path):
    """A broker of this test's own, to stop and start at will."""
    broker = EmbeddedBroker(state_dir=tmp_path, port=free_port())
    broker.start()
    yield broker
    broker.stop()


def test_relay_survives_a_broker_that_is_down_then_publishes_everything(engine, own_broker):
    settings = KafkaSettings(own_broker.bootstrap_servers)
    ensure_topic(settings)
    events = [make_due_event(engine, minutes_overdue=m, offsets=(60,)) for m in (3, 2, 1)]
    own_broker.stop()

    down = KafkaPublisher(settings, message_timeout_ms=1500)
    report = cycle.run_cycle(engine, down, budget_seconds=10)
    assert report.counts.sent == 3  # the transition committed: the outbox holds the messages
    assert report.relay.published == 0 and report.relay.failed >= 3
    assert report.relay.last_error
    assert all(o["published_at"] is None for o in outbox_rows(engine))
    second = publish_outbox(engine, down, budget_seconds=5)
    assert second.published == 0
    # Every message still queued in the old producer expires (message.timeout.ms) before the
    # broker comes back, so nothing from the outage window can arrive late as a duplicate.
    assert down.close(timeout=15) == 0
    del down

    own_broker.start()  # memory storage: the topic is created again, as on a fresh cluster
    ensure_topic(settings)
    up = KafkaPublisher(settings)
    result = publish_outbox(engine, up, budget_seconds=30)
    up.close()
    assert result.published == 3 and result.failed == 0
    rows = outbox_rows(engine)
    assert all(o["published_at"] is not None for o in rows)
    assert all(o["publish_attempts"] >= 2 for o in rows)  # failed attempts during the outage

    reader = KafkaReader(settings)
    try:
        ids = [reminders(engine, e)[0]["id"] for e in events]
        messages = reader.wait_for(ids)
        assert Counter(m.value["ReminderId"] for m in messages) == Counter(str(i) for i in ids)
    finally:
        reader.close()


def test_concurrent_relays_publish_each_row_once_in_outbox_order(
    engine, kafka_settings, kafka_reader
):
    # Several events, two reminders each, so per-key order is observable.
    now = utcnow()
    from datetime import timedelta

    from ..support import make_event

    event_ids = [
        make_event(
            engine,
            start_at=now + timedelta(minutes=50 + i % 5),
            offsets=(70, 65),
            now=now - timedelta(days=1),
        )
        for i in range(40)
    ]
    cycle.drain(engine, utcnow(), 1000)
    assert len(outbox_rows(engine)) == 80

    publishers = [KafkaPublisher(kafka_settings) for _ in range(2)]
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(lambda p: publish_outbox(engine, p, batch_size=7), publishers))
    for p in publishers:
        p.close()
    assert sum(r.published for r in results) == 80
    assert all(o["publish_attempts"] == 0 for o in outbox_rows(engine))  # no failed attempt

    ids = [r["id"] for e in event_ids for r in reminders(engine, e)]
    messages = kafka_reader.wait_for(ids)
    assert len(messages) == 80
    order = {o["reminder_id"].hex: o["id"] for o in outbox_rows(engine)}
    by_key: dict[str, list] = {}
    for m in sorted(messages, key=lambda m: (m.partition, m.offset)):
        by_key.setdefault(m.key, []).append(order[m.value["ReminderId"].replace("-", "")])
    for key, outbox_ids in by_key.items():
        assert outbox_ids == sorted(outbox_ids), f"key {key} out of outbox order"


def test_a_slow_broker_is_a_delivery_not_a_failed_publish(engine, tmp_path):
    """Acks arriving well after the relay's budget still count: each row's outcome is its
    delivery report, within the producer's own delivery timeout (message.timeout.ms)."""
    from ..support import start_slow_broker

    servers, stop = start_slow_broker(tmp_path, delay=1.5)  # every answer 1.5 s late
    try:
        settings = KafkaSettings(servers)
        ensure_topic(settings, timeout=30)
        events = [make_due_event(engine, minutes_overdue=m) for m in (3, 2, 1)]
        cycle.drain(engine, utcnow(), 200)  # written to the outbox, not yet published
        slow = KafkaPublisher(settings, message_timeout_ms=20_000)
        result = publish_outbox(engine, slow, budget_seconds=0.5)
        slow.close()
        assert (result.published, result.failed) == (3, 0)
        rows = outbox_rows(engine)
        assert all(o["published_at"] is not None and o["publish_attempts"] == 0 for o in rows)
        reader = KafkaReader(settings)
        try:
            ids = [reminders(engine, e)[0]["id"] for e in events]
            messages = reader.wait_for(ids, timeout=60)
            assert Counter(m.value["ReminderId"] for m in messages) == Counter(str(i) for i in ids)
        finally:
            reader.close()
    finally:
        stop()


def test_a_message_the_producer_refuses_at_once_is_a_failed_row_not_a_crash(
    engine, publisher, kafka_reader
):
    """librdkafka refuses some messages synchronously (here one over its message.max.bytes):
    that row fails and stays in the outbox; the relay goes on with the other keys."""
    import json

    import sqlalchemy as sa

    event_id = make_due_event(engine, minutes_overdue=1)
    cycle.drain(engine, utcnow(), 200)  # one good row in the outbox, unpublished
    with engine.begin() as conn:  # a row of another key, too large for the producer
        conn.execute(
            sa.text(
                "INSERT INTO outbox (topic, message_key, payload, reminder_id) "
                "VALUES (:topic, 'other-key', CAST(:payload AS jsonb), NULL)"
            ),
            {
                "topic": outbox_rows(engine)[0]["topic"],
                "payload": json.dumps({"x": "y" * 2_000_000}),
            },
        )

    result = publish_outbox(engine, publisher, budget_seconds=30)

    assert (result.published, result.failed) == (1, 1)
    good, huge = outbox_rows(engine)
    assert good["published_at"] is not None and huge["published_at"] is None
    assert huge["publish_attempts"] == 1
    [row] = reminders(engine, event_id)
    assert len(kafka_reader.wait_for([row["id"]])) == 1
