"""Durable de-duplication by ReminderId: a redelivered message never notifies twice, restarts too.

The store lives with the consumer (a small SQLite file), not in the calendar's database: the
notifications context must not depend on the producer's schema. It records two things:

* each recipient's delivery (``deliveries``), written right after the sink accepted it, so a
  retry after a partial failure (owner notified, client's channel down) does not notify the
  owner again;
* each fully handled reminder (``reminders``), checked first, so a duplicate costs one lookup.

One SQLite file serves the consumers of one host (WAL, ``BEGIN IMMEDIATE``); consumers of one
group spread over several hosts need a shared implementation of :class:`DedupStore` instead
(e.g. a table in the notifications database), because a partition may move between hosts.
"""

from __future__ import annotations

import sqlite3
import threading
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import TracebackType
from typing import Protocol, Self

#: Well above Kafka's default 7-day retention: a redelivery can only come from what the topic
#: still holds (or a DLQ replay), so older entries no longer protect anything.
DEFAULT_RETENTION = timedelta(days=30)

#: The file's schema, one entry per version (PRAGMA user_version): a new version appends an
#: entry, so a file written by an older consumer is upgraded in place on open.
_MIGRATIONS: tuple[tuple[str, ...], ...] = (
    (
        """
        CREATE TABLE reminders (
            reminder_id  TEXT PRIMARY KEY,
            event_id     TEXT NOT NULL,
            handled_at   TEXT NOT NULL
        )
        """,
        """
        CREATE TABLE deliveries (
            reminder_id        TEXT NOT NULL,
            recipient_user_id  TEXT NOT NULL,
            notification_id    TEXT NOT NULL,
            delivered_at       TEXT NOT NULL,
            PRIMARY KEY (reminder_id, recipient_user_id)
        )
        """,
        "CREATE INDEX reminders_handled_at ON reminders (handled_at)",
        "CREATE INDEX deliveries_delivered_at ON deliveries (delivered_at)",
    ),
)


class DedupStoreError(RuntimeError):
    """The de-duplication file cannot be used (written by a newer consumer, unreadable)."""


class DedupStore(Protocol):
    """What the consumer needs to remember about reminders it has handled."""

    def is_handled(self, reminder_id: uuid.UUID) -> bool:
        """True when every notification of ``reminder_id`` has been delivered."""

    def is_delivered(self, reminder_id: uuid.UUID, recipient_user_id: uuid.UUID) -> bool:
        """True when ``recipient_user_id`` has already been notified of ``reminder_id``."""

    def mark_delivered(
        self, reminder_id: uuid.UUID, recipient_user_id: uuid.UUID, notification_id: uuid.UUID
    ) -> None:
        """Record that the sink accepted one notification."""

    def mark_handled(self, reminder_id: uuid.UUID, event_id: uuid.UUID) -> None:
        """Record that ``reminder_id`` is done; later copies are duplicates."""


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


class SqliteDedupStore:
    """:class:`DedupStore` in a SQLite file (created on first use, schema included)."""

    def __init__(self, path: Path | str, *, retention: timedelta = DEFAULT_RETENTION) -> None:
        self.path = Path(path).expanduser()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # isolation_level=None: transactions are explicit (BEGIN IMMEDIATE below), so a write
        # is durable when the call returns. check_same_thread=False + a lock: the runner may be
        # driven from a thread other than the one that opened the store (tests, signal waits).
        self._conn = sqlite3.connect(
            self.path, timeout=30.0, isolation_level=None, check_same_thread=False
        )
        self._lock = threading.Lock()
        try:
            # WAL + synchronous=NORMAL survives a crash of this process (the restart case); a
            # power loss may forget the last writes: at worst one repeated notification.
            self._conn.execute("PRAGMA journal_mode=WAL")
            self._conn.execute("PRAGMA synchronous=NORMAL")
            self._migrate()
            self.prune(retention)
        except BaseException:
            self._conn.close()
            raise

    def _migrate(self) -> None:
        """Bring the file to the newest schema version, in one transaction."""
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                version = int(self._conn.execute("PRAGMA user_version").fetchone()[0])
                if version > len(_MIGRATIONS):
                    raise DedupStoreError(
                        f"{self.path} has schema version {version}, newer than this consumer's "
                        f"{len(_MIGRATIONS)}"
                    )
                for number, statements in enumerate(_MIGRATIONS[version:], start=version + 1):
                    for sql in statements:
                        self._conn.execute(sql)
                    self._conn.execute(f"PRAGMA user_version = {number}")
                self._conn.execute("COMMIT")
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise

    def _write(self, *statements: tuple[str, tuple[object, ...]]) -> int:
        """Run ``statements`` in one immediate transaction (other processes wait, not fail)."""
        changed = 0
        self._conn.execute("BEGIN IMMEDIATE")
        try:
            for sql, params in statements:
                changed += self._conn.execute(sql, params).rowcount
            self._conn.execute("COMMIT")
        except BaseException:
            self._conn.execute("ROLLBACK")
            raise
        return changed

    def is_handled(self, reminder_id: uuid.UUID) -> bool:
        """True when every notification of ``reminder_id`` has been delivered."""
        with self._lock:
            row = self._conn.execute(
                "SELECT 1 FROM reminders WHERE reminder_id = ?", (str(reminder_id),)
            ).fetchone()
        return row is not None

    def is_delivered(self, reminder_id: uuid.UUID, recipient_user_id: uuid.UUID) -> bool:
        """True when ``recipient_user_id`` has already been notified of ``reminder_id``."""
        with self._lock:
            row = self._conn.execute(
                "SELECT 1 FROM deliveries WHERE reminder_id = ? AND recipient_user_id = ?",
                (str(reminder_id), str(recipient_user_id)),
            ).fetchone()
        return row is not None

    def mark_delivered(
        self, reminder_id: uuid.UUID, recipient_user_id: uuid.UUID, notification_id: uuid.UUID
    ) -> None:
        """Record that the sink accepted one notification."""
        with self._lock:
            self._write(
                (
                    (
                        "INSERT OR IGNORE INTO deliveries "
                        "(reminder_id, recipient_user_id, notification_id, delivered_at) "
                        "VALUES (?, ?, ?, ?)"
                    ),
                    (str(reminder_id), str(recipient_user_id), str(notification_id), _now()),
                )
            )

    def mark_handled(self, reminder_id: uuid.UUID, event_id: uuid.UUID) -> None:
        """Record that ``reminder_id`` is done; later copies are duplicates."""
        with self._lock:
            self._write(
                (
                    (
                        "INSERT OR IGNORE INTO reminders (reminder_id, event_id, handled_at) "
                        "VALUES (?, ?, ?)"
                    ),
                    (str(reminder_id), str(event_id), _now()),
                )
            )

    def prune(self, retention: timedelta = DEFAULT_RETENTION) -> int:
        """Forget entries older than ``retention``; returns how many rows went."""
        cutoff = (datetime.now(UTC) - retention).isoformat(timespec="milliseconds")
        with self._lock:
            return self._write(
                ("DELETE FROM deliveries WHERE delivered_at < ?", (cutoff,)),
                ("DELETE FROM reminders WHERE handled_at < ?", (cutoff,)),
            )

    def counts(self) -> tuple[int, int]:
        """(handled reminders, delivered notifications) currently remembered."""
        with self._lock:
            reminders = self._conn.execute("SELECT count(*) FROM reminders").fetchone()[0]
            deliveries = self._conn.execute("SELECT count(*) FROM deliveries").fetchone()[0]
        return int(reminders), int(deliveries)

    def close(self) -> None:
        """Close the file."""
        with self._lock:
            self._conn.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
