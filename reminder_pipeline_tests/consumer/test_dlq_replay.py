"""Dead letters read and sent back through the real broker, with the real consumer behind them.

A message the sink refuses for good is dead-lettered by the reference consumer; ``dlq list``
reads it back with why and whence; a dry run sends nothing; a replay puts the original key, value
and headers back on the topic (read back from the broker) marked as a replay, the consumer
notifies it once, and replaying it again is dropped by the consumer's de-duplication. A copy cut
to fit is refused with one line. The command line's refusals and exit codes run as an operator
would run them, on the contract's dead-letter topic.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Producer

from reminder_pipeline.config import KafkaSettings
from reminder_pipeline.consumer import DeliveryRejected, Notification
from reminder_pipeline.consumer.dead_letter_copy import dead_letter_copy
from reminder_pipeline.consumer.metrics import MESSAGES
from reminder_pipeline.domain import contract
from reminder_pipeline.messaging.dead_letters import (
    DLQ_TOPIC,
    HEADER_DLQ_PARTITION,
    HEADER_DLQ_REASON,
    HEADER_DLQ_TOPIC,
    HEADER_REPLAY_OF,
    DeadLetter,
    read_dead_letters,
)
from reminder_pipeline.messaging.kafka import ensure_topic
from reminder_pipeline.operator_jobs import dead_letters

from ..support import error_lines, run_cli
from .lane import Lane, RecordingSink, a_payload


@pytest.fixture
def cli_env(kafka_settings: KafkaSettings, tmp_path: Path) -> dict[str, str]:
    """The broker alone: ``dlq`` needs no database."""
    return {
        "KAFKA_BOOTSTRAP_SERVERS": kafka_settings.bootstrap_servers,
        "REMINDER_PIPELINE_HOME": str(tmp_path / "home"),
    }


class RejectingSink(RecordingSink):
    """Refuses every notification for good (the channel will never accept it)."""

    def deliver(self, notification: Notification) -> None:
        self.attempts[str(notification.reminder_id)] += 1
        raise DeliveryRejected("recipient refused by the channel")


def test_a_dead_letter_is_listed_replayed_once_and_a_second_replay_is_a_duplicate(
    lane: Lane,
) -> None:
    message = a_payload()
    rid = message["ReminderId"]
    lane.produce(message)
    lane.run(RejectingSink(), max_messages=1)

    [listed] = dead_letters.list_letters(lane.kafka, lane.dlq_topic)
    [original] = read_dead_letters(lane.kafka, lane.topic)  # any topic reads back the same way
    assert listed["reason"] == "delivery-rejected" and listed["attempts"] == 1
    assert (listed["topic"], listed["partition"], listed["offset"]) == (
        lane.topic,
        original.dlq_partition,
        original.dlq_offset,
    )
    assert listed["key"] == message["EventId"] and listed["reminder_id"] == rid
    assert listed["size"] == len(original.value or b"") and listed["truncated"] is False
    position = f"{listed['dlq_partition']}:{listed['dlq_offset']}"

    def replay(dry_run: bool) -> dead_letters.ReplayPlan:
        return dead_letters.replay(
            lane.kafka,
            position,
            actor="test",
            dry_run=dry_run,
            topic=lane.topic,
            dlq_topic=lane.dlq_topic,
        )

    planned = replay(dry_run=True)
    assert [d.position for d in planned.replay] == [position] and planned.replayed == 0
    assert len(read_dead_letters(lane.kafka, lane.topic)) == 1  # the dry run sent nothing

    assert replay(dry_run=False).replayed == 1
    on_topic = read_dead_letters(lane.kafka, lane.topic)
    assert len(on_topic) == 2
    again = on_topic[-1] if on_topic[-1].dlq_offset > original.dlq_offset else on_topic[0]
    assert (again.key, again.value) == (original.key, original.value)
    assert again.dlq_partition == original.dlq_partition  # same key, same partition
    assert again.headers == [
        *original.headers,
        (HEADER_REPLAY_OF, f"{lane.dlq_topic}:{position}".encode()),
    ]

    sink = RecordingSink()
    lane.run(sink, max_messages=1)
    assert sink.reminder_ids() == [rid]  # the fixed consumer notifies the replay once

    assert replay(dry_run=False).replayed == 1
    second = RecordingSink()
    consumer = lane.run(second, max_messages=1)
    assert second.reminder_ids() == []  # already delivered: the de-dup drops it
    assert consumer.metrics.registry.get_sample_value(MESSAGES, {"outcome": "duplicate"}) == 1


def test_a_copy_cut_to_fit_is_refused_for_replay_and_nothing_is_sent(lane: Lane) -> None:
    lane.produce(b"x" * 20_000, key="not-json")  # unparseable, and too big for its copy
    lane.run(RecordingSink(), max_messages=1, max_attempts=1, dlq_max_bytes=8_192)

    [listed] = dead_letters.list_letters(lane.kafka, lane.dlq_topic)
    assert listed["reason"] == "unparseable" and listed["size"] == 20_000
    assert listed["truncated"] is True and listed["cut"] == ["value"]
    done = dead_letters.replay(
        lane.kafka, None, actor="test", dry_run=False, topic=lane.topic, dlq_topic=lane.dlq_topic
    )
    assert done.replay == [] and done.replayed == 0
    [(_, why)] = done.refused
    assert "cut to fit" in why and "\n" not in why
    assert len(read_dead_letters(lane.kafka, lane.topic)) == 1  # only the original


def _cut_copy_on_the_contract_dlq(kafka: KafkaSettings) -> tuple[str, str]:
    """A whole and a cut dead letter on the contract's DLQ topic: their positions."""
    ensure_topic(kafka, topic=DLQ_TOPIC)
    producer = Producer({**kafka.client_config(), "enable.idempotence": True})
    positions: list[str] = []
    for max_bytes, value in ((1_000_000, b"{}"), (4_096, b"y" * 10_000)):
        origin = [
            (HEADER_DLQ_REASON, b"unparseable"),
            (HEADER_DLQ_TOPIC, contract.TOPIC.encode()),
            (HEADER_DLQ_PARTITION, b"0"),
        ]
        copy = dead_letter_copy(uuid.uuid4().hex.encode(), value, [], origin, max_bytes)
        producer.produce(
            DLQ_TOPIC,
            key=copy.key,
            value=copy.value,
            headers=copy.headers,
            on_delivery=lambda err, msg: positions.append(f"{msg.partition()}:{msg.offset()}"),
        )
        assert producer.flush(30) == 0
    return positions[0], positions[1]


