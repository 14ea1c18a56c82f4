"""The trace of a reminder: every question about one reminder (or every reminder of one event)
answered from the store, the same answer behind ``reminder-pipeline trace`` and the
``reminder_trace`` job.

For each reminder: its event's kind, whose it is (the owner's, client's and tenant's ids), its
status, DueAt and SentAt, why it is in that state in words, when and by what (:func:`reason`,
judged on the database's clock: the writer recorded in ``moved_by``, domain/writers.py, or the
calendar, which records none: :func:`moved_by`), the run that wrote it (the message's
``correlation-id``) with its UI address when it is a Dagster run (a command's cycle has no
page), its outbox row (published when, after how many failed attempts) and where the message
landed (partition and offset, from the delivery report the relay recorded), every re-publish of
it, and, given a check on the consumer's de-duplication store, whether the notifications side
has it as delivered. A reminder whose row is gone (a moved or deleted event's) is traced from
its outbox message. Identifiers, times, statuses and counts only: never an event's title,
description or location.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from sqlalchemy.engine import Connection, Engine

from ..domain.model import Action
from ..domain.transitions import action_for
from ..domain.writers import (
    CLI_PREFIX,
    OPERATOR_PREFIX,
    WRITER_CALENDAR,
    WRITER_DAGSTER,
    WRITER_IN_PROCESS,
)
from ..store import operator_repository

#: The fields of each reminder, in this order (``--json``, ``reminders --json`` and the Dagster
#: cards); see docs/cli.md.
FIELDS = (
    "reminder_id",
    "event_id",
    "kind",
    "owner_user_id",
    "client_user_id",
    "tenant_id",
    "status",
    "due_at",
    "sent_at",
    "reason",
    "run_id",
    "run_url",
    "published_at",
    "partition",
    "offset",
    "failed_publish_attempts",
    "attempts",
    "moved_by",
    "event_status",
    "outbox_id",
    "republishes",
)


#: The ids of who the reminder is for (ids only: no name, no PII), as text.
_PEOPLE = ("owner_user_id", "client_user_id", "tenant_id")


class UnknownId(LookupError):
    """Neither a reminder, an event nor an outbox message has this id."""


#: What closed an event whose reminders are skipped (a reason's words).
_CLOSED_BY = {"Cancelled": "cancel", "Completed": "completion"}


def run_url(ui_url: str, run_id: str | None) -> str | None:
    """The Dagster UI's page of a run (``<ui>/runs/<run id>``), None without a run id."""
    return f"{ui_url.rstrip('/')}/runs/{run_id}" if run_id else None


def has_run_page(row: Mapping[str, Any]) -> bool:
    """Whether the run named in the trace is a Dagster run (a page in the UI): moved by one, or
    sent before the writer was recorded (then most likely one); never a command's cycle."""
    moved_by = row.get("moved_by")
    if moved_by == WRITER_DAGSTER:
        return True
    if moved_by is not None and moved_by.startswith(OPERATOR_PREFIX):
        return row.get("moved_in_run") is not None
    return moved_by is None and row.get("status") == "Sent"


def _at(value: datetime | None) -> str | None:
    """A time as ISO-8601 in UTC, whole seconds (the words of a reason)."""
    return None if value is None else value.astimezone(UTC).isoformat(timespec="seconds")


def _iso(value: Any) -> Any:
    """A time as ISO-8601 text (data for scripts), anything else unchanged."""
    return value.isoformat() if isinstance(value, datetime) else value


def _by(row: Mapping[str, Any]) -> str:
    """The writer that moved the row, in words (a dispatch cycle's: Dagster run or command)."""
    moved_by, run = row.get("moved_by"), row.get("moved_in_run") or row.get("run_id")
    if moved_by == WRITER_DAGSTER:
        return f"by Dagster run {run}"
    if moved_by is not None and moved_by.startswith(CLI_PREFIX):
        command = moved_by.removeprefix(CLI_PREFIX)
        return f"by `reminder-pipeline {command}` (run id {run}, no Dagster run)"
    if moved_by == WRITER_IN_PROCESS:
        return f"by a cycle called in process (run id {run}, no Dagster run)"
    if moved_by is not None:
        return f"by {moved_by} (run id {run})"
    # Moved before the writer was recorded (migration 0007): the run is all that is known.
    if run:
        return f"by run {run} (a Dagster run or a command's cycle: before writers were recorded)"
    return "(moved before writers were recorded)"


