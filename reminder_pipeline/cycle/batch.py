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
from dataclasses import dataclass, field
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
    PoisonRow,
    ReminderStatus,
)
from ..domain.plan import ZONE_FALLBACK, message_headers, unsendable
from ..domain.transitions import LIVE_EVENT_STATUSES, decide_all
from ..domain.writers import WRITER_IN_PROCESS
from ..logs import Journal
from ..observability import tracing
from ..store import repository
from .records import BatchOutcome, Selection


def batch_failed(error: BaseException) -> str:
    """The log line of a batch whose transaction failed: rolled back, or its outcome unknown.

    A connection lost during the batch (a silent database, a COMMIT whose answer never came)
    leaves the outcome to the server: the batch committed whole or is rolled back whole when the
    server ends the session; either way the next cycle re-reads the rows, so nothing is decided
    twice. Saying "rolled back" there would be a guess.
    """
    if isinstance(error, sa.exc.DBAPIError) and error.connection_invalidated:
        return "batch not confirmed: connection lost (committed whole or rolled back whole)"
    return "batch rolled back"


def lock_due_batch(conn: Connection, as_of: datetime, batch_size: int) -> Selection:
    """A batch's selection: due Pending rows (``due_at < as_of``), oldest first, locked FOR UPDATE
    SKIP LOCKED.

    The locks last as long as ``conn``'s transaction. Rows held by another instance are not
    waited for; how many there were is counted exactly (``skipped_locked``).
    """
    due = repository.select_due_for_update_skip_locked(conn, as_of, batch_size)
    return Selection(as_of, batch_size, due.reminders, due.skipped_locked)


