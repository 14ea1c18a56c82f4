"""The re-publish back-fill on the real database and broker.

Reminders due on two past days are dispatched and published by real cycles; re-publishing each day
sends its published outbox messages again, each one byte for byte as stored (and as the relay sent
it) plus the ``republished-by-run`` header, in outbox id order within every partition, one day
after the other. Unpublished rows are neither sent nor marked, no row changes; days past the
outbox retention and future days are refused with one line before anything is sent; a failed
delivery and a relay lock that stays busy stop the day plainly, naming how many went out; a live
relay holding the lock makes the back-fill wait for it.
"""

from __future__ import annotations

import threading
import time
import uuid
from datetime import timedelta

import pytest
import sqlalchemy as sa

from reminder_pipeline.config import KafkaSettings
from reminder_pipeline.domain import contract
from reminder_pipeline.local.servers import free_port
from reminder_pipeline.messaging.kafka import KafkaPublisher
from reminder_pipeline.messaging.relay_lock import relay_lock
from reminder_pipeline.operator_jobs.republish import (
    HEADER_REPUBLISHED_BY_RUN,
    RepublishFailed,
    RepublishRefused,
    Requester,
    day_window,
    resend_day,
)
from reminder_pipeline.store import outbox_queries
from reminder_pipeline_tests.support import (
    PublishedDays,
    outbox_rows,
    publish_two_days,
    utcnow,
    wait_for_republished,
)


@pytest.fixture
def days(engine, publisher) -> PublishedDays:
    """Two days of published reminders, one unpublished row, one row of the day before."""
    return publish_two_days(engine, publisher, utcnow())


def _state(engine) -> dict[int, tuple]:
    """Every outbox row's publish state: what the back-fill must never change."""
    return {r["id"]: (r["published_at"], r["publish_attempts"]) for r in outbox_rows(engine)}


def test_two_days_go_out_again_as_stored_in_outbox_id_order(engine, publisher, kafka_reader, days):
    before = _state(engine)
    stored = {str(r["reminder_id"]): r for r in outbox_rows(engine)}
    originals = {m.value["ReminderId"]: m for m in kafka_reader.wait_for(list(stored))}
    run_id = f"test-{uuid.uuid4()}"
    reports = [
        resend_day(engine, publisher, day, Requester(run_id, "backfill-1")) for day in days.days
    ]

    assert [(r.day, r.republished) for r in reports] == [
        (day, len(days.published[day])) for day in days.days
    ]
    assert [r.unpublished for r in reports] == [1, 0]
    everything = days.published[days.days[0]] + days.published[days.days[1]]
    sent = wait_for_republished(kafka_reader, list(stored), len(everything))
    assert sorted(m.value["ReminderId"] for m in sent) == sorted(everything)  # each exactly once
    for message in sent:
        row = stored[message.value["ReminderId"]]
        assert message.key == row["message_key"] == message.value["EventId"]
        assert message.headers == {
            **row["headers"],
            contract.HEADER_MESSAGE_ID: contract.message_id(message.value["ReminderId"]),
            HEADER_REPUBLISHED_BY_RUN: run_id,
        }
        original = originals[message.value["ReminderId"]]
        assert message.raw_value == original.raw_value  # the stored payload text, as first sent
        assert message.partition == original.partition
    # Outbox id order within each partition (a key's order), the first day before the second.
    for partition in {m.partition for m in sent}:
        in_partition = sorted((m for m in sent if m.partition == partition), key=lambda m: m.offset)
        ids = [stored[m.value["ReminderId"]]["id"] for m in in_partition]
        due_days = [stored[m.value["ReminderId"]]["due_at"].date() for m in in_partition]
        assert due_days == sorted(due_days)
        for day in days.days:
            of_day = [i for i, d in zip(ids, due_days, strict=True) if d == day]
            assert of_day == sorted(of_day)
    # The key due on both days is among them (the order check above covered it).
    due_days_of_key: dict[str, set] = {}
    for m in sent:
        due_days_of_key.setdefault(m.key, set()).add(stored[m.value["ReminderId"]]["due_at"].date())
    assert [k for k, d in due_days_of_key.items() if len(d) == 2]

    assert days.unpublished not in {m.value["ReminderId"] for m in sent}
    assert days.day_before not in {m.value["ReminderId"] for m in sent}
    assert not kafka_reader.for_reminders([days.unpublished])  # still only the relay's to send
    assert _state(engine) == before  # nothing marked, nothing counted, nothing deleted
    assert reports[0].first_outbox_id <= reports[0].last_outbox_id


