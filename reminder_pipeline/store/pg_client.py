"""How every PostgreSQL client of the package connects: bounds that notice a silent peer.

A database whose packets are dropped (a firewall, a NAT timeout, a moved address, a failover's
old primary) or that keeps its sockets open and answers nothing never closes a connection: a
client without bounds waits on a read for as long as the kernel lets it (about 15 minutes with
Linux's ``tcp_retries2``; for ever on an idle read, or through a peer whose kernel still ACKs).
So every connection here has, on the client side (docs/configuration.md, "Connection bounds"):

* ``connect_timeout``: a server that does not finish the handshake is given up on;
* TCP keepalives (:data:`KEEPALIVE_IDLE_SECONDS` + :data:`KEEPALIVE_COUNT` x
  :data:`KEEPALIVE_INTERVAL_SECONDS` = 25 s) and ``tcp_user_timeout``
  (:data:`TCP_USER_TIMEOUT_MS`): the kernel ends a connection whose peer stopped answering,
  idle or mid-statement, within 25 s;
* a read bound (:class:`BoundedConnection`): no wait for an answer lasts longer than the
  statement timeout plus :data:`READ_MARGIN_SECONDS`. It is the only bound that sees a peer
  that keeps ACKing and sends nothing (a hung proxy, a frozen server). On expiry the connection
  is closed and the call fails with one line, so a pool sees a disconnect and replaces it.

And on the server side, for each session (libpq's ``options``): the same keepalives and
``tcp_user_timeout``, a ``statement_timeout`` suited to the connection's use, and an
``idle_in_transaction_session_timeout``: a client that went silent loses its session, its
transaction, its row locks and its advisory locks within about 30 s.

Settings a URL gives itself (``?keepalives_idle=…``, ``?options=-c …``) win over these defaults.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import psycopg
from psycopg import errors
from psycopg.abc import RV, PQGen
from psycopg.rows import Row

#: A server that does not finish the handshake (per host of a multi-host URL) is given up on.
CONNECT_TIMEOUT_SECONDS = 5
#: TCP keepalives, both ends: the first probe after 10 s without traffic, then one every 5 s; the
#: third unanswered one ends the connection, 25 s after the peer fell silent.
KEEPALIVE_IDLE_SECONDS = 10
KEEPALIVE_INTERVAL_SECONDS = 5
KEEPALIVE_COUNT = 3
#: Data sent and not acknowledged for this long ends the connection (a packet drop during a
#: statement, when keepalives do not run), both ends.
TCP_USER_TIMEOUT_MS = 25_000
#: How much longer than the statement timeout a client waits for an answer: when the server is
#: there, its own cancel (``statement_timeout``) arrives first and the connection stays usable.
READ_MARGIN_SECONDS = 5.0
#: A session left idle inside a transaction is ended by the server (our transactions last
#: milliseconds; none is held across a network wait on purpose): its locks go with it.
IDLE_IN_TRANSACTION_TIMEOUT_MS = 30_000
#: The server checks the client's socket this often while a query runs: a client that is gone
#: (closed or reset) does not keep a statement and its locks.
CLIENT_CHECK_INTERVAL_MS = 5 * 1000


def read_bound(statement_timeout_ms: int) -> float | None:
    """Seconds a client waits for an answer under ``statement_timeout_ms`` (0: no bound)."""
    return statement_timeout_ms / 1000 + READ_MARGIN_SECONDS if statement_timeout_ms else None


def client_params(connect_timeout: int = CONNECT_TIMEOUT_SECONDS) -> dict[str, int]:
    """libpq's client-side bounds: connect timeout, keepalives, ``tcp_user_timeout``."""
    return {
        "connect_timeout": connect_timeout,
        "keepalives": 1,
        "keepalives_idle": KEEPALIVE_IDLE_SECONDS,
        "keepalives_interval": KEEPALIVE_INTERVAL_SECONDS,
        "keepalives_count": KEEPALIVE_COUNT,
        "tcp_user_timeout": TCP_USER_TIMEOUT_MS,
    }


