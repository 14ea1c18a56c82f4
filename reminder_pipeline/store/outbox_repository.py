"""Repository functions of the outbox, each on a Connection (the caller's transaction or the relay's
lock session): the relay's reads and marks, its lock, the outbox's lag, its retention and the
re-publish back-fill's reads."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from ..domain.model import ClaimedMessage
from . import outbox_queries as queries


@dataclass(frozen=True)
class OutboxLag:
    """Unpublished outbox rows and the age of the oldest one."""

    unpublished: int
    oldest_unpublished_age_seconds: float | None


def outbox_lag(conn: Connection) -> OutboxLag:
    """The relay's lag, for metrics and checks."""
    row = conn.execute(queries.OUTBOX_LAG).one()
    age = row.oldest_unpublished_age_seconds
    return OutboxLag(int(row.unpublished), None if age is None else float(age))


# --- relay -------------------------------------------------------------------------------


class StatementSnapshot(NamedTuple):
    """The snapshot a statement read on: its xmin (every older transaction had ended) and xmax
    (every transaction from it on had not begun), as 64-bit transaction ids."""

    xmin: int
    xmax: int


@dataclass(frozen=True)
class UnpublishedRead:
    """Unpublished outbox rows read from a low-water mark on, in id order, on ``snapshot``.

    ``clean_to``: every id from the low-water mark below it was published, or not committed, on
    that snapshot (the first row read; with none, past the newest id it could see or ``up_to``).
    """

    messages: list[ClaimedMessage]
    snapshot: StatementSnapshot
    clean_to: int


def unpublished(
    conn: Connection, limit: int, *, low: int, up_to: int | None = None
) -> UnpublishedRead:
    """The oldest unpublished outbox rows with an id from ``low`` on (up to ``up_to`` if given)."""
    rows = conn.execute(
        queries.SELECT_UNPUBLISHED, {"limit": limit, "low": low, "up_to": up_to}
    ).all()
    first = rows[0]
    messages = [
        ClaimedMessage(r.id, r.topic, r.message_key, r.payload, dict(r.headers or {}))
        for r in rows
        if r.id is not None
    ]
    if messages:
        clean_to = messages[0].id
    else:
        newest = low - 1 if first.newest_id is None else int(first.newest_id)
        clean_to = max(low, (newest if up_to is None else min(newest, up_to)) + 1)
    return UnpublishedRead(
        messages, StatementSnapshot(int(first.snapshot_xmin), int(first.snapshot_xmax)), clean_to
    )


def last_outbox_id(conn: Connection) -> int | None:
    """The newest outbox row's id, None when the outbox is empty."""
    value = conn.execute(queries.LAST_OUTBOX_ID).scalar_one()
    return None if value is None else int(value)


def mark_published(conn: Connection, landed: Sequence[tuple[int, int | None, int | None]]) -> int:
    """Mark outbox rows (id, partition, offset) published where they landed; how many changed."""
    if not landed:
        return 0
    where = {str(i): [partition, offset] for i, partition, offset in landed}
    params = {"ids": [i for i, _, _ in landed], "landed": where}
    return conn.execute(queries.MARK_PUBLISHED, params).rowcount


def first_unpublished_before(
    conn: Connection, low: int, outbox_id: int
) -> tuple[int | None, StatementSnapshot]:
    """The first unpublished outbox row with an id from ``low`` up to ``outbox_id`` (excluded),
    None when there is none, and the snapshot that says so."""
    row = conn.execute(queries.FIRST_UNPUBLISHED_BEFORE, {"low": low, "id": outbox_id}).one()
    first = None if row.first_id is None else int(row.first_id)
    return first, StatementSnapshot(int(row.snapshot_xmin), int(row.snapshot_xmax))


def relay_low_water(conn: Connection) -> int:
    """The relay's low-water mark: every outbox row with a smaller id is published."""
    return int(conn.execute(queries.RELAY_LOW_WATER).scalar_one())


def set_relay_low_water(conn: Connection, low_water: int) -> None:
    """Move the relay's low-water mark up to ``low_water`` (never down)."""
    conn.execute(queries.SET_RELAY_LOW_WATER, {"low_water": low_water})


def record_publish_failures(conn: Connection, ids: Sequence[int]) -> int:
    """Count one more failed publish attempt on each of these (still unpublished) rows."""
    if not ids:
        return 0
    return conn.execute(queries.RECORD_PUBLISH_FAILURES, {"ids": list(ids)}).rowcount


def try_relay_lock(conn: Connection) -> bool:
    """Take the relay's session advisory lock without waiting."""
    return bool(conn.execute(queries.TRY_RELAY_LOCK, {"key": queries.RELAY_LOCK_KEY}).scalar_one())