def test_a_day_past_retention_and_a_future_day_are_refused_before_anything_is_sent(
    engine, publisher, kafka_reader, days
):
    now = utcnow()
    run_id = f"test-{uuid.uuid4()}"
    old = (now - timedelta(days=8)).date()
    with pytest.raises(RepublishRefused) as past:
        resend_day(engine, publisher, old, Requester(run_id), now=now)
    message = str(past.value)
    assert message.startswith(
        f"re-publish of {old} refused: the day is past the outbox retention (168 h)"
    )
    assert "\n" not in message
    # With a shorter retention, one of the days that was just re-publishable is refused too.
    with pytest.raises(RepublishRefused, match=rf"{days.days[0]} refused: .*retention \(24 h\)"):
        resend_day(
            engine,
            publisher,
            days.days[0],
            Requester(run_id),
            retention=timedelta(hours=24),
            now=now,
        )
    tomorrow = (now + timedelta(days=1)).date()
    with pytest.raises(RepublishRefused) as future:
        resend_day(engine, publisher, tomorrow, Requester(run_id), now=now)
    assert str(future.value).startswith(
        f"re-publish of {tomorrow} refused: the day is in the future"
    )
    # Today is a day like the others: what was published so far (nothing, here).
    assert resend_day(engine, publisher, now.date(), Requester(run_id), now=now).republished == 0
    kafka_reader.drain(idle=1.0)
    assert not [
        m for m in kafka_reader.messages if m.headers.get(HEADER_REPUBLISHED_BY_RUN) == run_id
    ]


def test_a_failed_delivery_stops_the_day_naming_how_many_went_out(engine, days):
    before = _state(engine)
    dead = KafkaPublisher(
        KafkaSettings.from_env({}, f"127.0.0.1:{free_port()}"), message_timeout_ms=1_500
    )
    try:
        with pytest.raises(RepublishFailed) as failed:
            resend_day(
                engine,
                dead,
                days.days[1],
                Requester("test-run"),
                chunk_size=2,
            )
    finally:
        dead.close(timeout=0)
    assert failed.value.republished == 0
    assert str(failed.value).startswith(
        f"re-publish of {days.days[1]} failed: 2 messages not delivered"
    )
    assert "0 of the day's 5 messages were re-published" in str(failed.value)
    assert _state(engine) == before


def _waiting_for_relay_lock(engine) -> int:
    with engine.connect() as conn:
        return conn.execute(
            sa.text(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objid = :key "
                "AND NOT granted"
            ),
            {"key": outbox_queries.RELAY_LOCK_KEY},
        ).scalar_one()


def test_a_chunk_waits_for_the_relay_lock_and_gives_up_plainly(
    engine, publisher, kafka_reader, days
):
    day = days.days[0]
    with relay_lock(engine, 1.0) as held:  # a live relay publishing
        assert held is not None
        with pytest.raises(
            RepublishFailed,
            match=r"relay lock stayed busy for 0.5 s; 0 of the "
            r"day's 6 messages were re-published",
        ):
            resend_day(engine, publisher, day, Requester("test-busy"), lock_wait_seconds=0.5)

        outcome: dict = {}
        worker = threading.Thread(
            target=lambda: outcome.update(
                report=resend_day(
                    engine,
                    publisher,
                    day,
                    Requester("test-waits"),
                    chunk_size=4,
                    lock_wait_seconds=60,
                )
            )
        )
        worker.start()
        while _waiting_for_relay_lock(engine) == 0:  # the back-fill queues behind the relay
            assert worker.is_alive(), outcome
            time.sleep(0.05)
        assert "report" not in outcome
    worker.join(60)  # the relay let go of the lock: the back-fill goes on
    assert outcome["report"].republished == 6 and outcome["report"].chunks == 2
    sent = wait_for_republished(kafka_reader, days.published[day], 6)
    assert {m.headers[HEADER_REPUBLISHED_BY_RUN] for m in sent} == {"test-waits"}


def test_the_day_is_read_through_indexes(engine):
    # Enough rows over eight days that a sequential scan would be the wrong plan; EXPLAIN only.
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                """
            INSERT INTO outbox (topic, message_key, payload, reminder_id, due_at, published_at)
            SELECT 't', 'k', '{}'::jsonb, gen_random_uuid(),
                   now() - (g * interval '8 days' / 40000), now()
              FROM generate_series(1, 40000) g
            """
            )
        )
        conn.exec_driver_sql("ANALYZE outbox")
    start, end = day_window((utcnow() - timedelta(days=3)).date())
    with engine.connect() as conn:
        bounds = conn.execute(
            outbox_queries.REPUBLISH_DAY_BOUNDS, {"day_start": start, "day_end": end}
        ).one()
        plans = {
            name: conn.execute(
                sa.text("EXPLAIN (FORMAT JSON) " + statement.text), params
            ).scalar_one()[0]["Plan"]
            for name, statement, params in (
                (
                    "bounds",
                    outbox_queries.REPUBLISH_DAY_BOUNDS,
                    {"day_start": start, "day_end": end},
                ),
                (
                    "chunk",
                    outbox_queries.SELECT_PUBLISHED_OF_DAY,
                    {
                        "day_start": start,
                        "day_end": end,
                        "after_id": bounds.first_id - 1,
                        "last_id": bounds.last_id,
                        "limit": 500,
                    },
                ),
            )
        }
    scans = {
        name: [n for n in _nodes(plan) if n.get("Relation Name") == "outbox"]
        for name, plan in plans.items()
    }
    assert "ix_outbox_due_at" in {n.get("Index Name") for n in scans["bounds"]}
    assert [n["Node Type"] for n in scans["chunk"]] == ["Index Scan"]
    assert scans["chunk"][0]["Index Name"] == "pk_outbox"


def _nodes(node: dict):
    yield node
    for child in node.get("Plans", []):
        yield from _nodes(child)
