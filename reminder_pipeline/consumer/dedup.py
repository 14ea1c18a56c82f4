"""Durable de-duplication by ReminderId: a redelivered message never notifies twice, restarts too.

The store lives with the consumer (a small SQLite file), not in the calendar's database: the
notifications context must not depend on the producer's schema. It records two things:

* each recipient's delivery (``deliveries``), written right after the sink accepted it, so a
  retry after a partial failure (owner notified, client's channel down) does not notify the
  owner again;
* each fully handled reminder (``reminders``), checked first, so a duplicate costs one lookup.

One SQLite file serves the consumers of one host (WAL, ``BEGIN IMMEDIATE``). Consumers on
several hosts (a partition moves between hosts with a rebalance) share
:class:`PostgresDedupStore`: one table, ``reminder_dedup``, in a database of the notifications
side, created by ``docker/postgres/initdb/20-notifications-dedup.sh`` with a login that can only
read and write it.

A store that goes away while the consumer runs (the database restarted, a failover, a disk that
fills) raises :class:`DedupStoreUnavailable`: the runner holds the message's partition, logs the
outage once and probes the store (:meth:`DedupStore.ping`) until it answers. The PostgreSQL store
reconnects on its next call after a lost connection, so the first statement after a restart
succeeds without the runner noticing.
"""

from __future__ import annotations

import sqlite3
import threading
import uuid
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol, Self
from urllib.parse import parse_qs, quote, urlsplit

import psycopg
from psycopg.conninfo import conninfo_to_dict

from ..config import ConfigError, check_database_hosts, libpq_url, mask_secrets
from ..store.pg_client import BoundedConnection, bounded_params, connect_bounded, read_bound

#: How long a delivered reminder can come again: the topic keeps a message 7 days, and the
#: re-publish back-fill re-sends outbox rows up to 168 h old, which then stay 7 days on the topic.
REPLAY_WINDOW = timedelta(days=14)
#: Entries are kept well past the replay window (a DLQ replay by hand may come later still);
#: older entries no longer protect anything.
DEDUP_RETENTION = timedelta(days=30)

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


class DedupStoreUnavailable(RuntimeError):
    """The store cannot answer now (connection lost, server down, disk full): an outage."""


@dataclass(frozen=True)
class Known:
    """What a store remembers of some reminders: the handled ones and the delivered pairs."""

    handled: frozenset[uuid.UUID] = frozenset()
    delivered: frozenset[tuple[uuid.UUID, uuid.UUID]] = frozenset()


@dataclass
class Records:
    """A batch's facts to record in one write: (reminder, recipient, notification) deliveries
    and (reminder, event) handled reminders."""

    deliveries: list[tuple[uuid.UUID, uuid.UUID, uuid.UUID]] = field(default_factory=list)
    handled: list[tuple[uuid.UUID, uuid.UUID]] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.deliveries or self.handled)


#: The SQLite connection's page cache (KiB) and WAL pages between automatic checkpoints.
_SQLITE_CACHE_KIB = 16_384
_SQLITE_CHECKPOINT_PAGES = 4_000

#: Parameters per SQLite statement (its limit is 32,766 since 3.32; well below it).
_SQLITE_CHUNK = 500


class DedupStore(Protocol):
    """What the consumer needs to remember about reminders it has handled."""

    def ping(self) -> None:
        """Return when the store answers; raise :class:`DedupStoreUnavailable` if it does not."""

    def known(self, reminder_ids: Collection[uuid.UUID]) -> Known:
        """One question per batch: which of ``reminder_ids`` are handled, which pairs delivered."""

    def record(self, records: Records) -> None:
        """One write for a batch: its deliveries and its handled reminders, durable on return."""


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


def _unavailable(exc: BaseException) -> DedupStoreUnavailable:
    return DedupStoreUnavailable(" ".join(f"{type(exc).__name__}: {exc}".split())[:300])