def wait_relay_lock(conn: Connection, timeout_seconds: float) -> bool:
    """Wait up to ``timeout_seconds`` for the relay lock; False when it stayed busy."""
    conn.exec_driver_sql(f"SET lock_timeout = '{int(max(timeout_seconds, 0.001) * 1000)}ms'")
    try:
        conn.execute(queries.RELAY_LOCK, {"key": queries.RELAY_LOCK_KEY})
        return True
    except sa.exc.OperationalError as exc:
        if getattr(exc.orig, "sqlstate", None) == "55P03":  # lock_not_available
            return False
        raise
    finally:
        conn.exec_driver_sql("SET lock_timeout = 0")


def release_relay_lock(conn: Connection) -> None:
    """Release the relay's session advisory lock."""
    conn.execute(queries.RELAY_UNLOCK, {"key": queries.RELAY_LOCK_KEY})


def bound_relay_session(conn: Connection, idle_seconds: float, who: str) -> None:
    """Have the server end this session after ``idle_seconds`` without a statement (and its
    advisory lock with it); name it the relay of ``who`` in pg_stat_activity."""
    conn.execute(queries.RELAY_SESSION_BOUND, {"idle": f"{int(idle_seconds * 1000)}ms", "who": who})


def unbound_relay_session(conn: Connection) -> None:
    """Put back what :func:`bound_relay_session` changed (before the connection is pooled)."""
    for statement in queries.RELAY_SESSION_RESET:
        conn.exec_driver_sql(statement)


def keep_relay_session(dbapi_connection: Any) -> None:
    """One cheap statement on the lock session's driver connection (psycopg's are thread-safe):
    the relay's keep-alive thread runs it while the relay waits."""
    dbapi_connection.execute(queries.RELAY_KEEPALIVE)


def count_unpublished_in(conn: Connection, spans: Sequence[tuple[int, int]]) -> int:
    """How many outbox rows with an id in one of ``spans`` (first, last) are unpublished."""
    if not spans:
        return 0
    params = {"firsts": [first for first, _ in spans], "lasts": [last for _, last in spans]}
    return int(conn.execute(queries.COUNT_UNPUBLISHED_IN_SPANS, params).scalar_one())


def purge_published_outbox(conn: Connection, retention_seconds: float, limit: int) -> int:
    """Delete up to ``limit`` outbox rows published more than ``retention_seconds`` ago, and
    their re-publish records with them; returns how many outbox rows went."""
    row = conn.execute(
        queries.PURGE_PUBLISHED_OUTBOX, {"retention_seconds": retention_seconds, "limit": limit}
    ).one()
    return int(row.purged)


# --- re-publish back-fill ------------------------------------------------------------------


@dataclass(frozen=True)
class DayBounds:
    """A DueAt day's outbox rows: the published id range and how many are (un)published."""

    first_id: int | None
    last_id: int | None
    published: int
    unpublished: int


def republish_day_bounds(conn: Connection, day_start: datetime, day_end: datetime) -> DayBounds:
    """The published id range and counts of the outbox rows due in ``[day_start, day_end)``."""
    row = conn.execute(
        queries.REPUBLISH_DAY_BOUNDS, {"day_start": day_start, "day_end": day_end}
    ).one()
    return DayBounds(row.first_id, row.last_id, int(row.published), int(row.unpublished))


def sent_of_day(conn: Connection, day_start: datetime, day_end: datetime) -> int:
    """How many reminders due in ``[day_start, day_end)`` are Sent (one outbox row each)."""
    return int(
        conn.execute(
            queries.COUNT_SENT_OF_DAY, {"day_start": day_start, "day_end": day_end}
        ).scalar_one()
    )


@dataclass(frozen=True)
class PublishedRow:
    """A published outbox row of a day, and why it no longer holds (``stale``; None if it does)."""

    message: ClaimedMessage
    reminder_id: str | None
    event_id: str | None
    stale: str | None


def published_of_day(
    conn: Connection,
    day_start: datetime,
    day_end: datetime,
    *,
    after_id: int,
    last_id: int,
    limit: int,
) -> list[PublishedRow]:
    """Up to ``limit`` published rows due in ``[day_start, day_end)``, ids after ``after_id``."""
    rows = conn.execute(
        queries.SELECT_PUBLISHED_OF_DAY,
        {
            "day_start": day_start,
            "day_end": day_end,
            "after_id": after_id,
            "last_id": last_id,
            "limit": limit,
        },
    ).all()
    return [
        PublishedRow(
            ClaimedMessage(r.id, r.topic, r.message_key, r.payload, dict(r.headers or {})),
            r.reminder_id,
            r.event_id,
            r.stale,
        )
        for r in rows
    ]