def _sent(row: Mapping[str, Any]) -> str:
    words = f"sent at {_at(row['sent_at'])} {_by(row)}"
    if row["outbox_id"] is None:
        return f"{words}; its outbox row is gone (purged after the retention)"
    return f"{words}; {_message(row)}"


def _message(row: Mapping[str, Any]) -> str:
    """The outbox row's message: published when, or not yet after how many failed attempts."""
    if row["published_at"] is None:
        failed = int(row["failed_publish_attempts"] or 0)
        return f"its message is not published yet ({failed} failed publish attempts)"
    return f"published at {_at(row['published_at'])}"


def calendar_skip(row: Mapping[str, Any]) -> str | None:
    """What of the calendar's skipped this row, which records no writer (docs/design.md, "Who
    moved a reminder"): ``creation`` (its time had passed when it was made), ``cancel`` or
    ``completion`` of its event; None when another writer moved it, or it is not Skipped."""
    if row.get("status") != "Skipped" or row.get("moved_by") is not None:
        return None
    if int(row["attempts"] or 0) > 0 and row["event_status"] not in _CLOSED_BY:
        return None  # an operator's skip of a poison row, before writers were recorded
    created = row.get("created_at")
    if created is not None and row.get("updated_at") == created:  # inserted Skipped
        return "creation"
    return _CLOSED_BY.get(row["event_status"])


def moved_by(row: Mapping[str, Any]) -> str | None:
    """Who moved the row out of Pending: the writer recorded with it, or ``calendar`` for the
    calendar's skips (told from the row and its event: the calendar records none)."""
    recorded = row.get("moved_by")
    if recorded is not None:
        return str(recorded)
    return WRITER_CALENDAR if calendar_skip(row) is not None else None


def _skipped(row: Mapping[str, Any]) -> str:
    at = _at(row.get("updated_at"))
    attempts, error, event_status = (
        int(row["attempts"] or 0),
        row["last_error"],
        row["event_status"],
    )
    by_calendar = calendar_skip(row)
    if by_calendar == "creation":
        return (
            f"skipped at creation: its time (due at {_at(row['due_at'])}) had passed when it "
            f"was created at {_at(row.get('created_at'))}"
        )
    if by_calendar is not None:
        return f"skipped by the {by_calendar} of the event at {at}"
    recorded = row.get("moved_by")
    if recorded is None or recorded.startswith(OPERATOR_PREFIX):
        if recorded is None and attempts == 0:
            return (
                f"skipped at {at} (moved before writers were recorded, the event is {event_status})"
            )
        in_run = f" (Dagster run {row['moved_in_run']})" if row.get("moved_in_run") else ""
        if attempts == 0:
            return f"skipped by an operator at {at}{in_run}, forced: it had not failed"
        return (
            f"skipped by an operator at {at}{in_run} after {attempts} failures "
            f"(last error: {error})"
        )
    # A dispatch cycle, on the event status it read under the lock.
    why = (
        f"the event was {event_status}"
        if action_for(event_status) is Action.SKIP
        else f"the event was not Planned or InProgress when read (it is {event_status} now)"
    )
    return f"skipped at {at} {_by(row)}: {why}"


def reason(row: Mapping[str, Any], now: datetime) -> str:
    """Why the reminder is in its state, in words, judged at ``now`` (the database's clock):
    when, and by what. The first clause (before "; ") is a short reason."""
    status, attempts, error = row["status"], int(row["attempts"] or 0), row["last_error"]
    if status == "Sent":
        return _sent(row)
    if status == "Skipped":
        return _skipped(row)
    # Pending: what happens next, on the event's status as it is now (a closed event's
    # reminders are skipped by the cycle that takes them, never sent).
    closed = action_for(row["event_status"]) is Action.SKIP
    event_closed = f" and its event is {row['event_status']}"
    reserved_until = row["reserved_until"]
    if row["reserved_by"] and reserved_until is not None and reserved_until > now:
        words = f"reserved by run {row['reserved_by']} until {_at(reserved_until)}"
        return f"{words}{event_closed}: that run skips it" if closed else words
    next_attempt = row["next_attempt_at"]
    if attempts > 0 and next_attempt is not None and next_attempt > now:
        words = (
            f"backing off after {attempts} failures (last error: {error}); "
            f"next attempt at {_at(next_attempt)}"
        )
        return f"{words},{event_closed}: that attempt skips it" if closed else words
    if attempts > 0:
        failed = f"failed {attempts} times (last error: {error})"
        if closed:
            return f"{failed}; its event is {row['event_status']}: the next cycle skips it"
        return f"{failed}; the next cycle tries it again"
    if row["due_at"] > now:
        words = f"not due yet (due at {_at(row['due_at'])})"
        return f"{words}{event_closed}: the cycle that takes it skips it" if closed else words
    if closed:
        return f"due since {_at(row['due_at'])}{event_closed}: the next dispatch cycle skips it"
    return f"due since {_at(row['due_at'])}; the next dispatch cycle takes it"


