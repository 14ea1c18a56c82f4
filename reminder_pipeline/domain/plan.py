"""The writing step's decision for a batch of rows read under lock: pure, no database needed.

For each row: send (a Planned/InProgress event: its message built and checked against the
contract), skip (a Cancelled/Completed event, or a status we do not know), or poison (the
message cannot be built or breaks the contract: the row stays Pending and is retried later).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from . import contract, time_zones
from .model import Action, DueReminder, OutboxMessage, PoisonRow, ReminderStatus
from .payload import PayloadError, build_payload
from .transitions import action_for


@dataclass
class BatchPlan:
    """What to write for a batch: one transition per row that is not poison."""

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


def message_for(
    reminder: DueReminder, correlation_id: str | None, trace: Mapping[str, str]
) -> OutboxMessage:
    """The outbox message of a row that is sent: key = EventId, the contract's payload and headers.

    ``trace`` (the cycle span's W3C context) is stored with the row, so whenever the relay
    publishes it a consumer continues the cycle's trace.
    """
    payload = build_payload(reminder)
    headers = message_headers(payload["ReminderId"], correlation_id, trace)
    return OutboxMessage(message_key=payload["EventId"], payload=payload, headers=headers)


def message_headers(
    reminder_id: str, correlation_id: str | None, trace: Mapping[str, str]
) -> dict[str, str]:
    """The headers stored with a row's outbox message: the contract's, then the trace context."""
    return {**contract.headers(reminder_id, correlation_id), **trace}


def is_sendable(payload: object) -> bool:
    """Whether a payload built elsewhere (in SQL, by the one-statement batch) may be sent as is.

    It must satisfy the contract and carry a canonical time zone: a row whose zone is not
    canonical is sent with the fallback zone, which only :func:`plan_batch` applies and counts.
    """
    if not isinstance(payload, dict):
        return False
    try:
        contract.validate(payload)
    except contract.ContractViolation:
        return False
    return time_zones.is_canonical(payload["TimeZone"])


def plan_batch(
    reminders: Sequence[DueReminder],
    *,
    correlation_id: str | None = None,
    trace: Mapping[str, str] | None = None,
) -> BatchPlan:
    """Decide every row on the state given (read under lock by the caller)."""
    plan = BatchPlan()
    for reminder in reminders:
        if action_for(reminder.event_status) is Action.SKIP:
            plan.skips.append(reminder)
            continue
        try:
            message = message_for(reminder, correlation_id, trace or {})
        except PayloadError as error:
            plan.poison.append(
                PoisonRow(reminder.reminder_id, reminder.event_id, reminder.tenant_id, str(error))
            )
            continue
        plan.sends.append((reminder, message))
        if not time_zones.is_canonical(reminder.time_zone):
            plan.time_zone_fallbacks.append(reminder)
    return plan
