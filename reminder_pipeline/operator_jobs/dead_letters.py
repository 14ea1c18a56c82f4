"""Dead letters for operators: list them with why and whence, replay them once the cause is fixed.

The calls behind ``reminder-pipeline dlq list|replay``. A replay puts the original key, value and
headers back on the contract's topic with a header naming the dead letter it came from; the
consumer's de-duplication by ReminderId makes replaying something already delivered harmless. A
copy cut to fit is refused: its original is not in it. The real replay is in the audit trail
(:mod:`reminder_pipeline.audit`): who, which dead letters before it acts, how many after.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from ..audit import audited
from ..config import KafkaSettings
from ..domain import contract
from ..messaging import dead_letters
from ..messaging.dead_letters import DLQ_TOPIC, DeadLetter


class NoSuchDeadLetter(LookupError):
    """The position names no record of the dead-letter topic."""


@dataclass(frozen=True)
class ReplayPlan:
    """Which dead letters a replay sends back, which it refuses and why (one line each)."""

    target: str
    replay: list[DeadLetter]
    refused: list[tuple[DeadLetter, str]] = field(default_factory=list)
    replayed: int = 0
    dry_run: bool = True

    def plain(self) -> dict[str, Any]:
        """As builtins (``--json``)."""
        return {
            "target": self.target,
            "dry_run": self.dry_run,
            "replay": [letter.position for letter in self.replay],
            "replayed": self.replayed,
            "refused": [{"position": d.position, "reason": why} for d, why in self.refused],
        }


def parse_position(text: str) -> tuple[int, int]:
    """``partition:offset`` as two numbers; ValueError naming the expected form otherwise."""
    partition, sep, offset = text.strip().partition(":")
    if not sep or not partition.isdigit() or not offset.isdigit():
        raise ValueError(f"{text!r} is not PARTITION:OFFSET (e.g. 0:12)")
    return int(partition), int(offset)


def list_letters(kafka: KafkaSettings, dlq_topic: str = DLQ_TOPIC) -> list[dict[str, Any]]:
    """Every dead letter, by position: the original's topic, partition, offset and key, the
    reason and attempts, its size and whether it was cut to fit."""
    return [letter.plain() for letter in dead_letters.read_dead_letters(kafka, dlq_topic)]


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
    if position is not None:
        wanted = parse_position(position)
        letters = [d for d in letters if (d.dlq_partition, d.dlq_offset) == wanted]
        if not letters:
            raise NoSuchDeadLetter(f"no dead letter at {position} in {dlq_topic}")
    target = position or "all"
    replay, refused = [], []
    for letter in letters:
        why = refusal(letter)
        if why is None:
            replay.append(letter)
        else:
            refused.append((letter, why))
    return ReplayPlan(target, replay, refused)


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
    first message is produced and with the count after."""
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
    ) as outcome:
        sent = dead_letters.replay(kafka, planned.replay, topic, dlq_topic)
        outcome.fields["replayed"] = sent
    return ReplayPlan(planned.target, planned.replay, planned.refused, sent, dry_run=False)
