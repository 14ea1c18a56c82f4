"""The contract's acceptance criteria, end to end through the real broker (and, where said, the pipeline).

Each test consumes with its own consumer group. Most also use a topic and dead-letter topic of
their own (the session's broker is shared by every test); the pipeline tests read the real
contract topic and only look at the reminders they created.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sqlite3
import threading
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from sqlalchemy.engine import Engine

from reminder_pipeline.cli.consume import consume_main
from reminder_pipeline.config import KafkaSettings, Settings
from reminder_pipeline.consumer import NotificationKind
from reminder_pipeline.cycle import run_cycle
from reminder_pipeline.domain import contract
from reminder_pipeline.messaging.dead_letters import (
    HEADER_DLQ_ATTEMPTS,
    HEADER_DLQ_ERROR,
    HEADER_DLQ_GROUP,
    HEADER_DLQ_OFFSET,
    HEADER_DLQ_PARTITION,
    HEADER_DLQ_REASON,
    HEADER_DLQ_TOPIC,
)
from reminder_pipeline.messaging.kafka import KafkaPublisher, ensure_topic

from .. import support
from .lane import (
    Lane,
    RecordingSink,
    a_payload,
    committed,
    headers_of,
    read_topic,
    wait_until,
    warnings_in,
)

# -- acceptance criteria -------------------------------------------------------------------------


def test_appointment_reminder_goes_to_owner_and_client_with_the_local_time(
    engine: Engine, publisher: KafkaPublisher, kafka_settings: KafkaSettings, tmp_path: Path
) -> None:
    """Contract: Origin = Appointment, offset 60 fires → AppointmentReminder to owner and client."""
    owner, client, appointment = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    event_id = support.make_due_event(
        engine,
        offsets=(60,),
        kind="Consultation",
        origin="Appointment",
        appointment_id=appointment,
        owner_user_id=owner,
        client_user_id=client,
        time_zone="Asia/Yekaterinburg",
    )
    (reminder,) = support.reminders(engine, event_id)
    report = run_cycle(engine, publisher)
    assert report.counts.published >= 1

    sink = RecordingSink([reminder["id"]], expect=2)
    lane = Lane(
        kafka_settings,
        contract.TOPIC,
        f"test.dlq.{uuid.uuid4().hex[:10]}",
        f"test-notifications-{uuid.uuid4().hex[:8]}",
        tmp_path / "dedup.sqlite3",
    )
    ensure_topic(kafka_settings, topic=lane.dlq_topic)
    lane.run(sink)

    start_at = support.event_row(engine, event_id)["start_at"]
    local = start_at.astimezone(ZoneInfo("Asia/Yekaterinburg"))
    assert sorted((n.kind, n.recipient_user_id) for n in sink.delivered) == sorted(
        [
            (NotificationKind.APPOINTMENT_REMINDER, owner),
            (NotificationKind.APPOINTMENT_REMINDER, client),
        ]
    )
    for n in sink.delivered:
        assert n.appointment_id == appointment and n.local_start == local
        assert n.text == (
            f"Consultation starts in an hour, at {local:%Y-%m-%d %H:%M} (Asia/Yekaterinburg)"
        )


def test_owner_only_task_reminder_goes_to_the_owner_only(lane: Lane) -> None:
    """Contract: a Task without a client fires → CalendarReminder to the owner only."""
    message = a_payload(Kind="Task", OffsetMinutes=15)
    lane.produce(message)
    sink = RecordingSink()
    consumer = lane.run(sink, max_messages=1)

    (notification,) = sink.delivered
    assert notification.kind is NotificationKind.CALENDAR_REMINDER
    assert str(notification.recipient_user_id) == message["OwnerUserId"]
    assert notification.text.startswith("Task starts in 15 minutes, at ")
    assert consumer.stats.notifications == 1


def test_the_same_reminder_delivered_twice_notifies_once_also_after_a_restart(lane: Lane) -> None:
    """Contract: one ReminderId delivered twice → one reminder; the dedup survives a restart."""
    message = a_payload(ClientUserId=str(uuid.uuid4()))
    lane.produce(message)
    lane.produce(message)
    first = RecordingSink()
    consumer = lane.run(first, max_messages=2)
    assert sorted(n.recipient_role for n in first.delivered) == ["client", "owner"]
    assert consumer.stats.duplicates == 1

    # A third copy after a restart of the consumer (same group, same dedup file): the group
    # resumes after the committed offset and the durable store recognises the reminder.
    lane.produce(message)
    second = RecordingSink()
    consumer = lane.run(second, max_messages=1)
    assert second.delivered == []
    assert (consumer.stats.messages, consumer.stats.duplicates) == (1, 1)
    assert sum(committed(lane.kafka, lane.group_id, lane.topic).values()) == 3


def test_offsets_1440_and_60_give_two_notifications_with_different_horizons(
    engine: Engine, publisher: KafkaPublisher, kafka_settings: KafkaSettings, tmp_path: Path
) -> None:
    """Contract: offsets {1440, 60} both fire → two messages, two reminders, different horizons."""
    now = support.utcnow()
    event_id = support.make_event(
        engine,
        start_at=now + timedelta(minutes=30),
        offsets=(1440, 60),
        now=now - timedelta(days=2),
    )
    rows = support.reminders(engine, event_id)
    assert len(rows) == 2
    run_cycle(engine, publisher)

    sink = RecordingSink([r["id"] for r in rows], expect=2)
    lane = Lane(
        kafka_settings,
        contract.TOPIC,
        f"test.dlq.{uuid.uuid4().hex[:10]}",
        f"test-notifications-{uuid.uuid4().hex[:8]}",
        tmp_path / "dedup.sqlite3",
    )
    ensure_topic(kafka_settings, topic=lane.dlq_topic)
    lane.run(sink)

    # One per row, in the order they became due (same key, same partition).
    assert sink.reminder_ids() == [str(r["id"]) for r in rows]
    assert [n.horizon for n in sink.delivered] == ["in a day", "in an hour"]


def test_a_message_without_a_required_field_goes_to_the_dlq_and_the_rest_flow(lane: Lane) -> None:
    """Contract: a message without a required field fails repeatedly → DLQ; the others go on."""
    event_id = str(uuid.uuid4())
    before = a_payload(EventId=event_id)
    broken = a_payload(EventId=event_id, OffsetMinutes=...)
    after = a_payload(EventId=event_id)
    wrong_type = a_payload(EventId=event_id, OffsetMinutes="60")
    for message in (before, broken, after, wrong_type):
        lane.produce(message)
    lane.produce(b"\x00not json", key=event_id, headers=contract.headers("", None))

    sink = RecordingSink()
    consumer = lane.run(sink, max_messages=5, max_attempts=3)

    assert sink.reminder_ids() == [before["ReminderId"], after["ReminderId"]]
    assert consumer.stats.dead_lettered == 3
    dead = read_topic(lane.kafka, lane.dlq_topic, 3)
    by_reason: dict[str, list[Any]] = {}
    for message in dead:
        by_reason.setdefault(headers_of(message)[HEADER_DLQ_REASON], []).append(message)
    assert sorted((r, len(m)) for r, m in by_reason.items()) == [
        ("incompatible", 2),
        ("unparseable", 1),
    ]
    missing = next(
        m
        for m in by_reason["incompatible"]
        if json.loads(m.value()).get("ReminderId") == broken["ReminderId"]
    )
    headers = headers_of(missing)
    assert "OffsetMinutes" in headers[HEADER_DLQ_ERROR]
    assert headers[HEADER_DLQ_ATTEMPTS] == "3"
    assert headers[HEADER_DLQ_TOPIC] == lane.topic
    assert headers[HEADER_DLQ_GROUP] == lane.group_id
    assert headers[contract.HEADER_REMINDER_ID] == broken["ReminderId"]  # original headers kept
    assert json.loads(missing.value()) == broken and missing.key().decode() == event_id
    # The original position is named, and the group committed past every message (one key,
    # so one partition: the dead letters did not block the reminder behind them).
    assert int(headers[HEADER_DLQ_OFFSET]) == 1
    assert committed(lane.kafka, lane.group_id, lane.topic) == {
        int(headers[HEADER_DLQ_PARTITION]): 5
    }


def test_an_unknown_kind_gets_the_neutral_text_and_a_warning(
    lane: Lane, caplog: pytest.LogCaptureFixture
) -> None:
    """Contract: an unknown Kind → neutral text, a warning, never a failure."""
    caplog.set_level(logging.INFO, logger="reminder_pipeline")
    message = a_payload(Kind="Webinar")
    lane.produce(message)
    sink = RecordingSink()
    lane.run(sink, max_messages=1)

    (notification,) = sink.delivered
    assert notification.text.startswith("A calendar event starts soon")
    (warning,) = warnings_in(caplog, "unknown Kind")
    assert warning["reminder_id"] == message["ReminderId"] and warning["kind"] == "Webinar"


def test_a_contract_version_mismatch_warns_and_is_processed(
    lane: Lane, caplog: pytest.LogCaptureFixture
) -> None:
    """Contract: a ContractVersion other than 1 → a warning, and processing goes on."""
    caplog.set_level(logging.INFO, logger="reminder_pipeline")
    message = a_payload(Priority="high")  # an additive field a newer producer might send
    headers = {
        **contract.headers(message["ReminderId"], None),
        contract.HEADER_CONTRACT_VERSION: "2",
    }
    lane.produce(message, headers=headers)
    sink = RecordingSink()
    lane.run(sink, max_messages=1)

    assert sink.reminder_ids() == [message["ReminderId"]]
    (warning,) = warnings_in(caplog, "contract version mismatch")
    assert warning["contract_version"] == "2" and warning["reminder_id"] == message["ReminderId"]


def test_a_transient_sink_failure_is_retried_and_the_message_is_not_skipped(lane: Lane) -> None:
    """Contract: a transient failure is retried with back-off; the partition never moves past it."""
    event_id = str(uuid.uuid4())
    held = [a_payload(EventId=event_id, OffsetMinutes=m) for m in (1440, 60, 15)]
    other = a_payload()
    for message in held:
        lane.produce(message, partition=0)
    lane.produce(other, partition=1)
    first_id = held[0]["ReminderId"]

    # Run 1: the gateway is down for the first reminder; stop once it has been tried 4 times.
    sink = RecordingSink(fail={first_id: 10**6})
    stopper = threading.Thread(
        target=lambda: wait_until(lambda: sink.attempts[first_id] >= 4, then=sink.stop.set),
        daemon=True,
    )
    stopper.start()
    consumer = lane.run(sink)
    stopper.join()
    assert sink.reminder_ids() == [other["ReminderId"]]  # other partitions kept flowing
    gaps = [
        b - a
        for a, b in zip(
            sink.attempt_times[first_id], sink.attempt_times[first_id][1:], strict=False
        )
    ]
    assert gaps[-1] > gaps[0]  # back-off grows
    assert consumer.stats.retries >= 3
    assert committed(lane.kafka, lane.group_id, lane.topic).get(0, -1) < 1

    # Run 2 (a restart): the held reminder comes back, fails once more, then all three go in order.
    sink = RecordingSink(fail={first_id: 1})
    consumer = lane.run(sink, max_messages=3)
    assert sink.reminder_ids() == [m["ReminderId"] for m in held]
    assert sink.attempts[first_id] == 2
    assert committed(lane.kafka, lane.group_id, lane.topic)[0] == 3


# -- the CLI's entry function --------------------------------------------------------------------


def _settings(lane: Lane, home: Path) -> Settings:
    return Settings.from_env(
        {
            "KAFKA_BOOTSTRAP_SERVERS": lane.kafka.bootstrap_servers,
            "REMINDER_PIPELINE_HOME": str(home),
        }
    )


def test_consume_main_once_prints_one_line_per_notification(
    lane: Lane, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``reminder-pipeline consume --once``: one stdout line per notification, ids and local time."""
    message = a_payload(
        Kind="Showing", ClientUserId=str(uuid.uuid4()), AppointmentId=str(uuid.uuid4())
    )
    lane.produce(message)
    code = consume_main(
        _settings(lane, tmp_path / "home"),
        group_id=lane.group_id,
        once=True,
        options=lane.options(once_idle_seconds=1.0),
    )
    assert code == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line]
    assert len(lines) == 2
    for line, role in zip(lines, ("owner", "client"), strict=False):
        assert line.startswith(f"AppointmentReminder to {role} ")
        assert (
            f"reminder={message['ReminderId']}" in line
            and "Property showing starts in an hour" in line
        )
    # The dedup file lives under REMINDER_PIPELINE_HOME, one per group.
    assert list((tmp_path / "home" / "notifications").glob("*.dedup.sqlite3"))


