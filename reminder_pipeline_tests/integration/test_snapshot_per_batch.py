"""The dispatcher's own sessions never hold a snapshot longer than a batch, and its relay holds none while it waits on the broker.

Against the real database and broker: a cycle of many batches (``run_cycle``, batches of 250
over 3,000 due reminders, the real producer, the drain's relay publishing alongside) while a
second session samples ``pg_stat_activity`` for the dispatcher's sessions (the engine's
application name, ``reminder-pipeline``, its relay's ``reminder-pipeline relay <run id>``), each
sample with the transaction id of the last batch committed by then (read in the same statement).
Each batch's (sub)transaction id is read back afterwards from the rows it moved (their ``xmin``:
the batch's write runs after a savepoint), and the engine's own events count the batch writes
each committed transaction held.

What would break it: a drain that wraps two batches in one transaction (a commit with two batch
writes), any dispatcher session that keeps a snapshot or a transaction across batches (its xmin
falls behind the batches committed since), a relay that holds a transaction while the broker
answers (its session ``idle in transaction`` inside a publish). No clock is compared:
transaction ids order the events.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa
from psycopg.rows import dict_row
from sqlalchemy import event
from sqlalchemy.engine import make_url

from reminder_pipeline import cycle
from reminder_pipeline.store import outbox_queries

from ..support import bulk_due

ROWS = 3000
BATCH = 250
#: A snapshot of the batch in flight may still have a relay's mark of the batch before running
#: (one statement): the bound allows that one, and no more.
SLACK = 2

# One look at the dispatcher: its sessions with a snapshot or a transaction id, the last batch
# committed by then (the newest transaction id among the moved rows, by this statement's own
# snapshot, taken before pg_stat_activity is read), and the oldest transaction running in
# another database (a shared test server's: it would hold every snapshot's xmin back too).
LOOK = """
    SELECT (SELECT max(CAST(CAST(xmin AS text) AS bigint)) FROM event_reminders
             WHERE status = 'Sent') AS committed,
           (SELECT min(CAST(CAST(backend_xid AS text) AS bigint)) FROM pg_stat_activity
             WHERE datname IS DISTINCT FROM current_database()) AS foreign_xid,
           coalesce(json_agg(json_build_object(
               'pid', a.pid, 'application_name', a.application_name, 'state', a.state,
               'query', a.query,
               'xmin', CAST(CAST(a.backend_xmin AS text) AS bigint),
               'xid', CAST(CAST(a.backend_xid AS text) AS bigint)))
             FILTER (WHERE a.pid IS NOT NULL), '[]') AS sessions
      FROM (SELECT 1) AS one
      LEFT JOIN pg_stat_activity a
        ON a.datname = current_database() AND a.pid <> pg_backend_pid()
       AND a.application_name LIKE 'reminder-pipeline%'
"""


@dataclass(frozen=True)
class Look:
    """One sample: the last batch committed, a foreign transaction, the dispatcher's sessions."""

    committed: int | None
    foreign_xid: int | None
    sessions: list[dict[str, Any]]

    def relay_sessions(self) -> list[dict[str, Any]]:
        """The relay's lock sessions (named after the run while they hold the lock)."""
        return [s for s in self.sessions if " relay " in (s["application_name"] or "")]


def _look(conn: psycopg.Connection[Any]) -> Look:
    row = conn.execute(LOOK).fetchone()
    assert row is not None
    return Look(row["committed"], row["foreign_xid"], row["sessions"])


def _connect(database_url: str, name: str) -> psycopg.Connection[Any]:
    dsn = make_url(database_url).set(drivername="postgresql")
    return psycopg.connect(
        dsn.render_as_string(hide_password=False),
        autocommit=True,
        application_name=name,
        row_factory=dict_row,
    )


@pytest.fixture
def sampler(database_url: str) -> Iterator[list[Look]]:
    """Looks at the dispatcher as often as it can until the test's block ends."""
    looks: list[Look] = []
    stop = threading.Event()

    def sample() -> None:
        with _connect(database_url, "snapshot-sampler") as conn:
            while not stop.is_set():
                looks.append(_look(conn))
                stop.wait(0.002)

    thread = threading.Thread(target=sample, name="snapshot-sampler", daemon=True)
    thread.start()
    yield looks
    stop.set()
    thread.join(30)