def decide_batch(candidates: Sequence[DueReminder]) -> list[Decision]:
    """A batch's decision as described in plain Python (pure; ``domain/transitions.py``): what
    the batch statement decides for these rows if nothing changes before it runs."""
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
    writer: str = WRITER_IN_PROCESS,
) -> BatchOutcome:
    """A batch's write in ``conn``'s transaction: lock and re-read the candidates, decide, write.

    The design's rule: the candidates are locked again here (FOR UPDATE SKIP LOCKED) and re-read
    with their event; only what is still Pending and due, and not reserved by another run, is
    decided, on *that* state, and written by the statement every batch is written by
    (:func:`write_held_rows`): Sent rows get ``sent_at`` (the database's clock, never before
    ``as_of``; ``now`` pins it for tests) and exactly one outbox row each, Skipped rows publish
    nothing. A poison row (its message breaks the contract, or the database refuses its data) is
    left Pending with a back-off. Infrastructure errors propagate: the caller's transaction rolls
    back whole.

    ``reserved_by``: the run whose reservation the candidates may carry (the run that selected
    them). ``held``: the candidates as :func:`lock_due_batch` read and locked them *in this
    same transaction*; nothing can have changed them since, so they are not read again.
    ``writer``: who moves the rows (``moved_by``, in run ``correlation_id``; domain/writers.py).
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
    written = write_held_rows(
        conn, locked, as_of, correlation_id=correlation_id, now=now, writer=writer
    )
    by_id = {r.reminder_id: r for r in locked}
    for row in written.batch.rows:
        reminder = by_id[row.reminder_id]
        if row.status is not ReminderStatus.SENT:
            outcome.skipped.append(reminder)
            continue
        outcome.sent.append(reminder)
        if row.reminder_id in written.zone_fallbacks:
            outcome.time_zone_fallbacks.append(reminder)
        outcome.lateness.observe(row.lateness_seconds)
        outcome.messages.append(_message(row, written.headers))
    outcome.outbox_rows = len(outcome.messages)
    outcome.poison = [
        PoisonRow(i, by_id[i].event_id, by_id[i].tenant_id, error)
        for i, error in written.poison.items()
    ]
    repository.record_poison(conn, outcome.poison, now)
    return outcome


@dataclass
class _HeldWrite:
    """What :func:`write_held_rows` wrote, and the rows it had to treat apart."""

    batch: repository.DispatchedBatch
    headers: dict[str, str]
    #: Who moves the rows, in which run (``moved_by``, ``moved_in_run``).
    writer: str
    run: str | None
    #: Poison rows left Pending: reminder id -> why (one line).
    poison: dict[str, str] = field(default_factory=dict)
    #: Rows sent with the fallback time zone.
    zone_fallbacks: set[str] = field(default_factory=set)


def write_held_rows(
    conn: Connection,
    locked: Sequence[DueReminder],
    as_of: datetime,
    *,
    correlation_id: str | None = None,
    now: datetime | None = None,
    writer: str = WRITER_IN_PROCESS,
) -> _HeldWrite:
    """Write rows this transaction holds with the batch statement, checked before it stays.

    Each attempt runs in a savepoint. A payload the statement built is checked against the
    contract (:func:`~reminder_pipeline.domain.plan.unsendable`): a row whose zone is not
    canonical is written again with the fallback zone, a row that breaks the contract again left
    out as poison. When the database refuses the batch for a row's data (SQLSTATE class 22/23),
    each row is tried alone to find the refused ones, which are left out as poison. Every other
    error propagates.
    """
    held = _HeldWrite(
        repository.DispatchedBatch([], 0, 0), _headers(correlation_id), writer, correlation_id
    )
    ids = [r.reminder_id for r in locked]
    for _ in range(len(ids) + 2):  # each retry sets at least one more row apart
        savepoint = conn.begin_nested()
        try:
            batch = _write_held(conn, ids, as_of, held, now)
        except sa.exc.DBAPIError as error:
            savepoint.rollback()
            if repository.data_error(error) is None:
                raise
            refused = _refused_alone(conn, ids, as_of, held, now)
            if not refused:
                raise
            held.poison.update(refused)
            continue
        apart = {
            row.reminder_id: why
            for row in batch.rows
            if row.status is ReminderStatus.SENT
            and (why := _unsendable(row, row.reminder_id in held.zone_fallbacks))
        }
        if not apart:
            savepoint.commit()
            held.batch = batch
            return held
        savepoint.rollback()
        for reminder_id, why in apart.items():
            if why == ZONE_FALLBACK and reminder_id not in held.zone_fallbacks:
                held.zone_fallbacks.add(reminder_id)
            else:
                held.poison[reminder_id] = why
    raise RuntimeError("a batch's rows could not be set apart")  # pragma: no cover


def _write_held(
    conn: Connection,
    ids: Sequence[str],
    as_of: datetime,
    held: _HeldWrite,
    now: datetime | None,
) -> repository.DispatchedBatch:
    return repository.write_held_batch(
        conn,
        ids,
        as_of,
        topic=contract.TOPIC,
        headers=held.headers,
        live=LIVE_EVENT_STATUSES,
        moved_by=held.writer,
        moved_in_run=held.run,
        exclude=list(held.poison),
        utc_zone=sorted(held.zone_fallbacks),
        now=now,
    )


def _refused_alone(
    conn: Connection,
    ids: Sequence[str],
    as_of: datetime,
    held: _HeldWrite,
    now: datetime | None,
) -> dict[str, str]:
    """Each row not yet set apart, written alone and rolled back: those the database refuses."""
    refused = {}
    for reminder_id in ids:
        if reminder_id in held.poison:
            continue
        savepoint = conn.begin_nested()
        try:
            _write_held(conn, [reminder_id], as_of, held, now)
        except sa.exc.DBAPIError as error:
            sqlstate = repository.data_error(error)
            if sqlstate is None:
                savepoint.rollback()
                raise
            refused[reminder_id] = f"database rejected the row (SQLSTATE {sqlstate})"
        savepoint.rollback()
    return refused


def _headers(correlation_id: str | None) -> dict[str, str]:
    """The headers every message of the batch shares (its reminder-id is set per row)."""
    return message_headers("", correlation_id, tracing.trace_headers())


def _unsendable(row: repository.DispatchedRow, zone_fallen_back: bool) -> str | None:
    if row.outbox_id is None or row.payload is None:
        return "no message was written for a Sent row"
    return unsendable(orjson.loads(row.payload), zone_fallen_back=zone_fallen_back)


def _message(row: repository.DispatchedRow, headers: dict[str, str]) -> ClaimedMessage:
    """A written row's outbox message as the relay publishes it."""
    return ClaimedMessage(
        row.outbox_id or 0,
        contract.TOPIC,
        row.event_id,
        row.payload or "",
        {**headers, contract.HEADER_REMINDER_ID: row.reminder_id},
    )


