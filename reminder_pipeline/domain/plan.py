"""The send/skip decision and the message of a batch, described in Python; the payload check.

The cycle writes every batch with one statement (``store/queries._write_batch``): it decides
send or skip on the event status read under the row's lock and builds each message in SQL.
:func:`plan_batch` describes the same rules in plain Python (send for a Planned/InProgress event,
its message built by :func:`~reminder_pipeline.domain.payload.build_payload` and checked against
the contract; skip for a Cancelled/Completed event or a status we do not know; poison when the
message cannot be built or breaks the contract; the fallback zone for a zone that is not
canonical): the tests hold the statement to it. What the cycle runs from here: :func:`unsendable`,
the contract check of each payload the statement built, and :func:`message_headers`.
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


#: A built payload whose time zone is not canonical: write it again with the fallback zone.
ZONE_FALLBACK = "time zone not canonical"


def unsendable(payload: object, *, zone_fallen_back: bool = False) -> str | None:
    """Why a payload built by the batch statement may not be sent as is, else None.

    :data:`ZONE_FALLBACK` when its time zone is not canonical (and the fallback zone was not
    applied yet): the row is sent with the fallback zone, as :func:`plan_batch` describes it.
    Otherwise the contract's one line: the row is poison, left Pending with a back-off.
    """
    if not isinstance(payload, dict):
        return "breaks the contract: payload: is not an object"
    if not zone_fallen_back and not time_zones.is_canonical(payload.get("TimeZone")):
        return ZONE_FALLBACK
    try:
        contract.validate(payload)
    except contract.ContractViolation as violation:
        return f"breaks the contract: {violation}"
    return None


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
