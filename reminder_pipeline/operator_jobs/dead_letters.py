"""Dead letters for operators: list them with why and whence, replay them once the cause is fixed.

The calls behind ``reminder-pipeline dlq list|replay``. A replay puts the original key, value and
headers back on the contract's topic with one header naming the dead letter it came from; the
consumer's de-duplication by ReminderId makes replaying something already delivered harmless. A
copy cut to fit is refused: its original is not in it. Each dead letter sent back is recorded
(:mod:`reminder_pipeline.messaging.dlq_replays`), so a replay of every dead letter is idempotent:
it leaves out those already replayed and the dead letters of replays (their message failed again
after a replay: sending it once more needs a person's decision), both still replayable by their
position. The real replay is in the audit trail (:mod:`reminder_pipeline.audit`): who, which dead
letters before it acts, how many after.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from ..audit import audited
from ..config import KafkaSettings
from ..domain import contract
from ..messaging import dead_letters, dlq_replays
from ..messaging.dead_letters import DLQ_TOPIC, DeadLetter
from ..messaging.dlq_replays import Replayed


class NoSuchDeadLetter(LookupError):
    """The position names no record of the dead-letter topic."""


@dataclass(frozen=True)
class ReplayPlan:
    """Which dead letters a replay sends back, which it refuses (cut to fit: never replayable)
    and which ``--all`` leaves out (replayed before, dead letters of replays), and why (one line
    each)."""

    target: str
    replay: list[DeadLetter]
    refused: list[tuple[DeadLetter, str]] = field(default_factory=list)
    replayed: int = 0
    dry_run: bool = True
    skipped: list[tuple[DeadLetter, str]] = field(default_factory=list)

    def plain(self) -> dict[str, Any]:
        """As builtins (``--json``)."""
        return {
            "target": self.target,
            "dry_run": self.dry_run,
            "replay": [letter.position for letter in self.replay],
            "replayed": self.replayed,
            "refused": [{"position": d.position, "reason": why} for d, why in self.refused],
            "skipped": [{"position": d.position, "reason": why} for d, why in self.skipped],
        }


def parse_position(text: str) -> tuple[int, int]:
    """``partition:offset`` as two numbers; ValueError naming the expected form otherwise."""
    partition, sep, offset = text.strip().partition(":")
    if not sep or not partition.isdigit() or not offset.isdigit():
        raise ValueError(f"{text!r} is not PARTITION:OFFSET (e.g. 0:12)")
    return int(partition), int(offset)


_NOT_REPLAYED = {"replayed_at": None, "replayed_by": None, "replays": 0}


def list_letters(kafka: KafkaSettings, dlq_topic: str = DLQ_TOPIC) -> list[dict[str, Any]]:
    """Every dead letter, by position: the original's topic, partition, offset and key, the
    reason and attempts, its size and whether it was cut to fit, when it was last replayed (by
    whom, how many times) and which dead letter's replay its message was (``replay_of``)."""
    replays = dlq_replays.read_replays(kafka, dlq_topic)
    return [
        {**letter.plain(), **_replayed(replays.get(_where(letter)))}
        for letter in dead_letters.read_dead_letters(kafka, dlq_topic)
    ]


def _where(letter: DeadLetter) -> tuple[int, int]:
    return letter.dlq_partition, letter.dlq_offset


def _replayed(record: Replayed | None) -> dict[str, Any]:
    return dict(_NOT_REPLAYED) if record is None else record.plain()


def left_out(letter: DeadLetter, record: Replayed | None) -> str | None:
    """Why a replay of every dead letter leaves ``letter`` out (one line), or None."""
    if record is not None:
        return (
            f"dead letter {letter.position} was replayed at {record.replayed_at} by "
            f"{record.replayed_by}; name it (dlq replay {letter.position}) to send it again"
        )
    if letter.replay_of is not None:
        return (
            f"dead letter {letter.position} is a replay of {letter.replay_of} that failed again; "
            f"name it (dlq replay {letter.position}) to send it again once the cause is fixed"
        )
    return None


def refusal(letter: DeadLetter) -> str | None:
    """Why ``letter`` cannot be replayed (one line), or None."""
    if letter.cut:
        return (
            f"dead letter {letter.position} was cut to fit ({','.join(letter.cut)} cut): its "
            "original is not in it, so it cannot be replayed"
        )
    return None


def plan(kafka: KafkaSettings, position: str | None, dlq_topic: str = DLQ_TOPIC) -> ReplayPlan:
    """What a replay of ``position`` (``partition:offset``; None: every dead letter) would do."""
    letters = dead_letters.read_dead_letters(kafka, dlq_topic)
    replays: dict[tuple[int, int], Replayed] = {}
    if position is not None:
        wanted = parse_position(position)
        letters = [d for d in letters if _where(d) == wanted]
        if not letters:
            raise NoSuchDeadLetter(f"no dead letter at {position} in {dlq_topic}")
    else:  # --all: once per dead letter
        replays = dlq_replays.read_replays(kafka, dlq_topic)
    target = position or "all"
    replay, refused, skipped = [], [], []
    for letter in letters:
        why = refusal(letter)
        if why is not None:
            refused.append((letter, why))
        elif position is None and (why := left_out(letter, replays.get(_where(letter)))):
            skipped.append((letter, why))
        else:
            replay.append(letter)
    return ReplayPlan(target, replay, refused, skipped=skipped)


def replay(
    kafka: KafkaSettings,
    position: str | None,
    *,
    actor: str,
    dry_run: bool,
    topic: str = contract.TOPIC,
    dlq_topic: str = DLQ_TOPIC,
) -> ReplayPlan:
    """Replay ``position`` (None: all) to ``topic``; a dry run only plans. Audited before the
    first message is produced and with the count after; each dead letter the broker took back
    is recorded as replayed (by ``actor``), even when others were not."""
    planned = plan(kafka, position, dlq_topic)
    if dry_run or not planned.replay:
        return replace(planned, dry_run=dry_run)
    with audited(
        "dead letters replay",
        operator=actor,
        action="dlq replay",
        dlq_topic=dlq_topic,
        topic=topic,
        target=planned.target,
        positions=[letter.position for letter in planned.replay][:100],
        count=len(planned.replay),
        refused=len(planned.refused),
        skipped=len(planned.skipped),
    ) as outcome:
        acked: list[DeadLetter] = []
        try:
            sent = dead_letters.replay_letters(kafka, planned.replay, topic, dlq_topic, sent=acked)
        finally:
            dlq_replays.record_replays(kafka, dlq_topic, acked, actor=actor, topic=topic)
        outcome.fields["replayed"] = sent
    return replace(planned, replayed=sent, dry_run=False)