class _Closing:
    """A store's connection closed under its lock, the store as a context manager, and the
    one-reminder questions and records (for operators and tests) over the batch ones."""

    _lock: threading.Lock
    _conn: Any

    def known(self, reminder_ids: Collection[uuid.UUID]) -> Known:
        raise NotImplementedError

    def record(self, records: Records) -> None:
        raise NotImplementedError

    def is_handled(self, reminder_id: uuid.UUID) -> bool:
        """True when every notification of ``reminder_id`` has been delivered."""
        return reminder_id in self.known([reminder_id]).handled

    def is_delivered(self, reminder_id: uuid.UUID, recipient_user_id: uuid.UUID) -> bool:
        """True when ``recipient_user_id`` has already been notified of ``reminder_id``."""
        return (reminder_id, recipient_user_id) in self.known([reminder_id]).delivered

    def mark_delivered(
        self, reminder_id: uuid.UUID, recipient_user_id: uuid.UUID, notification_id: uuid.UUID
    ) -> None:
        """Record that the sink accepted one notification."""
        self.record(Records(deliveries=[(reminder_id, recipient_user_id, notification_id)]))

    def mark_handled(self, reminder_id: uuid.UUID, event_id: uuid.UUID) -> None:
        """Record that ``reminder_id`` is done; later copies are duplicates."""
        self.record(Records(handled=[(reminder_id, event_id)]))

    def close(self) -> None:
        """Close the store's connection (the SQLite file, the PostgreSQL session)."""
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


