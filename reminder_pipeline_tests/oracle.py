"""The dispatcher's rules in plain Python: the test oracle the cycle is held to.

The cycle reads each due row under its lock and gives it a verdict and its message
(``domain/plan.verdict``, ``domain/payload.py``); nothing in a cycle runs what is here. This module describes the same rules once more, straight from the design and
the contract, so that the property tests (``integration/test_one_statement_batch.py``) can hold
the cycle to them: the decision (send for a live event, skip otherwise, an unknown status
included), the message (:func:`build_payload`), the fallback zone for a zone that is not
canonical, poison for a row whose message cannot be built or breaks the contract, and the
contract itself as the shipped JSON Schema reads it (:func:`validate_with_schema`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import cache
from typing import Any

from jsonschema import Draft202012Validator

from reminder_pipeline.domain import contract, time_zones
from reminder_pipeline.domain.model import (
    Action,
    DueReminder,
    PoisonRow,
    ReminderStatus,
)
from reminder_pipeline.domain.plan import message_headers
from reminder_pipeline.domain.transitions import LIVE_EVENT_STATUSES

#: The statuses whose reminders are sent: the code's own constant (the design's table test,
#: unit/test_domain.py, says which they are), so the oracle follows it when it changes.
SENDS = LIVE_EVENT_STATUSES


#: Every transition a reminder row may make; Sent and Skipped are terminal (INV-REM-2).
ALLOWED_TRANSITIONS: frozenset[tuple[ReminderStatus, ReminderStatus]] = frozenset(
    {
        (ReminderStatus.PENDING, ReminderStatus.SENT),
        (ReminderStatus.PENDING, ReminderStatus.SKIPPED),
    }
)


class TransitionError(ValueError):
    """A transition outside :data:`ALLOWED_TRANSITIONS` was requested."""


def check_transition(current: ReminderStatus | str, target: ReminderStatus | str) -> None:
    """Raise :class:`TransitionError` unless ``current -> target`` is allowed."""
    pair = (ReminderStatus(current), ReminderStatus(target))
    if pair not in ALLOWED_TRANSITIONS:
        raise TransitionError(f"reminder transition {pair[0]} -> {pair[1]} is not allowed")


@dataclass(frozen=True)
class Decision:
    """The outcome for one due row: send it, or skip it without publishing."""

    reminder: DueReminder
    action: Action

    @property
    def target_status(self) -> ReminderStatus:
        """The terminal status the row moves to."""
        return ReminderStatus.SENT if self.action is Action.SEND else ReminderStatus.SKIPPED


@dataclass(frozen=True)
class OutboxMessage:
    """What goes into the outbox for one Sent row: key (= EventId), contract payload, headers."""

    message_key: str
    payload: dict[str, Any]
    headers: dict[str, str]


class PayloadError(ValueError):
    """The row cannot become a valid message (a poison row); the message is one line."""


@cache
def _schema_validator() -> Draft202012Validator:
    return Draft202012Validator(contract.schema())


def validate_with_schema(payload: dict[str, Any]) -> None:
    """The reference check: the shipped JSON Schema through jsonschema (first error, one line,
    naming the field and the schema's rule it breaks, never its value: jsonschema's own message
    quotes it)."""
    errors = _schema_validator().iter_errors(payload)
    error = next(iter(sorted(errors, key=lambda e: list(e.path))), None)
    if error is not None:
        where = "/".join(str(p) for p in error.path) or "payload"
        raise contract.ContractViolation(f"{where}: breaks the schema's {error.validator!s} rule")


def action_for(event_status: str | None) -> Action:
    """Send when the parent event is Planned/InProgress, otherwise skip (an unknown status too:
    sending for an event in a state we do not understand is worse than not sending)."""
    return Action.SEND if event_status in SENDS else Action.SKIP


def decide(reminder: DueReminder) -> Decision:
    """:func:`action_for` the row's event status."""
    return Decision(reminder=reminder, action=action_for(reminder.event_status))


