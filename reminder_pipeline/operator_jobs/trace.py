"""The trace of a reminder: every question about one reminder (or every reminder of one event)
answered from the store, the same answer behind ``reminder-pipeline trace`` and the
``reminder_trace`` job.

For each reminder: its status, DueAt and SentAt, why it is in that state in words (:func:`reason`,
judged on the database's clock), the run that wrote it (the message's ``correlation-id``) with
its UI address, its outbox row (published when, after how many failed attempts) and where the
message landed (partition and offset, from the delivery report the relay recorded), every
re-publish of it, and, given a check on the consumer's de-duplication store, whether the
notifications side has it as delivered. Identifiers, times, statuses and counts only: never an
event's title, description or location.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from sqlalchemy.engine import Connection, Engine

from ..store import operator_repository

#: The fields of each reminder, in this order (``--json``, ``reminders --json`` and the Dagster
#: cards); see docs/cli.md.
FIELDS = (
    "reminder_id",
    "event_id",
    "kind",
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
    "event_status",
    "outbox_id",
    "republishes",
)


class UnknownId(LookupError):
    """Neither a reminder nor an event has this id."""


def run_url(ui_url: str, run_id: str | None) -> str | None:
    """The Dagster UI's page of a run (``<ui>/runs/<run id>``), None without a run id."""
    return f"{ui_url.rstrip('/')}/runs/{run_id}" if run_id else None


def _at(value: datetime | None) -> str | None:
    """A time as ISO-8601 in UTC, whole seconds (the words of a reason)."""
    return None if value is None else value.astimezone(UTC).isoformat(timespec="seconds")


def _iso(value: Any) -> Any:
    """A time as ISO-8601 text (data for scripts), anything else unchanged."""
    return value.isoformat() if isinstance(value, datetime) else value


def reason(row: Mapping[str, Any], now: datetime) -> str:
    """Why the reminder is in its state, in words, judged at ``now`` (the database's clock)."""
    status, attempts, error = row["status"], int(row["attempts"] or 0), row["last_error"]
    if status == "Sent":
        words = f"sent at {_at(row['sent_at'])}"
        if row["outbox_id"] is None:
            return f"{words}; its outbox row is gone (purged after the retention)"
        if row["published_at"] is None:
            failed = int(row["failed_publish_attempts"] or 0)
            return f"{words}; its message is not published yet ({failed} failed publish attempts)"
        return f"{words}; published at {_at(row['published_at'])}"
    if status == "Skipped":
        if row["event_status"] in ("Cancelled", "Completed"):
            return f"skipped because the event was {row['event_status']}"
        if attempts > 0:
            return f"skipped by an operator after {attempts} failed attempts (last error: {error})"
        return f"skipped (the event is {row['event_status']})"
    reserved_until = row["reserved_until"]
    if row["reserved_by"] and reserved_until is not None and reserved_until > now:
        return f"reserved by run {row['reserved_by']} until {_at(reserved_until)}"
    next_attempt = row["next_attempt_at"]
    if attempts > 0 and next_attempt is not None and next_attempt > now:
        return (
            f"backing off after {attempts} failures (last error: {error}); "
            f"next attempt at {_at(next_attempt)}"
        )
    if attempts > 0:
        return f"failed {attempts} times (last error: {error}); the next cycle tries it again"
    if row["due_at"] > now:
        return f"not due yet (due at {_at(row['due_at'])})"
    return f"due since {_at(row['due_at'])}; the next dispatch cycle takes it"


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
        traced = _items(conn, rows, ui_url=ui_url, delivered=delivered)
    if not rows:
        raise UnknownId(f"no reminder or event has the id {wanted}")
    return traced


def trace_ids(engine: Engine, ids: Sequence[uuid.UUID], *, ui_url: str) -> list[dict[str, Any]]:
    """The trace items of these reminders, in the given order; ids not found are left out."""
    wanted = [uuid.UUID(str(i)) for i in ids]
    with engine.connect() as conn:
        rows = operator_repository.trace_rows_of(conn, wanted)
        by_id = {row["reminder_id"]: row for row in rows}
        ordered = [by_id[i] for i in dict.fromkeys(wanted) if i in by_id]
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
        item.update(
            reminder_id=str(row["reminder_id"]),
            event_id=str(row["event_id"]),
            reason=reason(row, row["checked_at"]),
            run_url=run_url(ui_url, row["run_id"]),
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
