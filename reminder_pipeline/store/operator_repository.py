"""Repository functions of the operators' use cases (poison rows, the trace): each on a Connection.

The statements are in :mod:`.operator_queries`; the callers own the transactions.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy.engine import Connection

from ..config import DEFAULT_POISON_LIMIT
from ..domain.writers import WRITER_POISON_SKIP
from . import operator_queries as queries


@dataclass(frozen=True)
class PoisonFilter:
    """Which poison rows a bulk action takes: every given condition holds (none given: all)."""

    event_id: uuid.UUID | None = None
    kind: str | None = None
    failed_since: datetime | None = None

    def described(self) -> dict[str, Any]:
        """The filter for a log line or an output: ``all`` or its given conditions, as text."""
        given = {
            "event_id": None if self.event_id is None else str(self.event_id),
            "kind": self.kind,
            "failed_since": None if self.failed_since is None else self.failed_since.isoformat(),
        }
        return {k: v for k, v in given.items() if v is not None} or {"all": True}

    def params(self) -> dict[str, Any]:
        """The filter's statement parameters."""
        return {
            "event_id": self.event_id,
            "kind": self.kind,
            "failed_since": self.failed_since,
        }


def list_poison(conn: Connection, limit: int = DEFAULT_POISON_LIMIT) -> list[dict[str, Any]]:
    """Pending rows with failed attempts, oldest first, with their last error."""
    return [dict(r._mapping) for r in conn.execute(queries.LIST_POISON, {"limit": limit})]


def retry_poison_now(conn: Connection, reminder_id: uuid.UUID, *, force: bool = False) -> bool:
    """Clear a poison row's back-off so the next cycle tries it.

    False (nothing changed) unless the row is Pending and has failed (attempts > 0); ``force``
    drops the second condition.
    """
    params = {"id": reminder_id, "force": force}
    return conn.execute(queries.RETRY_POISON_NOW, params).first() is not None


def skip_poison(
    conn: Connection, reminder_id: uuid.UUID, *, force: bool = False, run_id: str | None = None
) -> bool:
    """Move a poison row to Skipped (never published); False unless Pending and failed or forced.

    The row records the operator's skip as its writer, and ``run_id`` (the Dagster run doing it).
    """
    params = {
        "id": reminder_id,
        "force": force,
        "moved_by": WRITER_POISON_SKIP,
        "moved_in_run": run_id,
    }
    return conn.execute(queries.SKIP_POISON, params).first() is not None


def reminder_operator_state(conn: Connection, reminder_id: uuid.UUID) -> tuple[str, int] | None:
    """(status, attempts) of a reminder, or None when there is no such row."""
    row = conn.execute(queries.REMINDER_OPERATOR_STATE, {"id": reminder_id}).first()
    return None if row is None else (str(row.status), int(row.attempts))


def poison_by_filter(conn: Connection, selected: PoisonFilter) -> list[dict[str, Any]]:
    """The poison rows ``selected`` takes, oldest due first (ids, attempts and times only)."""
    rows = conn.execute(queries.SELECT_POISON_BY_FILTER, selected.params())
    return [dict(r._mapping) for r in rows]


def change_poison_by_filter(
    conn: Connection, action: str, selected: PoisonFilter, *, run_id: str | None = None
) -> list[str]:
    """Retry or skip every poison row ``selected`` takes (re-checked under the row locks); the
    ids changed. A skip records the operator's skip and ``run_id`` (the Dagster run) on each."""
    if action == "retry":
        rows = conn.execute(queries.RETRY_POISON_BY_FILTER, selected.params())
    else:
        params = {**selected.params(), "moved_by": WRITER_POISON_SKIP, "moved_in_run": run_id}
        rows = conn.execute(queries.SKIP_POISON_BY_FILTER, params)
    return sorted(str(r.id) for r in rows)


def trace_rows(conn: Connection, reminder_or_event_id: uuid.UUID) -> list[dict[str, Any]]:
    """The reminder with this id, or every reminder of the event with this id, with its event's
    status, its outbox row, where that landed and the run that wrote it; due order."""
    rows = conn.execute(
        queries.TRACE_REMINDERS, {"ids": [reminder_or_event_id], "event_id": reminder_or_event_id}
    )
    return [dict(r._mapping) for r in rows]


def trace_rows_of(conn: Connection, reminder_ids: Sequence[uuid.UUID]) -> list[dict[str, Any]]:
    """The trace rows of these reminders (as :func:`trace_rows`)."""
    if not reminder_ids:
        return []
    rows = conn.execute(queries.TRACE_REMINDERS, {"ids": list(reminder_ids), "event_id": None})
    return [dict(r._mapping) for r in rows]


def outbox_only_rows(conn: Connection, reminder_ids: Sequence[uuid.UUID]) -> list[dict[str, Any]]:
    """The outbox rows of these ReminderIds whose reminder row is gone (no particular order)."""
    if not reminder_ids:
        return []
    rows = conn.execute(queries.TRACE_OUTBOX_ONLY, {"ids": list(reminder_ids)})
    return [dict(r._mapping) for r in rows]


def republishes_of(conn: Connection, reminder_ids: Sequence[uuid.UUID]) -> list[dict[str, Any]]:
    """Every recorded re-publish of these reminders, oldest first."""
    if not reminder_ids:
        return []
    rows = conn.execute(queries.REPUBLISHES_OF, {"ids": list(reminder_ids)})
    return [dict(r._mapping) for r in rows]


def record_republishes(
    conn: Connection, run_id: str, landed: Sequence[tuple[int, int | None, int | None]]
) -> int:
    """Record the delivered re-publishes (outbox id, partition, offset) of run ``run_id``."""
    if not landed:
        return 0
    outbox_ids, partitions, offsets = zip(*landed, strict=True)
    params = {
        "run_id": run_id,
        "outbox_ids": list(outbox_ids),
        "partitions": list(partitions),
        "offsets": list(offsets),
    }
    return conn.execute(queries.RECORD_REPUBLISHES, params).rowcount