class _WriteAgain(Exception):
    """A drain's statement wrote a row it cannot vouch for: write the batch again, setting the
    rows that need it apart (:func:`write_batch`)."""

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
    writer: str = WRITER_IN_PROCESS,
) -> BatchOutcome:
    """Select and write one batch in one transaction (locks held from select to commit).

    First as one statement (:func:`write_due_batch`); when that batch holds a row it cannot
    vouch for (a payload that breaks the contract, a time zone that is not canonical, data the
    database refuses), its transaction rolls back and the batch is written again in a new one
    (:func:`lock_due_batch` then :func:`write_batch`: the same statement, poison rows set apart,
    fallback zones applied). Its log lines and span events follow the commit; a batch
    that rolls back logs that it did, and never "reminder sent".
    """
    journal = journal or Journal()
    try:
        try:
            with engine.begin() as conn:
                outcome = write_due_batch(
                    conn, as_of, batch_size, correlation_id=correlation_id, writer=writer
                )
        except _WriteAgain as why:
            journal.event(logging.DEBUG, "batch written again", run_id=correlation_id, **why.fields)
            with engine.begin() as conn:
                selection = lock_due_batch(conn, as_of, batch_size)
                outcome = write_batch(
                    conn,
                    selection.ids,
                    as_of,
                    held=selection.candidates,
                    correlation_id=correlation_id,
                    writer=writer,
                )
            outcome.skipped_locked += selection.skipped_locked
    except BaseException as error:
        journal.event(
            logging.WARNING,
            batch_failed(error),
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
    writer: str = WRITER_IN_PROCESS,
) -> BatchOutcome:
    """A drain's batch as one statement in ``conn``'s transaction (docs/design.md): the due
    selection and its lock, then the decision and the write of :func:`write_held_rows`' statement.

    Each payload it built is checked against the contract here, before the caller commits.
    Raises :class:`_WriteAgain` (the caller rolls back and writes the batch the way that sets
    rows apart) when one fails the check or the database refuses a row's data.
    """
    headers = _headers(correlation_id)
    try:
        batch = repository.dispatch_due_batch(
            conn,
            as_of,
            batch_size,
            topic=contract.TOPIC,
            headers=headers,
            live=LIVE_EVENT_STATUSES,
            moved_by=writer,
            moved_in_run=correlation_id,
        )
    except sa.exc.DBAPIError as error:
        sqlstate = repository.data_error(error)
        if sqlstate is None:
            raise
        raise _WriteAgain(reason="data error", sqlstate=sqlstate) from error
    outcome = BatchOutcome(selected=batch.selected, skipped_locked=batch.skipped_locked)
    for row in batch.rows:
        if row.status is not ReminderStatus.SENT:
            outcome.skipped.append(row)
            continue
        if _unsendable(row, zone_fallen_back=False):
            raise _WriteAgain(reason="payload not sendable as built", reminder_id=row.reminder_id)
        outcome.sent.append(row)
        outcome.lateness.observe(row.lateness_seconds)
        outcome.messages.append(_message(row, headers))
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