def test_the_command_line_lists_refuses_and_dry_runs(
    kafka_settings: KafkaSettings, cli_env: dict[str, str]
) -> None:
    whole, cut = _cut_copy_on_the_contract_dlq(kafka_settings)

    listed = run_cli("dlq", "list", "--json", env=cli_env)
    assert listed.returncode == 0, listed.stderr
    by_position = {
        f"{d['dlq_partition']}:{d['dlq_offset']}": d
        for d in json.loads(listed.stdout)["dead_letters"]
    }
    assert by_position[whole]["truncated"] is False and by_position[cut]["truncated"] is True
    assert run_cli("dlq", "list", env=cli_env).stdout.startswith("position")

    refused = run_cli("dlq", "replay", cut, env=cli_env)
    assert refused.returncode == 1
    assert refused.stderr.strip().splitlines() == [
        f"reminder-pipeline: error: dlq replay: dead letter {cut} was cut to fit (value cut): its "
        "original is not in it, so it cannot be replayed"
    ]
    before = len(read_dead_letters(kafka_settings, contract.TOPIC))
    dry = run_cli("dlq", "replay", whole, "--dry-run", "--json", env=cli_env)
    assert dry.returncode == 0, dry.stderr
    assert json.loads(dry.stdout)["replay"] == [whole] and json.loads(dry.stdout)["replayed"] == 0
    assert len(read_dead_letters(kafka_settings, contract.TOPIC)) == before

    for args, code, text in (
        ((), 2, "name one dead letter as PARTITION:OFFSET, or give --all"),
        ((whole, "--all"), 2, "name one dead letter as PARTITION:OFFSET, or give --all"),
        (("--all",), 2, "add --yes"),
        (("0:x",), 2, "is not PARTITION:OFFSET"),
        (("0:999999999",), 1, f"no dead letter at 0:999999999 in {DLQ_TOPIC}"),
    ):
        result = run_cli("dlq", "replay", *args, env=cli_env)
        assert result.returncode == code, (args, result.stderr)
        assert text in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert len(read_dead_letters(kafka_settings, contract.TOPIC)) == before


# --- a replay is idempotent per dead letter (issue 35) -------------------------------------------


def _replay_all(lane: Lane, dry_run: bool = False) -> dead_letters.ReplayPlan:
    return dead_letters.replay(
        lane.kafka, None, actor="test", dry_run=dry_run, topic=lane.topic, dlq_topic=lane.dlq_topic
    )


def _replay_headers(message: DeadLetter) -> list[str]:
    return [
        (v or b"").decode() if isinstance(v, bytes) else str(v)
        for n, v in message.headers
        if n == HEADER_REPLAY_OF
    ]