def outbox_reason(row: Mapping[str, Any]) -> str:
    """Why a reminder whose row is gone is still traced: its message in the outbox."""
    gone = (
        "its reminder row is gone (the event was moved or deleted)"
        if row["event_status"] is not None
        else "its reminder row is gone with its event (deleted)"
    )
    written = f"its message was written at {_at(row['outbox_created_at'])}"
    if row.get("run_id"):
        written += f" in run {row['run_id']}"
    if row["published_at"] is None:
        return f"{gone}; {written}; {_message(row)}"
    landed = (
        f", partition {row['partition']} offset {row['offset']}"
        if row["partition"] is not None
        else ""
    )
    return f"{gone}; {written} and published at {_at(row['published_at'])}{landed}"


def trace(
    engine: Engine,
    reminder_or_event_id: uuid.UUID | str,
    *,
    ui_url: str,
    delivered: Callable[[uuid.UUID], bool] | None = None,
) -> list[dict[str, Any]]:
    """The trace of the reminder with this id, or of every reminder of the event with this id.

    ``delivered`` (the consumer's de-duplication store's check) adds ``delivered`` to each.
    Raises :class:`UnknownId` when neither a reminder nor an event has the id.
    """
    wanted = uuid.UUID(str(reminder_or_event_id))
    with engine.connect() as conn:
        rows = operator_repository.trace_rows(conn, wanted)
        if not rows:
            rows = operator_repository.outbox_only_rows(conn, [wanted])
        traced = _items(conn, rows, ui_url=ui_url, delivered=delivered)
    if not rows:
        raise UnknownId(
            f"no reminder, event or outbox message has the id {wanted}; a reminder deleted "
            "before it was sent leaves no row"
        )
    return traced


def trace_ids(engine: Engine, ids: Sequence[uuid.UUID], *, ui_url: str) -> list[dict[str, Any]]:
    """The trace items of these reminders, in the given order; ids not found are left out (a
    reminder whose row is gone is traced from its outbox message, as :func:`trace` does)."""
    wanted = list(dict.fromkeys(uuid.UUID(str(i)) for i in ids))
    with engine.connect() as conn:
        by_id = {r["reminder_id"]: r for r in operator_repository.trace_rows_of(conn, wanted)}
        missing = [i for i in wanted if i not in by_id]
        by_id.update(
            (r["reminder_id"], r) for r in operator_repository.outbox_only_rows(conn, missing)
        )
        ordered = [by_id[i] for i in wanted if i in by_id]
        return _items(conn, ordered, ui_url=ui_url, delivered=None)


def _items(
    conn: Connection,
    rows: Sequence[Mapping[str, Any]],
    *,
    ui_url: str,
    delivered: Callable[[uuid.UUID], bool] | None,
) -> list[dict[str, Any]]:
    """The trace items of these rows (with their re-publishes), in their order."""
    copies = operator_repository.republishes_of(conn, [r["reminder_id"] for r in rows])
    traced = []
    for row in rows:
        item: dict[str, Any] = {name: _iso(row.get(name)) for name in FIELDS}
        from_outbox = "status" not in row  # the reminder row is gone: its message is what is left
        item.update(
            reminder_id=str(row["reminder_id"]),
            event_id=str(row["event_id"]),
            **{k: None if row.get(k) is None else str(row[k]) for k in _PEOPLE},
            moved_by=None if from_outbox else moved_by(row),
            status="Sent" if from_outbox else row["status"],
            reason=outbox_reason(row) if from_outbox else reason(row, row["checked_at"]),
            run_url=None
            if from_outbox or not has_run_page(row)
            else run_url(ui_url, row["run_id"]),
            republishes=[
                {
                    "run_id": c["run_id"],
                    "run_url": run_url(ui_url, c["run_id"]),
                    "republished_at": _iso(c["republished_at"]),
                    "partition": c["partition"],
                    "offset": c["offset"],
                }
                for c in copies
                if c["reminder_id"] == row["reminder_id"]
            ],
        )
        if delivered is not None:
            item["delivered"] = delivered(row["reminder_id"])
        traced.append(item)
    return traced
