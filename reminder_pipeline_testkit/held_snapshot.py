"""A snapshot held open on a database, as a report, ``pg_dump`` or a replica with
``hot_standby_feedback`` holds one: ``BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT count(*) FROM
event_reminders;`` and then the transaction left open, idle, until it is released. While it is
open its ``backend_xmin`` holds back the database's xmin horizon: no row version or index entry
dead since it began can be removed or marked dead.

Used by ``benchmarks.shared_db`` (stack B's snapshot, held for the whole run) and by the soak's
``long_snapshot`` fault (``benchmarks._soak_stack``); ``faults/test_held_snapshot.py`` checks it.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

import psycopg

from reminder_pipeline.store import pg_client

#: The holder's ``application_name``: what ``pg_stat_activity`` and the exporter show for it.
APPLICATION_NAME = "rpb-held-snapshot"

#: Who holds the snapshot, as ``pg_stat_activity`` sees it from another session (a session reads
#: ``pg_stat_activity`` once per transaction, so the holder cannot see its own xmin grow older).
HOLDER = """
SELECT age(backend_xmin), EXTRACT(EPOCH FROM clock_timestamp() - xact_start), state
  FROM pg_stat_activity WHERE pid = %s
"""


class HeldSnapshot:
    """A REPEATABLE READ transaction on ``dsn``, opened by :meth:`take`, ended by :meth:`release`.

    The holder's connection has the client-side bounds every connection here has
    (``pg_client.client_params``), and no server-side timeout that would end it early (no
    ``statement_timeout``, no ``idle_in_transaction_session_timeout``): ending it is the point.
    """

    def __init__(self, dsn: str, application_name: str = APPLICATION_NAME) -> None:
        self.dsn = dsn
        self.application_name = application_name
        self.conn: psycopg.Connection | None = None
        self.pid: int | None = None
        self.rows_seen = 0
        self.taken_at = 0.0

    def take(self) -> int:
        """Open the snapshot; returns the rows its ``count(*)`` saw."""
        self.conn = psycopg.connect(
            self.dsn,
            autocommit=True,  # the BEGIN below is sent as written: the two statements
            application_name=self.application_name,
            options="-c statement_timeout=0 -c idle_in_transaction_session_timeout=0",
            **_bounds(),
        )
        self.pid = self.conn.info.backend_pid
        self.conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        row = self.conn.execute("SELECT count(*) FROM event_reminders").fetchone()
        self.rows_seen = int(row[0]) if row else 0
        self.taken_at = time.time()
        return self.rows_seen

    def state(self, dsn: str | None = None) -> dict[str, Any] | None:
        """From another session: how many transactions old the held xmin is, how many seconds
        the transaction has been open, its state; None when the holder's session is gone."""
        if self.pid is None:
            return None
        with psycopg.connect(dsn or self.dsn, autocommit=True, **_bounds()) as conn:
            row = conn.execute(HOLDER, (self.pid,)).fetchone()
        if row is None:
            return None
        return {
            "xmin_age": None if row[0] is None else int(row[0]),
            "age_s": None if row[1] is None else round(float(row[1]), 1),
            "state": row[2],
        }

    def release(self) -> bool:
        """End the transaction and the session; False when the session had already gone (a
        server restart, a terminated backend)."""
        conn, self.conn = self.conn, None
        if conn is None:
            return False
        alive = True
        try:
            conn.execute("ROLLBACK")
        except psycopg.Error:
            alive = False
        finally:
            with contextlib.suppress(psycopg.Error):
                conn.close()
        return alive


def _bounds() -> dict[str, Any]:
    """The client-side bounds every connection here has, as psycopg's keyword arguments."""
    return dict(pg_client.client_params())
