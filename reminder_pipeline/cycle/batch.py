"""One batch in the caller's transaction: lock the due rows, decide, write; log after commit.

The rule that keeps a cycle correct whatever runs its steps, and whenever: the writing step
(:func:`write_batch`) locks the candidates again in its own transaction, re-reads each row and
its event under that lock and decides on *that* (docs/design.md). Log lines and span events of a
batch are emitted after its transaction committed: nothing but database work happens while its
rows are locked.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import orjson
import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from ..domain import contract
from ..domain.model import (
    ClaimedMessage,
    Decision,
    DueReminder,
    ReminderStatus,
)
from ..domain.plan import is_sendable, message_headers, plan_batch
from ..domain.transitions import LIVE_EVENT_STATUSES, decide_all
from ..logs import Journal
from ..observability import tracing
from ..store import repository
from .records import BatchOutcome, Selection


def lock_due_batch(conn: Connection, as_of: datetime, batch_size: int) -> Selection:
    """A batch's selection: due Pending rows (``due_at < as_of``), oldest first, locked FOR UPDATE
    SKIP LOCKED.

    The locks last as long as ``conn``'s transaction. Rows held by another instance are not
    waited for; how many there were is counted exactly (``skipped_locked``).
    """
    due = repository.select_due_for_update_skip_locked(conn, as_of, batch_size)
    return Selection(as_of, batch_size, due.reminders, due.skipped_locked)


def decide_batch(candidates: Sequence[DueReminder]) -> list[Decision]:
    """A batch's decision (pure): send for a Planned/InProgress event, skip for a
    Cancelled/Completed one."""
    return decide_all(list(candidates))


def write_batch(
    conn: Connection,
    candidate_ids: Sequence[str | uuid.UUID],
    as_of: datetime,
    *,
    correlation_id: str | None = None,
    reserved_by: str | None = None,
    held: Sequence[DueReminder] | None = None,
    now: datetime | None = None,
) -> BatchOutcome:
    """A batch's write in ``conn``'s transaction: lock and re-read the candidates, decide, write.

    The design's rule: the candidates are locked again here (FOR UPDATE SKIP LOCKED) and re-read
    with their event; only what is still Pending and due, and not reserved by another run, is
    decided, on *that* state (:func:`~reminder_pipeline.domain.plan.plan_batch`), and written by
    one set-based statement: Sent rows get ``sent_at`` (the database's clock, never before
    ``as_of``; ``now`` pins it for tests)
    and exactly one outbox row each, Skipped rows publish nothing. A poison row (its message
    cannot be built, breaks the contract, or the database refuses its data) is left Pending with
    a back-off. Infrastructure errors propagate: the caller's transaction rolls back whole.

    ``reserved_by``: the run whose reservation the candidates may carry (the run that selected
    them). ``held``: the candidates as :func:`lock_due_batch` read and locked them *in this
    same transaction*; nothing can have changed them since, so they are not read again.
    """
    ids = [str(i) for i in candidate_ids]  # a selection stored by an older version held UUIDs
    if held is not None and [r.reminder_id for r in held] == ids:
        locked = list(held)
    else:
        locked = repository.lock_candidates(conn, ids, as_of, reserved_by)
    outcome = BatchOutcome(selected=len(ids))
    taken = {r.reminder_id for r in locked}
    missing = [i for i in ids if i not in taken]
    outcome.skipped_locked = repository.count_still_pending(conn, missing)
    outcome.gone = len(missing) - outcome.skipped_locked

    plan = plan_batch(locked, correlation_id=correlation_id, trace=tracing.trace_headers())
    applied = repository.apply_transitions(
        conn, plan.transitions(), topic=contract.TOPIC, not_before=as_of, now=now
    )
    outcome.poison = plan.poison + applied.refused
    repository.record_poison(conn, outcome.poison, now)

    by_id = {r.reminder_id: r for r in locked}
    messages = {r.reminder_id: m for r, m in plan.sends}
    fallbacks = {r.reminder_id for r in plan.time_zone_fallbacks}
    for row in applied.rows:
        reminder = by_id[row.reminder_id]
        if row.status is not ReminderStatus.SENT:
            outcome.skipped.append(reminder)
            continue
        outcome.sent.append(reminder)
        if row.reminder_id in fallbacks:
            outcome.time_zone_fallbacks.append(reminder)
        outcome.lateness.observe(row.lateness_seconds)
        message = messages[row.reminder_id]
        if row.outbox_id is not None:
            outcome.messages.append(
                ClaimedMessage(
                    row.outbox_id,
                    contract.TOPIC,
                    message.message_key,
                    row.payload or "",
                    message.headers,
                )
            )
    outcome.outbox_rows = applied.outbox_rows
    return outcome


class _RowByRow(Exception):
    """The one-statement batch wrote a row it cannot vouch for: write this batch row by row."""

    def __init__(self, **fields: str) -> None:
        super().__init__(fields)
        self.fields = fields


def dispatch_batch(
    engine: Engine,
    as_of: datetime,
    batch_size: int,
    *,
    correlation_id: str | None = None,
    journal: Journal | None = None,
) -> BatchOutcome:
    """Select and write one batch in one transaction (locks held from select to commit).

    First as one statement (:func:`write_due_batch`); when that batch holds a row it cannot
    vouch for (a payload that breaks the contract, a time zone that is not canonical, data the
    database refuses), its transaction rolls back and the batch is written the row-by-row way
    (:func:`lock_due_batch` then :func:`write_batch`: poison rows isolated, fallback zones
    applied), in a new transaction. Its log lines and span events follow the commit; a batch
    that rolls back logs that it did, and never "reminder sent".
    """
    journal = journal or Journal()
    try:
        try:
            with engine.begin() as conn:
                outcome = write_due_batch(conn, as_of, batch_size, correlation_id=correlation_id)
        except _RowByRow as why:
            journal.event(
                logging.DEBUG, "batch written row by row", run_id=correlation_id, **why.fields
            )
            with engine.begin() as conn:
                selection = lock_due_batch(conn, as_of, batch_size)
                outcome = write_batch(
                    conn,
                    selection.ids,
                    as_of,
                    held=selection.candidates,
                    correlation_id=correlation_id,
                )
            outcome.skipped_locked += selection.skipped_locked
    except BaseException as error:
        journal.event(
            logging.WARNING,
            "batch rolled back",
            run_id=correlation_id,
            error_kind=type(error).__name__,
        )
        raise
    report_batch(
        journal,
        outcome,
        correlation_id,
        selected=(outcome.selected, outcome.skipped_locked),
    )
    return outcome


def write_due_batch(
    conn: Connection,
    as_of: datetime,
    batch_size: int,
    *,
    correlation_id: str | None = None,
) -> BatchOutcome:
    """Steps 1-3 for one batch as one statement in ``conn``'s transaction (docs/design.md).

    The same selection, lock, decision and write as :func:`lock_due_batch` + :func:`write_batch`,
    with the payloads built by the statement; each one is checked against the contract here,
    before the caller commits. Raises :class:`_RowByRow` (the caller rolls back) when one fails
    the check or the database refuses a row's data.
    """
    trace = tracing.trace_headers()
    headers = message_headers("", correlation_id, trace)
    try:
        batch = repository.dispatch_due_batch(
            conn, as_of, batch_size, topic=contract.TOPIC, headers=headers, live=LIVE_EVENT_STATUSES
        )
    except sa.exc.DBAPIError as error:
        sqlstate = repository.data_error(error)
        if sqlstate is None:
            raise
        raise _RowByRow(reason="data error", sqlstate=sqlstate) from error
    outcome = BatchOutcome(selected=batch.selected, skipped_locked=batch.skipped_locked)
    for row in batch.rows:
        if row.status is not ReminderStatus.SENT:
            outcome.skipped.append(row)
            continue
        if (
            row.outbox_id is None
            or row.payload is None
            or not is_sendable(orjson.loads(row.payload))
        ):
            raise _RowByRow(reason="payload not sendable as built", reminder_id=row.reminder_id)
        outcome.sent.append(row)
        outcome.lateness.observe(row.lateness_seconds)
        outcome.messages.append(
            ClaimedMessage(
                row.outbox_id,
                contract.TOPIC,
                row.event_id,
                row.payload,
                {**headers, contract.HEADER_REMINDER_ID: row.reminder_id},
            )
        )
    outcome.outbox_rows = len(outcome.messages)
    return outcome


def report_batch(
    journal: Journal,
    outcome: BatchOutcome,
    run_id: str | None,
    selected: tuple[int, int] | None = None,
) -> None:
    """A committed batch's log lines (one record) and span events; warnings and errors apart."""
    lines: list[dict[str, Any]] = []
    if selected is not None:
        lines.append({"msg": "batch selected", "count": selected[0], "skipped_locked": selected[1]})
    sent = [
        {
            "reminder_id": r.reminder_id,
            "event_id": r.event_id,
            "offset_minutes": r.offset_minutes,
            "tenant_id": r.tenant_id,
        }
        for r in outcome.sent
    ]
    skipped = [
        {
            "reminder_id": r.reminder_id,
            "event_id": r.event_id,
            "event_status": r.event_status,
            "tenant_id": r.tenant_id,
        }
        for r in outcome.skipped
    ]
    lines += [{"msg": "reminder sent", **ids} for ids in sent]
    lines += [{"msg": "reminder skipped", **ids} for ids in skipped]
    journal.batch(logging.INFO, "batch written", lines, run_id=run_id)
    tracing.item_events("reminder sent", sent)
    tracing.item_events("reminder skipped", skipped)
    for r in outcome.time_zone_fallbacks:
        journal.event(
            logging.WARNING,
            "time zone not canonical; sent with UTC",
            run_id=run_id,
            reminder_id=r.reminder_id,
            event_id=r.event_id,
            tenant_id=r.tenant_id,
        )
    for p in outcome.poison:
        ids = {"reminder_id": p.reminder_id, "event_id": p.event_id, "tenant_id": p.tenant_id}
        journal.event(logging.ERROR, "item failed", run_id=run_id, exception=p.error, **ids)
        tracing.item_event("item failed", **ids)