def test_replay_all_sends_each_dead_letter_once_and_leaves_out_dead_letters_of_replays(
    lane: Lane,
) -> None:
    """The attack's run: --all three times put 8 -> 14 -> 26 -> 50 records on the dead-letter
    topic. Now the second --all sends nothing; the replays that fail again are dead letters of
    replays, left out by --all, still replayable by position with one replay-of-dlq header."""
    first, second = a_payload(), a_payload()
    lane.produce(first)
    lane.produce(second)
    lane.run(RejectingSink(), max_messages=2)
    originals = {d.position: d for d in read_dead_letters(lane.kafka, lane.dlq_topic)}
    assert len(originals) == 2

    done = _replay_all(lane)
    assert done.replayed == 2 and done.skipped == [] and done.refused == []
    on_topic = read_dead_letters(lane.kafka, lane.topic)
    assert len(on_topic) == 4
    replayed = [m for m in on_topic if _replay_headers(m)]
    assert sorted(h for m in replayed for h in _replay_headers(m)) == sorted(
        f"{lane.dlq_topic}:{p}" for p in originals
    )

    again = _replay_all(lane)
    assert again.replayed == 0 and again.replay == []
    assert sorted(d.position for d, _ in again.skipped) == sorted(originals)
    assert all("was replayed at" in why and "\n" not in why for _, why in again.skipped)
    assert len(read_dead_letters(lane.kafka, lane.topic)) == 4  # nothing more on the topic

    lane.run(RejectingSink(), max_messages=2)  # the fix did not help: both fail again
    listed = {
        f"{d['dlq_partition']}:{d['dlq_offset']}": d
        for d in dead_letters.list_letters(lane.kafka, lane.dlq_topic)
    }
    assert len(listed) == 4
    for position in originals:
        assert listed[position]["replays"] == 1 and listed[position]["replayed_by"] == "test"
        assert listed[position]["replayed_at"] and listed[position]["replay_of"] is None
    of_replays = {p: d for p, d in listed.items() if p not in originals}
    assert sorted(d["replay_of"] for d in of_replays.values()) == sorted(
        f"{lane.dlq_topic}:{p}" for p in originals
    )
    assert all(d["replayed_at"] is None and d["replays"] == 0 for d in of_replays.values())

    third = _replay_all(lane)
    assert third.replayed == 0 and len(third.skipped) == 4
    assert sum("is a replay of" in why for _, why in third.skipped) == 2
    assert len(read_dead_letters(lane.kafka, lane.topic)) == 4
    assert len(read_dead_letters(lane.kafka, lane.dlq_topic)) == 4

    position, letter = sorted(of_replays.items())[0]
    by_position = dead_letters.replay(
        lane.kafka,
        position,
        actor="test",
        dry_run=False,
        topic=lane.topic,
        dlq_topic=lane.dlq_topic,
    )
    assert by_position.replayed == 1
    everything = read_dead_letters(lane.kafka, lane.topic)
    assert len(everything) == 5
    # The first replay and this one, one header each naming the original dead letter (the
    # attack saw four piled up on a message replayed again and again).
    assert [len(_replay_headers(m)) for m in everything if _replay_headers(m)] == [1, 1, 1]
    assert len([m for m in everything if _replay_headers(m) == [letter["replay_of"]]]) == 2
    relisted = {
        f"{d['dlq_partition']}:{d['dlq_offset']}": d
        for d in dead_letters.list_letters(lane.kafka, lane.dlq_topic)
    }
    assert relisted[position]["replays"] == 1 and relisted[position]["replayed_at"]


#: ``reminder-pipeline`` with ``dlq replay``'s topics moved to a lane's (its first two arguments).
_ON_LANE = (
    "import functools, sys\n"
    "from reminder_pipeline.operator_jobs import dead_letters as d\n"
    "d.replay = functools.partial(d.replay, topic=sys.argv.pop(1), dlq_topic=sys.argv.pop(1))\n"
    "from reminder_pipeline.cli import main\n"
    "sys.exit(main(sys.argv[1:]))\n"
)


def test_a_cut_copy_does_not_make_every_later_replay_all_fail(
    lane: Lane, cli_env: dict[str, str]
) -> None:
    """--all exits 0 when everything that can go went out, listing what it left out and why;
    the second --all sends nothing. (A cut copy made every --all exit 1 though the rest went.)"""
    lane.produce(b"x" * 20_000, key="not-json")
    lane.run(RecordingSink(), max_messages=1, max_attempts=1, dlq_max_bytes=8_192)
    lane.produce(a_payload())
    lane.run(RejectingSink(), max_messages=1)
    [cut] = [d.position for d in read_dead_letters(lane.kafka, lane.dlq_topic) if d.cut]
    [whole] = [d.position for d in read_dead_letters(lane.kafka, lane.dlq_topic) if not d.cut]
    command = [sys.executable, "-c", _ON_LANE, lane.topic, lane.dlq_topic]

    def replay_all(*more: str) -> subprocess.CompletedProcess[str]:
        return run_cli("dlq", "replay", "--all", "--yes", *more, env=cli_env, command=command)

    first = replay_all()
    assert first.returncode == 0, first.stderr
    assert first.stdout.splitlines() == [
        f"dlq replay: replayed 1 ({whole})",
        f"dlq replay: left out: dead letter {cut} was cut to fit (value cut): its original is "
        "not in it, so it cannot be replayed",
    ]
    assert error_lines(first) == []
    assert len(read_dead_letters(lane.kafka, lane.topic)) == 3

    second = replay_all("--json")
    assert second.returncode == 0, second.stderr
    plain = json.loads(second.stdout)
    assert (plain["replay"], plain["replayed"]) == ([], 0)
    assert [r["position"] for r in plain["skipped"]] == [whole]
    assert [r["position"] for r in plain["refused"]] == [cut]
    assert len(read_dead_letters(lane.kafka, lane.topic)) == 3  # nothing more on the topic

    named = run_cli("dlq", "replay", cut, env=cli_env, command=command)
    assert named.returncode == 1 and len(error_lines(named)) == 1
