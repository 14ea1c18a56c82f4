"""The relay's lock: one publisher per database, never held across a wait without a bound.

A session advisory lock (``RELAY_LOCK_KEY``) on an AUTOCOMMIT connection. Before taking it the
relay has the server bound the session: with no statement for :data:`RELAY_IDLE_SESSION_SECONDS`
the server ends it (``idle_session_timeout``) and the lock with it, so a relay whose connection
went silent (a stuck peer, dropped packets) lets go within that. While it holds the lock and
waits (on the broker, on the drain's next batch) a :class:`LockKeeper` runs a cheap statement on
the session every :data:`RELAY_KEEPALIVE_SECONDS`, so a live relay is never taken for a silent
one. A relay whose lock session ended fails on its next statement (:class:`RelayLockLost` once a
keep-alive failed) and marks nothing more (docs/design.md, "The relay's lock").
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import Connection, Engine

from ..logs import event
from ..store import metrics_repository, outbox_repository

log = logging.getLogger(__name__)

#: The server ends a relay's lock session after this long without a statement, and the lock with
#: it (``idle_session_timeout``, set on the lock session only): a relay gone silent lets go of the
#: lock within this, inside the 30 s a silent peer may hold anything up.
RELAY_IDLE_SESSION_SECONDS = 20.0
#: A relay holding the lock runs a cheap statement on its lock session this often while it waits
#: (a slow broker, the drain's next batch), so a live relay is never taken for a silent one.
RELAY_KEEPALIVE_SECONDS = 5.0


class RelayLockLost(ConnectionError):
    """The relay's lock session ended while it held the lock; the message is one line."""


class LockKeeper:
    """Runs a cheap statement on the lock session every ``every`` seconds while the relay holds
    the lock, from a daemon thread, on the driver's connection (psycopg serialises it with the
    relay's own statements): the server's idle bound then ends only a session gone silent."""

    def __init__(self, conn: Connection, every: float) -> None:
        self._dbapi = conn.connection.dbapi_connection
        self._every = every
        self._stopped = threading.Event()
        self._mutex = threading.Lock()  # held while a keep-alive statement runs
        self.error: BaseException | None = None
        threading.Thread(target=self._run, name="outbox-relay-keepalive", daemon=True).start()

    def _run(self) -> None:
        while not self._stopped.wait(self._every):
            with self._mutex:
                if self._stopped.is_set():
                    return
                try:
                    outbox_repository.keep_relay_session(self._dbapi)
                except Exception as exc:  # noqa: BLE001 - the session is gone: the relay is told
                    self.error = exc
                    return

    def check(self, run_id: str | None = None) -> None:
        """Raise :class:`RelayLockLost` once a keep-alive statement failed."""
        if self.error is not None:
            raise RelayLockLost(_lost(self.error, run_id)) from None

    def stop(self) -> None:
        """No keep-alive statement runs on the session once this returns."""
        self._stopped.set()
        with self._mutex:
            pass


def _lost(error: BaseException, run_id: str | None) -> str:
    reason = " ".join(str(error).split())[:200] or type(error).__name__
    event(log, logging.ERROR, "relay lock session lost", run_id=run_id, error=reason)
    return (
        f"the relay's database session ended while it held the relay lock ({reason}); "
        "what it published and did not mark goes out again with the next relay"
    )


@contextmanager
def lock_session(
    conn: Connection, take: Callable[[], bool], run_id: str | None
) -> Iterator[LockKeeper | None]:
    """Bound the session (the server's idle bound, the relay's name) and take the lock with
    ``take``; yield its keep-alive, or None when busy; let go of both at the end."""
    outbox_repository.bound_relay_session(conn, RELAY_IDLE_SESSION_SECONDS, run_id or "-")
    keeper: LockKeeper | None = None
    try:
        if take():
            keeper = LockKeeper(conn, RELAY_KEEPALIVE_SECONDS)
        yield keeper
    finally:
        _let_go(conn, keeper, run_id)


def _let_go(conn: Connection, keeper: LockKeeper | None, run_id: str | None) -> None:
    """Release the lock and put the session back. A session that failed is closed instead, never
    waited on: the server drops its lock with it (a lost session took its lock already)."""
    if keeper is not None:
        keeper.stop()
    if conn.invalidated or (keeper is not None and keeper.error is not None):
        conn.invalidate()
        return
    try:
        if keeper is not None:
            outbox_repository.release_relay_lock(conn)
        outbox_repository.unbound_relay_session(conn)
    except sa_exc.DBAPIError as error:
        event(
            log,
            logging.WARNING,
            "relay lock session closed instead of released",
            run_id=run_id,
            error_kind=type(error.orig or error).__name__,
        )
        conn.invalidate()


def lock_holder(conn: Connection, run_id: str | None = None, *, quiet: bool = False) -> str | None:
    """Who holds the relay lock (``pid N (...)``); logged as why this relay is busy."""
    holder = metrics_repository.relay_lock_holder(conn)
    if not quiet:
        event(
            log,
            logging.INFO,
            "relay busy in another process",
            run_id=run_id,
            holder_pid=None if holder is None else holder.pid,
            holder_application_name=None if holder is None else holder.application_name,
            holder_state=None if holder is None else holder.state,
            holder_silent_seconds=None if holder is None else round(holder.silent_seconds, 1),
        )
    return None if holder is None else holder.describe()


@contextmanager
def relay_lock(
    engine: Engine, wait_seconds: float, run_id: str | None = None
) -> Iterator[Connection | None]:
    """Hold the relay's advisory lock for the block; yields None when another relay keeps it.

    The lock session is bounded by the server and kept alive while the block waits (the
    module's docstring).
    """
    with (
        engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn,
        lock_session(
            conn,
            lambda: (
                outbox_repository.try_relay_lock(conn)
                or outbox_repository.wait_relay_lock(conn, wait_seconds)
            ),
            run_id,
        ) as keeper,
    ):
        if keeper is None:
            lock_holder(conn, run_id)
        yield None if keeper is None else conn
