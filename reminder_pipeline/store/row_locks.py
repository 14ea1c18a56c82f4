"""Bounded waits for row locks: an operator's bulk action gives up, naming the rows it could not
take, rather than wait silently behind another session (a long transaction, a stuck cycle)."""

from __future__ import annotations

import uuid
from collections.abc import Sequence

import sqlalchemy as sa
from sqlalchemy import text
from sqlalchemy.engine import Connection

#: PostgreSQL's lock_not_available: a lock wait passed ``lock_timeout`` (or NOWAIT).
LOCK_NOT_AVAILABLE = "55P03"

# This transaction's lock waits end after :ms with lock_not_available (SET LOCAL).
SET_LOCAL_LOCK_TIMEOUT = text("SELECT set_config('lock_timeout', :ms, true)")

# Which of these reminder rows another session holds: those SKIP LOCKED leaves out. The rows
# taken here are released when the caller's transaction ends (it changes nothing).
LOCKABLE_REMINDERS = text(
    """
    SELECT id FROM event_reminders WHERE id = ANY(CAST(:ids AS uuid[]))
       FOR UPDATE SKIP LOCKED
    """
)


def bound_lock_waits(conn: Connection, timeout_ms: int) -> None:
    """Make every lock wait of this transaction end after ``timeout_ms`` (lock_not_available)."""
    conn.execute(SET_LOCAL_LOCK_TIMEOUT, {"ms": f"{max(int(timeout_ms), 1)}ms"})


def is_lock_timeout(error: sa.exc.DBAPIError) -> bool:
    """True when ``error`` is a lock wait that passed its timeout."""
    return getattr(error.orig, "sqlstate", None) == LOCK_NOT_AVAILABLE


def locked_reminders(conn: Connection, ids: Sequence[uuid.UUID | str]) -> list[str]:
    """Of these reminder ids, those whose row another session holds locked now, sorted."""
    if not ids:
        return []
    wanted = sorted({str(i) for i in ids})
    free = {str(r.id) for r in conn.execute(LOCKABLE_REMINDERS, {"ids": wanted})}
    return [i for i in wanted if i not in free]