class SqliteDedupStore(_Closing):
    """:class:`DedupStore` in a SQLite file (created on first use, schema included).

    ``read_only`` (an operator's look-up: ``trace --dedup-path``) opens an existing store as it
    is: nothing created, upgraded or pruned; a file that is not a store is
    :class:`DedupStoreError` and stays as it was.
    """

    def __init__(
        self,
        path: Path | str,
        *,
        retention: timedelta = DEDUP_RETENTION,
        read_only: bool = False,
    ) -> None:
        self.path = Path(path).expanduser()
        self._lock = threading.Lock()
        if read_only:
            self._conn = self._open_read_only()
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # isolation_level=None: transactions are explicit (BEGIN IMMEDIATE below), so a write
        # is durable when the call returns. check_same_thread=False + a lock: the runner may be
        # driven from a thread other than the one that opened the store (tests, signal waits).
        self._conn = sqlite3.connect(
            self.path, timeout=30.0, isolation_level=None, check_same_thread=False
        )
        try:
            # WAL + synchronous=NORMAL survives a crash of this process (the restart case); a
            # power loss may forget the last writes: at worst one repeated notification.
            self._conn.execute("PRAGMA journal_mode=WAL")
            self._conn.execute("PRAGMA synchronous=NORMAL")
            # A batch's rows land all over the primary-key indexes (random UUIDs): a page cache
            # that holds them (16 MiB, SQLite's default is 2) and a checkpoint every 4,000 pages
            # of WAL instead of 1,000 write each page, and fsync, far fewer times per batch.
            # Durability is the same: WAL with synchronous=NORMAL, as above.
            self._conn.execute(f"PRAGMA cache_size=-{_SQLITE_CACHE_KIB}")
            self._conn.execute(f"PRAGMA wal_autocheckpoint={_SQLITE_CHECKPOINT_PAGES}")
            self._migrate()
            self.prune(retention)
        except BaseException:
            self._conn.close()
            raise

    def _open_read_only(self) -> sqlite3.Connection:
        """The file opened read-only (``mode=ro``), checked to be a store this consumer reads."""
        uri = f"file:{quote(str(self.path.resolve()))}?mode=ro"
        try:
            conn = sqlite3.connect(
                uri, uri=True, timeout=30.0, isolation_level=None, check_same_thread=False
            )
        except sqlite3.Error as exc:
            raise DedupStoreError(f"{self.path} cannot be opened ({exc})") from None
        try:
            version = int(conn.execute("PRAGMA user_version").fetchone()[0])
            tables = {
                name
                for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
            }
        except sqlite3.Error as exc:
            conn.close()
            raise DedupStoreError(
                f"{self.path} is not the consumer's de-duplication store ({exc})"
            ) from None
        if version > len(_MIGRATIONS):
            conn.close()
            raise DedupStoreError(
                f"{self.path} has schema version {version}, newer than this consumer's "
                f"{len(_MIGRATIONS)}"
            )
        if version == 0 or not {"reminders", "deliveries"} <= tables:
            conn.close()
            raise DedupStoreError(
                f"{self.path} is not the consumer's de-duplication store (no reminders table)"
            )
        return conn

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
        try:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                for sql, params in statements:
                    changed += self._conn.execute(sql, params).rowcount
                self._conn.execute("COMMIT")
            except BaseException:
                if self._conn.in_transaction:
                    self._conn.execute("ROLLBACK")
                raise
        except sqlite3.OperationalError as exc:  # locked past the timeout, disk full, I/O error
            raise _unavailable(exc) from exc
        return changed

    def _exists(self, sql: str, params: tuple[object, ...]) -> bool:
        with self._lock:
            try:
                return self._conn.execute(sql, params).fetchone() is not None
            except sqlite3.OperationalError as exc:
                raise _unavailable(exc) from exc

    def ping(self) -> None:
        """Return when the file can be read; raise :class:`DedupStoreUnavailable` if not."""
        self._exists("SELECT 1 FROM reminders LIMIT 1", ())

    def known(self, reminder_ids: Collection[uuid.UUID]) -> Known:
        """Which of ``reminder_ids`` are handled, and which of their recipients delivered."""
        ids = [str(r) for r in set(reminder_ids)]
        handled: set[uuid.UUID] = set()
        delivered: set[tuple[uuid.UUID, uuid.UUID]] = set()
        with self._lock:
            try:
                for start in range(0, len(ids), _SQLITE_CHUNK):
                    chunk = ids[start : start + _SQLITE_CHUNK]
                    marks = ",".join("?" * len(chunk))
                    for (rid,) in self._conn.execute(
                        f"SELECT reminder_id FROM reminders WHERE reminder_id IN ({marks})", chunk
                    ):
                        handled.add(uuid.UUID(rid))
                    for rid, recipient in self._conn.execute(
                        "SELECT reminder_id, recipient_user_id FROM deliveries "
                        f"WHERE reminder_id IN ({marks})",
                        chunk,
                    ):
                        delivered.add((uuid.UUID(rid), uuid.UUID(recipient)))
            except sqlite3.OperationalError as exc:
                raise _unavailable(exc) from exc
        return Known(frozenset(handled), frozenset(delivered))

    def record(self, records: Records) -> None:
        """Record a batch's deliveries and handled reminders in one immediate transaction."""
        now = _now()
        with self._lock:
            try:
                self._conn.execute("BEGIN IMMEDIATE")
                try:
                    self._conn.executemany(
                        "INSERT OR IGNORE INTO deliveries "
                        "(reminder_id, recipient_user_id, notification_id, delivered_at) "
                        "VALUES (?, ?, ?, ?)",
                        [(str(r), str(u), str(n), now) for r, u, n in records.deliveries],
                    )
                    self._conn.executemany(
                        "INSERT OR IGNORE INTO reminders (reminder_id, event_id, handled_at) "
                        "VALUES (?, ?, ?)",
                        [(str(r), str(e), now) for r, e in records.handled],
                    )
                    self._conn.execute("COMMIT")
                except BaseException:
                    if self._conn.in_transaction:
                        self._conn.execute("ROLLBACK")
                    raise
            except sqlite3.OperationalError as exc:
                raise _unavailable(exc) from exc

    def prune(self, retention: timedelta = DEDUP_RETENTION) -> int:
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