def session_settings(
    statement_timeout_ms: int, *more: str, idle_in_transaction: bool = True
) -> list[str]:
    """The server side of a session (``name=value``, for libpq's ``options``): the same
    keepalives and ``tcp_user_timeout``, the statement (and idle-in-transaction) timeouts,
    then ``more``."""
    return [
        f"tcp_keepalives_idle={KEEPALIVE_IDLE_SECONDS}",
        f"tcp_keepalives_interval={KEEPALIVE_INTERVAL_SECONDS}",
        f"tcp_keepalives_count={KEEPALIVE_COUNT}",
        f"tcp_user_timeout={TCP_USER_TIMEOUT_MS}",
        f"client_connection_check_interval={CLIENT_CHECK_INTERVAL_MS}",
        *(
            [f"idle_in_transaction_session_timeout={IDLE_IN_TRANSACTION_TIMEOUT_MS}"]
            if idle_in_transaction
            else []
        ),
        f"statement_timeout={statement_timeout_ms}",
        *more,
    ]


#: A setting named in libpq's ``options``: ``-c name=value``, ``-cname=value``, ``--name=value``.
_OPTION_NAME = re.compile(r"(?:-c\s*|--)([A-Za-z_][A-Za-z0-9_.]*)\s*=")


def bounded_params(
    given: Mapping[str, Any],
    statement_timeout_ms: int,
    *more_options: str,
    connect_timeout: int = CONNECT_TIMEOUT_SECONDS,
    idle_in_transaction: bool = True,
) -> dict[str, Any]:
    """``given`` (a connection's libpq parameters) with the bounds it does not set itself: a
    parameter, or a setting in its own ``options``, that it gives wins (so applying this twice
    changes nothing)."""
    params = {**client_params(connect_timeout), **given}
    own = str(given.get("options") or "").strip()
    named = {name.lower() for name in _OPTION_NAME.findall(own)}
    ours = [
        f"-c {setting}"
        for setting in session_settings(
            statement_timeout_ms, *more_options, idle_in_transaction=idle_in_transaction
        )
        if setting.split("=", 1)[0].lower() not in named
    ]
    params["options"] = " ".join([*ours, own] if own else ours)
    return params


class SilentDatabase(psycopg.OperationalError):
    """No answer within the read bound: the connection was closed; the message is one line."""


class BoundedConnection(psycopg.Connection[Row]):
    """A psycopg connection whose every wait for the server ends after :attr:`read_timeout`.

    On expiry the connection is closed (its state is unknown: a statement may or may not have
    run, a COMMIT may or may not have committed) and :class:`SilentDatabase` is raised, an
    ``OperationalError`` on a closed connection: SQLAlchemy takes it for a disconnect and drops
    the connection from its pool.
    """

    #: Seconds any one wait may last (None: unbounded); set by :func:`connect_bounded`.
    read_timeout: float | None = None

    def wait(self, gen: PQGen[RV], interval: float = 0.1, timeout: float | None = None) -> RV:
        """psycopg's wait, bounded by :attr:`read_timeout` unless the caller gives its own."""
        bound = self.read_timeout
        if timeout is not None or bound is None:
            return super().wait(gen, interval, timeout)  # the caller handles its own time-out
        try:
            return super().wait(gen, interval, bound)
        except errors._WaitTimeout:
            self.pgconn.finish()
            raise SilentDatabase(
                f"no answer from the database within {bound:g} s; connection closed"
            ) from None


def connect_bounded(
    read_timeout: float | None, *args: Any, **kwargs: Any
) -> BoundedConnection[Any]:
    """``psycopg.connect(*args, **kwargs)``: a :class:`BoundedConnection` with ``read_timeout``."""
    conn: BoundedConnection[Any] = BoundedConnection.connect(*args, **kwargs)
    conn.read_timeout = read_timeout
    return conn
