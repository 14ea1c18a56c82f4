"""A locked row's verdict (send, send with the fallback zone, skip, poison) and its headers.

The cycle reads each due row once, under its lock; :func:`verdict` decides on that row what the
batch's one write does with it (docs/design.md, "One route for a batch"): skip when its event is
not live (:func:`~reminder_pipeline.domain.transitions.action_for`), else send its message
(:mod:`.payload`, built here, in Python, once), with the fallback zone when the event's zone is
not canonical, unless it breaks the contract (:func:`~reminder_pipeline.domain.contract.validate`):
then the row is poison, left Pending with a back-off. Each of these rules is written here once;
the tests' oracle (``reminder_pipeline_tests/oracle.py``) describes the whole in plain Python and
a property test holds the cycle to it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from . import contract, payload, time_zones
from .model import Action, DueReminder
from .transitions import action_for


class Verdict(StrEnum):
    """What a batch's write does with one locked row."""

    SEND = "send"
    #: Sent with :data:`~reminder_pipeline.domain.time_zones.FALLBACK_ZONE` (a zone that is not
    #: canonical never holds a reminder back; counted and logged).
    SEND_FALLBACK_ZONE = "send with the fallback zone"
    SKIP = "skip"
    #: Left Pending with a back-off: its message breaks the contract (or the database refused it).
    POISON = "poison"


@dataclass(frozen=True, slots=True)
class RowVerdict:
    """A row's verdict: for a send, its message as the outbox stores it (``text``); for a poison
    row, why (one line)."""

    verdict: Verdict
    text: str | None = None
    error: str | None = None


SKIP = RowVerdict(Verdict.SKIP)


def verdict(row: DueReminder) -> RowVerdict:
    """The verdict on a row read under its lock: skip unless its event is live; else its message
    (:mod:`.payload`), with the fallback zone when the event's is not canonical, unless it breaks
    the contract (poison)."""
    if action_for(row.event_status) is Action.SKIP:
        return SKIP
    message = payload.build(row)
    canonical = time_zones.is_canonical(message["TimeZone"])
    if not canonical:
        message["TimeZone"] = time_zones.FALLBACK_ZONE
    try:
        contract.validate(message)
    except contract.ContractViolation as violation:
        return RowVerdict(Verdict.POISON, error=f"breaks the contract: {violation}")
    return RowVerdict(
        Verdict.SEND if canonical else Verdict.SEND_FALLBACK_ZONE, payload.text(message)
    )


def message_headers(
    reminder_id: str, run_id: str | None, trace: Mapping[str, str]
) -> dict[str, str]:
    """The headers stored with a row's outbox message: the contract's, then the trace context
    (the cycle span's W3C context: whenever the relay publishes it a consumer continues the
    cycle's trace)."""
    return {**contract.headers(reminder_id, run_id), **trace}