#: The shared store's table (docker/postgres/initdb/20-notifications-dedup.sh creates it). One
#: row per recipient notified, and one per reminder fully handled, whose recipient is the nil
#: UUID (:data:`HANDLED`): both facts in one table a narrow login can be granted.
PG_TABLE = "reminder_dedup"
HANDLED = uuid.UUID(int=0)
#: The shared store's statements are look-ups by primary key and one insert per batch
#: (milliseconds). A store that does not answer within the read bound past this (10 s in all)
#: is an outage: ``dependency_up{dependency="dedup_store"}`` 0 and one log line (.outages).
STORE_STATEMENT_TIMEOUT_MS = 5 * 1000
#: The start-up prune deletes a day's entries or more at once.
PRUNE_STATEMENT_TIMEOUT_MS = 120_000


def psycopg_dsn(url: str) -> str:
    """A libpq URL from a SQLAlchemy-style one (``postgresql+psycopg://`` → ``postgresql://``).

    The host may be in the authority or, as libpq allows, in the query (``?host=/socket/dir``);
    several servers in SQLAlchemy's multi-host form (``?host=HostA:PortA&host=HostB:PortB``) or
    libpq's (``HostA:PortA,HostB:PortB`` in the authority, or ``?host=HostA,HostB&port=PA,PB``).
    """
    parts = urlsplit(url)
    scheme = parts.scheme.split("+", 1)[0]
    query = parse_qs(parts.query)
    has_host = bool(parts.hostname) or any(query.get(name) for name in ("host", "hostaddr"))
    if scheme not in ("postgresql", "postgres") or not has_host:
        shown = mask_secrets(url.strip())  # the value as given (not its scheme), no password
        raise ConfigError(f"--dedup-url: {shown!r} is not a postgresql:// URL with a host")
    check_database_hosts(url, "--dedup-url")
    return libpq_url(url)


def _host(dsn: str) -> str:
    """The host (or socket directory) a libpq URL names, for one-line errors."""
    try:
        return str(conninfo_to_dict(dsn).get("host") or "?")
    except psycopg.Error:
        return "?"