def decide_batch(reminders: Sequence[DueReminder]) -> list[Decision]:
    """:func:`decide` over a batch, keeping its order."""
    return [decide(r) for r in reminders]


def iso_utc(value: datetime) -> str:
    """ISO-8601 in UTC with a ``Z`` suffix; microseconds only when present."""
    if value.tzinfo is None:
        raise PayloadError("StartAt has no time zone")
    return value.astimezone(UTC).replace(tzinfo=None).isoformat() + "Z"


def message_time_zone(name: str | None) -> str:
    """The TimeZone a message carries: the event's when canonical, else the fallback zone."""
    return name if name is not None and time_zones.is_canonical(name) else time_zones.FALLBACK_ZONE


def _attribute(field_name: str) -> str:
    """The row's attribute a payload field is taken from: its name in snake case."""
    return "".join(f"_{c.lower()}" if c.isupper() else c for c in field_name).lstrip("_")


def build_payload(reminder: DueReminder) -> dict[str, Any]:
    """The contract v1 payload for ``reminder``; raises :class:`PayloadError` for a poison row.

    Every property of the shipped schema, from the row's attribute of its name (the contract
    says where each field comes from: ``ReminderId`` is the row's id, ``StartAt`` its event's
    start): a time in ISO-8601 UTC, the time zone the event's when canonical, else the fallback.
    Only identifiers, times and the kind are read: the event's title, description and location
    are not part of :class:`DueReminder` at all, so they cannot leak into a message.
    """
    if reminder.start_at is None:
        raise PayloadError("StartAt is missing or outside the representable range")
    payload: dict[str, Any] = {}
    for name in contract.schema()["properties"]:
        value = getattr(reminder, _attribute(name))
        if isinstance(value, datetime):
            value = iso_utc(value)
        payload[name] = value
    payload["TimeZone"] = message_time_zone(reminder.time_zone)
    try:
        validate_with_schema(payload)
    except contract.ContractViolation as exc:
        raise PayloadError(f"breaks the contract: {exc}") from None
    return payload


def message_for(
    reminder: DueReminder, run_id: str | None, trace: Mapping[str, str]
) -> OutboxMessage:
    """The outbox message of a row that is sent: key = EventId, the contract's payload and
    headers."""
    payload = build_payload(reminder)
    headers = message_headers(payload["ReminderId"], run_id, trace)
    return OutboxMessage(message_key=payload["EventId"], payload=payload, headers=headers)


@dataclass
class BatchPlan:
    """What a batch should write: one transition per row that is not poison."""

    sends: list[tuple[DueReminder, OutboxMessage]] = field(default_factory=list)
    skips: list[DueReminder] = field(default_factory=list)
    poison: list[PoisonRow] = field(default_factory=list)
    #: Rows sent with the fallback time zone (their event's zone is not a canonical IANA name).
    time_zone_fallbacks: list[DueReminder] = field(default_factory=list)

    def transitions(self) -> list[tuple[DueReminder, ReminderStatus, OutboxMessage | None]]:
        """Every row's target status with its message (None for a skip), in the batch's order."""
        return [
            *((r, ReminderStatus.SENT, m) for r, m in self.sends),
            *((r, ReminderStatus.SKIPPED, None) for r in self.skips),
        ]


def plan_batch(
    reminders: Sequence[DueReminder],
    *,
    run_id: str | None = None,
    trace: Mapping[str, str] | None = None,
) -> BatchPlan:
    """Decide every row on the state given (as read under lock)."""
    plan = BatchPlan()
    for reminder in reminders:
        if action_for(reminder.event_status) is Action.SKIP:
            plan.skips.append(reminder)
            continue
        try:
            message = message_for(reminder, run_id, trace or {})
        except PayloadError as error:
            plan.poison.append(
                PoisonRow(reminder.reminder_id, reminder.event_id, reminder.tenant_id, str(error))
            )
            continue
        plan.sends.append((reminder, message))
        if not time_zones.is_canonical(reminder.time_zone):
            plan.time_zone_fallbacks.append(reminder)
    return plan
