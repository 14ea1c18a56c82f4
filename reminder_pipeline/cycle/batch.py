"""One batch in the caller's transaction: lock and read the due rows once, decide, write once.

The route of every batch (docs/design.md, "One route for a batch"): one statement locks and
reads the rows (``FOR UPDATE SKIP LOCKED``: :func:`lock_due` for a drain's batch,
:func:`lock_candidates` for a run's reserved rows); Python gives each row its verdict and builds
its message (:func:`~reminder_pipeline.domain.plan.verdict`: send, send with the fallback zone,
skip, poison); one statement writes the verdicts (:func:`write_rows`). Only a refusal of the
database's own (SQLSTATE class 22 or 23) is found row by row. Log lines and span events of a
batch are emitted after its transaction committed: nothing but database work happens while its
rows are locked.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from ..domain import contract
from ..domain.model import ClaimedMessage, DueReminder, PoisonRow, ReminderStatus
from ..domain.plan import Verdict, message_headers, verdict
from ..domain.writers import WRITER_IN_PROCESS
from ..logs import Journal
from ..observability import tracing
from ..store import repository
from ..store.repository import ScanPosition
from .records import BatchOutcome, Selection
from .scan import scan_start


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


def lock_due(
    conn: Connection, as_of: datetime, batch_size: int, start: ScanPosition | None = None
) -> Selection:
    """A drain's selection: due Pending rows (``due_at < as_of``), oldest first from ``start``,
    locked FOR UPDATE SKIP LOCKED and read once, each with its event's fields.

    ``start``: where the scan starts in the due index (the position the batch before it reached);
    by default where a cycle would start now (:func:`.scan.scan_start`). The locks last as long as
    ``conn``'s transaction. Rows held by another instance are not waited for; how many there were
    is counted exactly (``skipped_locked``).
    """
    if start is None:
        start = scan_start(conn).start
    due = repository.select_due_for_update_skip_locked(conn, as_of, batch_size, start)
    return Selection(as_of, batch_size, due.rows, due.skipped_locked, due.next_from)


def lock_candidates(
    conn: Connection, ids: Sequence[str], as_of: datetime, reserved_by: str | None
) -> Selection:
    """A run's writing step's selection: its candidates that are still Pending, due and not
    another run's (``reserved_by``: the run that reserved them), locked FOR UPDATE SKIP LOCKED and
    read once, oldest first; ``skipped_locked`` the candidates still Pending that another
    transaction holds, ``gone`` those no longer Pending or due."""
    rows = repository.select_candidates_for_update_skip_locked(conn, ids, as_of, reserved_by)
    taken = {r.reminder_id for r in rows}
    held = repository.count_still_pending(conn, [i for i in ids if i not in taken])
    return Selection(as_of, len(ids), rows, held, gone=len(ids) - len(rows) - held)


def write_rows(
    conn: Connection,
    rows: Sequence[DueReminder],
    as_of: datetime,
    *,
    run_id: str | None = None,
    now: datetime | None = None,
    writer: str = WRITER_IN_PROCESS,
) -> BatchOutcome:
    """Decide every row this transaction locked and read, then write the batch once.

    Each row's verdict and message come from what the lock read
    (:func:`~reminder_pipeline.domain.plan.verdict`); poison rows stay Pending with a back-off
    (:func:`repository.record_poison`). The write runs in a savepoint: when the database refuses
    it for a row's data (SQLSTATE class 22/23), each row is written alone (and rolled back) to
    find the refused ones, which join the poison rows, and the rest is written. Every other error
    propagates. ``writer`` moves the rows (``moved_by``, in run ``run_id``; domain/writers.py).
    """
    headers = message_headers("", run_id, tracing.trace_headers())
    outcome = BatchOutcome(selected=len(rows))
    writes: list[tuple[str, str | None]] = []
    poison: list[tuple[DueReminder, str]] = []
    fallbacks: list[DueReminder] = []
    for row in rows:
        decided = verdict(row)
        if decided.verdict is Verdict.SKIP:
            writes.append((row.reminder_id, None))
        elif decided.verdict is Verdict.POISON:
            poison.append((row, decided.error or ""))
        else:
            writes.append((row.reminder_id, decided.text))
            if decided.verdict is Verdict.SEND_FALLBACK_ZONE:
                fallbacks.append(row)
    messages = dict(writes)
    written = _apply_verdicts(conn, as_of, writes, headers, run_id, writer, now, poison, rows)
    for row in rows:
        moved = written.get(row.reminder_id)
        if moved is None:
            continue
        if moved.status != ReminderStatus.SENT:
            outcome.skipped.append(row)
            continue
        outcome.sent.append(row)
        outcome.lateness.observe(moved.lateness_seconds)
        outcome.messages.append(
            ClaimedMessage(
                moved.outbox_id or 0,
                contract.TOPIC,
                row.event_id,
                messages[row.reminder_id] or "",
                {**headers, contract.HEADER_REMINDER_ID: row.reminder_id},
            )
        )
    outcome.time_zone_fallbacks = [r for r in fallbacks if r.reminder_id in written]
    outcome.outbox_rows = len(outcome.messages)
    outcome.poison = [
        PoisonRow(r.reminder_id, r.event_id, r.tenant_id, error) for r, error in poison
    ]
    repository.record_poison(conn, outcome.poison, now)
    return outcome


def _apply_verdicts(
    conn: Connection,
    as_of: datetime,
    writes: list[tuple[str, str | None]],
    headers: dict[str, str],
    run_id: str | None,
    writer: str,
    now: datetime | None,
    poison: list[tuple[DueReminder, str]],
    rows: Sequence[DueReminder],
) -> dict[str, repository.WrittenRow]:
    """The batch's one write; rows the database refuses (class 22/23) are found row by row,
    added to ``poison`` and left out."""

    def statement(verdicts: list[tuple[str, str | None]]) -> dict[str, repository.WrittenRow]:
        return repository.write_verdicts(
            conn,
            as_of,
            verdicts,
            topic=contract.TOPIC,
            headers=headers,
            moved_by=writer,
            moved_in_run=run_id,
            now=now,
        )

    if not writes:
        return {}
    repository.set_savepoint(conn)  # left set when the write succeeds: COMMIT ends it
    try:
        return statement(writes)
    except sa.exc.DBAPIError as error:
        if repository.data_error(error) is None:
            raise
        repository.roll_back_to_savepoint(conn)
    by_id = {r.reminder_id: r for r in rows}
    refused: set[str] = set()
    for one in writes:
        alone = conn.begin_nested()
        try:
            statement([one])
        except sa.exc.DBAPIError as error:
            sqlstate = repository.data_error(error)
            if sqlstate is None:
                alone.rollback()
                raise
            refused.add(one[0])
            poison.append((by_id[one[0]], f"database rejected the row (SQLSTATE {sqlstate})"))
        alone.rollback()
    return statement([w for w in writes if w[0] not in refused])


def dispatch_batch(
    engine: Engine,
    as_of: datetime,
    batch_size: int,
    *,
    start: ScanPosition | None = None,
    run_id: str | None = None,
    journal: Journal | None = None,
    writer: str = WRITER_IN_PROCESS,
) -> BatchOutcome:
    """A drain's batch in one transaction (locks held from select to commit): the due rows from
    ``start`` locked and read once (:func:`lock_due`), decided and written once
    (:func:`write_rows`). Its log lines and span events follow the commit; a batch that rolls back
    logs that it did, and never "reminder sent". The outcome says where the next batch's scan
    starts (``next_from``).
    """
    journal = journal or Journal()
    try:
        with engine.begin() as conn:
            selection = lock_due(conn, as_of, batch_size, start)
            outcome = write_rows(conn, selection.rows, as_of, run_id=run_id, writer=writer)
        outcome.skipped_locked = selection.skipped_locked
        outcome.next_from = selection.next_from
    except BaseException as error:
        journal.event(
            logging.WARNING,
            batch_failed(error),
            run_id=run_id,
            error_kind=type(error).__name__,
        )
        raise
    report_batch(
        journal,
        outcome,
        run_id,
        selected=(outcome.selected, outcome.skipped_locked),
    )
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
