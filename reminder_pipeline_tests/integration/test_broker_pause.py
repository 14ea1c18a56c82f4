"""The broker paused (SIGSTOP) under a running multi-batch drain, then resumed (SIGCONT).

A broker that stops answering without closing its connections (a frozen VM, a long pause, a
network black hole) is the outage a timeout cannot tell from a slow broker: produce requests
already sent sit in its socket buffer and are written when it resumes. Against a real broker of
the test's own, paused while the drain's relay thread publishes: every row still commits Sent
with its outbox row; the relay stops waiting after its report wait, and the next pass with the
same long-lived producer (the run's relay step, the CLI's relay) publishes everything once the
broker answers: each reminder exactly once, nothing lost, the producer never fenced. A producer
the broker does fence (a pause longer than its delivery timeout) is replaced by itself.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections import Counter, defaultdict

import pytest

from reminder_pipeline import cycle
from reminder_pipeline.config import KafkaSettings
from reminder_pipeline.local.servers import EmbeddedBroker, free_port
from reminder_pipeline.messaging.kafka import KafkaPublisher, ensure_topic
from reminder_pipeline.messaging.relay import publish_outbox

from ..support import KafkaReader, bulk_due, make_due_event, outbox_rows, reminders, utcnow

ROWS = 2_000
BATCH = 200


@pytest.fixture
def own_broker(tmp_path):
    """A broker of this test's own, to pause and resume (resumed before it is stopped)."""
    broker = EmbeddedBroker(state_dir=tmp_path, port=free_port())
    broker.start()
    yield broker
    pid = broker.pid()
    if pid is not None:
        os.kill(pid, signal.SIGCONT)
    broker.stop()


def _drain_through_a_pause(engine, broker, publisher, pause_seconds: float):
    """A 10-batch drain whose broker is paused after its 4th batch (the relay thread is then
    publishing), resumed ``pause_seconds`` later; returns once the broker answers again."""
    pid = broker.pid()
    assert pid is not None
    make_due_event(engine)
    assert cycle.run_cycle(engine, publisher).relay.published == 1  # connected, producer id held
    bulk_due(engine, ROWS)
    resumed = threading.Event()
    paused = threading.Event()

    def resume_later() -> None:
        time.sleep(pause_seconds)
        os.kill(pid, signal.SIGCONT)
        resumed.set()

    def pause_mid_drain(counts) -> None:
        if counts.batches == 4 and not paused.is_set():
            os.kill(pid, signal.SIGSTOP)
            paused.set()
            threading.Thread(target=resume_later, daemon=True).start()

    counts, relay = cycle.drain(
        engine,
        utcnow(),
        BATCH,
        max_batches=100,
        budget_seconds=30,
        publisher=publisher,
        progress=pause_mid_drain,
    )
    assert counts.sent == ROWS and counts.batches == ROWS // BATCH
    assert len(outbox_rows(engine)) == ROWS + 1  # every row committed with its outbox row
    assert resumed.wait(pause_seconds + 120)
    return relay


def _on_the_topic(settings, engine) -> dict[str, list[str]]:
    """Every message of the test's reminders on the topic: ReminderId -> payloads read."""
    reader = KafkaReader(settings)
    try:
        ids = [r["id"] for r in reminders(engine)]
        reader.wait_for(ids, timeout=120)
        reader.drain(idle=3.0)
        payloads: dict[str, list[str]] = defaultdict(list)
        for m in reader.messages:
            payloads[m.value["ReminderId"]].append(m.raw_value)
    finally:
        reader.close()
    assert set(payloads) == {str(i) for i in ids}  # nothing lost
    return payloads


def test_a_broker_paused_mid_drain_gets_everything_exactly_once_after_it_resumes(
    engine, own_broker
):
    settings = KafkaSettings(own_broker.bootstrap_servers)
    ensure_topic(settings)
    publisher = KafkaPublisher(settings)  # the Dagster resource's and the CLI's defaults
    try:
        relay = _drain_through_a_pause(engine, own_broker, publisher, pause_seconds=45)
        assert relay.failed > 0  # the relay stopped waiting; the rows stayed in the outbox

        after = publish_outbox(engine, publisher, budget_seconds=120)
        assert after.failed == 0 and publisher.replacements == 0  # never fenced
    finally:
        publisher.close()
    assert all(o["published_at"] is not None for o in outbox_rows(engine))
    payloads = _on_the_topic(settings, engine)
    assert Counter(len(p) for p in payloads.values()) == {1: ROWS + 1}  # exactly once


def test_a_producer_fenced_by_a_pause_longer_than_its_delivery_timeout_is_replaced(
    engine, own_broker
):
    settings = KafkaSettings(own_broker.bootstrap_servers)
    ensure_topic(settings)
    publisher = KafkaPublisher(settings, message_timeout_ms=5_000)
    try:
        _drain_through_a_pause(engine, own_broker, publisher, pause_seconds=30)
        deadline = time.monotonic() + 120
        while any(o["published_at"] is None for o in outbox_rows(engine)):
            assert time.monotonic() < deadline, "the producer never published again"
            publish_outbox(engine, publisher, budget_seconds=30)
    finally:
        publisher.close()
    payloads = _on_the_topic(settings, engine)
    # Messages that timed out in flight may be written when the broker resumes and go out again
    # (at least once): a copy is always the same message.
    assert all(len(set(p)) == 1 for p in payloads.values())
    print(
        "replacements",
        publisher.replacements,
        "doubled",
        sum(len(p) > 1 for p in payloads.values()),
    )