class WatchedPublisher:
    """The real producer; each publish first looks at the dispatcher: the relay waits on it."""

    def __init__(self, publisher: Any, database_url: str) -> None:
        self._publisher = publisher
        self._conn = _connect(database_url, "relay-watcher")
        self.looks: list[Look] = []

    def publish(self, messages: Sequence[Any], timeout: float | None = None) -> Any:
        """Look, then produce and wait for the broker's reports."""
        self.looks.append(_look(self._conn))
        return self._publisher.publish(messages, timeout=timeout)

    def close(self) -> None:
        """Close the watcher's connection."""
        self._conn.close()


#: A batch's write: it moves the rows and inserts their outbox rows (store/queries.py).
BATCH_WRITE = re.compile(r"INSERT INTO outbox\s*\(")


@contextmanager
def batch_writes_per_transaction(engine: sa.Engine) -> Iterator[list[int]]:
    """How many batch writes each transaction of ``engine`` committed in the block held."""
    pending: dict[int, int] = {}
    committed: list[int] = []

    def executed(conn: sa.Connection, _cursor: Any, statement: str, *_: Any) -> None:
        if BATCH_WRITE.search(statement):
            key = id(conn.connection.dbapi_connection)
            pending[key] = pending.get(key, 0) + 1

    def commit(conn: sa.Connection) -> None:
        writes = pending.pop(id(conn.connection.dbapi_connection), 0)
        if writes:
            committed.append(writes)

    event.listen(engine, "after_cursor_execute", executed)
    event.listen(engine, "commit", commit)
    try:
        yield committed
    finally:
        event.remove(engine, "after_cursor_execute", executed)
        event.remove(engine, "commit", commit)


def _batch_xids(engine: sa.Engine) -> dict[int, int]:
    """Each batch's transaction id (the xmin of the rows it moved), and how many rows it moved."""
    with engine.connect() as conn:
        rows = conn.execute(
            sa.text(
                "SELECT CAST(CAST(xmin AS text) AS bigint) AS xid, count(*) AS n "
                "FROM event_reminders WHERE status = 'Sent' GROUP BY 1 ORDER BY 1"
            )
        ).all()
    return {int(r.xid): int(r.n) for r in rows}


def test_no_dispatcher_session_holds_a_snapshot_past_a_batch_nor_the_relay_across_a_flush(
    engine, database_url, publisher, sampler
):
    bulk_due(engine, ROWS)
    watched = WatchedPublisher(publisher, database_url)
    try:
        with batch_writes_per_transaction(engine) as per_transaction:
            report = cycle.run_cycle(
                engine, watched, batch_size=BATCH, max_batches=ROWS, budget_seconds=120
            )
    finally:
        watched.close()
    assert (report.counts.sent, report.relay.published) == (ROWS, ROWS)

    # One transaction per batch: each committed transaction held one batch's write.
    assert per_transaction == [1] * report.counts.batches
    batches = _batch_xids(engine)
    assert len(batches) == report.counts.batches == ROWS // BATCH
    assert set(batches.values()) == {BATCH}
    order = sorted(batches)

    # Every snapshot or transaction a dispatcher session held was begun at most one batch before
    # the batch in flight (SLACK): newer than the batch SLACK before the last committed one.
    looks = [*sampler, *watched.looks]
    checked = 0
    for look in looks:
        if look.committed is None:
            continue
        last = order.index(look.committed)
        if last < SLACK:
            continue
        bound = order[last - SLACK]
        if look.foreign_xid is not None and look.foreign_xid <= bound:
            continue  # a shared server's transaction holds every snapshot back: not ours
        for session in look.sessions:
            held = [x for x in (session["xmin"], session["xid"]) if x is not None]
            if not held:
                continue
            checked += 1
            assert min(held) > bound, (
                f"{session} holds a snapshot from before batch {last - SLACK + 1} "
                f"(xid {bound}) while batch {last + 1} (xid {look.committed}) had committed"
            )
    assert checked, "no sample saw a dispatcher session inside a batch"

    # While the relay waits on the broker its lock session is idle: no transaction, no snapshot
    # (the lock is a session lock on an autocommit connection). Only its keep-alive may run.
    assert len(watched.looks) >= 2
    for look in watched.looks:
        [relay] = look.relay_sessions()
        if relay["state"] == "active" and relay["query"] == outbox_queries.RELAY_KEEPALIVE:
            continue
        assert relay["state"] == "idle", relay
        assert relay["xmin"] is None and relay["xid"] is None, relay