def test_consume_main_stops_cleanly_on_sigterm(lane: Lane, tmp_path: Path) -> None:
    """SIGTERM ends the loop, leaves the group and returns 0 (what a process manager sends)."""
    message = a_payload()
    lane.produce(message)
    dedup_path = tmp_path / "dedup.sqlite3"

    def handled() -> bool:
        if not dedup_path.exists():
            return False
        with sqlite3.connect(dedup_path) as conn:
            try:
                return conn.execute("SELECT count(*) FROM reminders").fetchone()[0] >= 1
            except sqlite3.OperationalError:
                return False

    stop = threading.Event()  # the fallback, so a missing handler fails the test, not the run
    signalled: list[bool] = []

    def terminate() -> None:
        # Only once our handler is in place: the default one would end the test run.
        if signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, signal.SIG_IGN, None):
            signalled.append(True)
            os.kill(os.getpid(), signal.SIGTERM)
        else:
            stop.set()

    killer = threading.Thread(target=lambda: wait_until(handled, then=terminate), daemon=True)
    killer.start()
    previous = signal.getsignal(signal.SIGTERM)
    code = consume_main(
        _settings(lane, tmp_path / "home"),
        group_id=lane.group_id,
        dedup_path=dedup_path,
        stop=stop,
        options=lane.options(),
    )
    killer.join()
    assert code == 0 and signalled == [True] and handled()
    assert signal.getsignal(signal.SIGTERM) == previous