class PostgresDedupStore(_Closing):
    """:class:`DedupStore` in a PostgreSQL table shared by consumers on any number of hosts.

    ``read_only`` (an operator's look-up: ``trace --dedup-url``) only reads: no prune, a session
    whose transactions are read-only, so a login granted SELECT alone is enough.
    """

    _conn: BoundedConnection[tuple[Any, ...]]

    def __init__(
        self, url: str, *, retention: timedelta = DEDUP_RETENTION, read_only: bool = False
    ) -> None:
        self._dsn = psycopg_dsn(url)
        self._read_only = read_only
        try:
            self._conn = self._connect()
        except psycopg.Error as exc:
            raise DedupStoreError(
                f"--dedup-url: cannot connect to {_host(self._dsn)} "
                f"({' '.join(str(exc).split())[:200]})"
            ) from None
        self._lock = threading.Lock()
        try:
            self._conn.execute(f"SELECT reminder_id FROM {PG_TABLE} LIMIT 0")
        except psycopg.Error as exc:
            self._conn.close()
            raise DedupStoreError(
                f"--dedup-url: table {PG_TABLE} missing or not readable by this login "
                f"({type(exc).__name__}); create it with "
                "docker/postgres/initdb/20-notifications-dedup.sh"
            ) from None
        if not read_only:
            self.prune(retention)

    def _connect(self) -> BoundedConnection[tuple[Any, ...]]:
        """A bounded session (:mod:`reminder_pipeline.store.pg_client`): a store that goes silent is
        an outage within :data:`STORE_STATEMENT_TIMEOUT_MS` + the read margin (10 s), not a hang."""
        params = bounded_params(conninfo_to_dict(self._dsn), STORE_STATEMENT_TIMEOUT_MS)
        # autocommit: each write is durable when the call returns, like the SQLite store.
        conn = connect_bounded(read_bound(STORE_STATEMENT_TIMEOUT_MS), autocommit=True, **params)
        if self._read_only:  # the server refuses any write of this session
            conn.execute("SET default_transaction_read_only = on")
        return conn

    def _run(
        self, sql: str, params: tuple[object, ...] = (), *, timeout_ms: int | None = None
    ) -> psycopg.Cursor[tuple[Any, ...]]:
        """Run one statement, reconnecting first when the session was lost.

        A statement that fails because the connection broke (the server restarted, or went
        silent past the read bound) is run once more on a new connection: every statement here
        is a read or an idempotent write. A server that does not take a new connection, or
        does not answer, is :class:`DedupStoreUnavailable` at once; the next call reconnects.
        ``timeout_ms`` gives one statement a longer bound than the store's.
        """
        with self._lock:
            for attempt in (1, 2):
                try:
                    if self._conn.closed:
                        self._conn = self._connect()
                except psycopg.OperationalError as exc:
                    raise _unavailable(exc) from exc
                try:
                    if timeout_ms is None:
                        return self._conn.execute(sql, params)
                    return self._longer(sql, params, timeout_ms)
                except psycopg.OperationalError as exc:
                    if attempt == 2 or not self._conn.closed:
                        raise _unavailable(exc) from exc
            raise AssertionError("unreachable")

    def _longer(
        self, sql: str, params: tuple[object, ...], timeout_ms: int
    ) -> psycopg.Cursor[tuple[Any, ...]]:
        """``sql`` under a statement timeout of ``timeout_ms``, server and client side."""
        self._conn.read_timeout = read_bound(timeout_ms)
        try:
            with self._conn.transaction():
                self._conn.execute(f"SET LOCAL statement_timeout = {int(timeout_ms)}")
                return self._conn.execute(sql, params)
        finally:
            self._conn.read_timeout = read_bound(STORE_STATEMENT_TIMEOUT_MS)

    def ping(self) -> None:
        """Return when the table answers (reconnecting first), else DedupStoreUnavailable."""
        self._run(f"SELECT 1 FROM {PG_TABLE} LIMIT 1").fetchall()

    def known(self, reminder_ids: Collection[uuid.UUID]) -> Known:
        """Which of ``reminder_ids`` are handled, and which of their recipients delivered."""
        rows = self._run(
            f"SELECT reminder_id, recipient_user_id FROM {PG_TABLE} WHERE reminder_id = ANY(%b)",
            (list(set(reminder_ids)),),
        ).fetchall()
        return Known(
            frozenset(r for r, u in rows if u == HANDLED),
            frozenset((r, u) for r, u in rows if u != HANDLED),
        )

    def record(self, records: Records) -> None:
        """Record a batch's deliveries and handled reminders in one statement."""
        rows: Sequence[tuple[uuid.UUID, uuid.UUID, uuid.UUID]] = [
            *records.deliveries,
            *((r, HANDLED, e) for r, e in records.handled),
        ]
        # ON CONFLICT DO NOTHING: two hosts recording the same fact both succeed. The arrays go
        # in binary (%b): 16 bytes per UUID, not a text literal quoted element by element.
        self._run(
            f"INSERT INTO {PG_TABLE} (reminder_id, recipient_user_id, other_id) "
            "SELECT * FROM unnest(%b::uuid[], %b::uuid[], %b::uuid[]) ON CONFLICT DO NOTHING",
            tuple([row[i] for row in rows] for i in range(3)),
        )

    def prune(self, retention: timedelta = DEDUP_RETENTION) -> int:
        """Forget entries older than ``retention`` (the database's clock); returns how many."""
        cursor = self._run(
            f"DELETE FROM {PG_TABLE} WHERE recorded_at < now() - %s",
            (retention,),
            timeout_ms=PRUNE_STATEMENT_TIMEOUT_MS,
        )
        return cursor.rowcount

    def counts(self) -> tuple[int, int]:
        """(handled reminders, delivered notifications) currently remembered."""
        row = self._run(
            f"SELECT count(*) FILTER (WHERE recipient_user_id = %s), "
            f"count(*) FILTER (WHERE recipient_user_id <> %s) FROM {PG_TABLE}",
            (HANDLED, HANDLED),
        ).fetchone()
        assert row is not None
        return int(row[0]), int(row[1])
