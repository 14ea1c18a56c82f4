"""A locked row's verdict (send, send with the fallback zone, skip, poison) and its headers.

The cycle reads each due row once, under its lock, with the payload the database built from it
(``store/queries._PAYLOAD``, the one implementation of the message); :func:`verdict` decides
on that row what the batch's one write does with it (docs/design.md, "One route for a batch"):
skip when its event is not live (:func:`~reminder_pipeline.domain.transitions.action_for`),
else send its payload, with the fallback zone when the event's zone is not canonical, unless the
payload breaks the contract (:func:`~reminder_pipeline.domain.contract.validate`): then the row
is poison, left Pending with a back-off. Each of these rules is written here once; the tests'
oracle (``reminder_pipeline_tests/oracle.py``) describes the whole in plain Python and a property
test holds the cycle to it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from . import contract, time_zones
from .model import Action
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
    """A row's verdict; the payload to send when it is not the one read (a fallback zone's), or
    why the row is poison (one line)."""

    verdict: Verdict
    payload: dict[str, Any] | None = None
    error: str | None = None


SKIP = RowVerdict(Verdict.SKIP)
#: A send of the payload as read (a verdict given to most rows of a batch: one object for all).
SEND = RowVerdict(Verdict.SEND)


def verdict(event_status: str | None, payload: object) -> RowVerdict:
    """The verdict on a row read under its lock: its event's status and the payload built from it
    (the parsed JSON; a fallback zone is set in a copy, the verdict's payload)."""
    if action_for(event_status) is Action.SKIP:
        return SKIP
    if not isinstance(payload, dict):
        return RowVerdict(Verdict.POISON, error="breaks the contract: payload: is not an object")
    canonical = time_zones.is_canonical(payload.get("TimeZone"))
    if not canonical:
        payload = {**payload, "TimeZone": time_zones.FALLBACK_ZONE}
    try:
        contract.validate(payload)
    except contract.ContractViolation as violation:
        return RowVerdict(Verdict.POISON, error=f"breaks the contract: {violation}")
    return SEND if canonical else RowVerdict(Verdict.SEND_FALLBACK_ZONE, payload)


def message_headers(
    reminder_id: str, run_id: str | None, trace: Mapping[str, str]
) -> dict[str, str]:
    """The headers stored with a row's outbox message: the contract's, then the trace context
    (the cycle span's W3C context: whenever the relay publishes it a consumer continues the
    cycle's trace)."""
    return {**contract.headers(reminder_id, run_id), **trace}
