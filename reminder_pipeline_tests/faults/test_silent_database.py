"""A dispatch whose database goes silent, on a real PostgreSQL behind the fault proxy gone "stuck"
(its sockets stay open, nothing is forwarded: a peer that keeps ACKing and never answers) right
as a batch sends COMMIT: the client's read bound ends the cycle with one error, no batch is half
moved, the server ends the silent session (idle in transaction) and with it the batch's row
locks, and once the database answers again the next cycle takes every row, once.

The same with real dropped packets (the kernel's keepalives and ``tcp_user_timeout``, no proxy)
is ``scenario_silent_database`` run in a network namespace of its own.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy import event

from reminder_pipeline import cycle
from reminder_pipeline.messaging.kafka import KafkaPublisher
from reminder_pipeline.store.engine import make_engine
from reminder_pipeline.store.pg_client import SilentDatabase
from reminder_pipeline_testkit.fault_proxy import FaultProxy
from reminder_pipeline_testkit.netns import require_netns, run_in_own_network
from reminder_pipeline_tests.support import bulk_due

pytestmark = pytest.mark.server

SILENT_APP = "silent-dispatch"
#: The promise: a silent database is noticed, and the call ends, within 30 s.
PROMISE_SECONDS = 30.0


def ends_within(seconds: float, call: Callable[[], object]) -> tuple[float, BaseException | None]:
    """Run ``call`` on a thread: (seconds it took, what it raised); fails if it has not ended
    after ``seconds`` (without the bounds it never does)."""
    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            call()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            outcome.append(exc)
        else:
            outcome.append(None)

    started = time.monotonic()
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still waiting on the silent database after {seconds:g} s"
    return time.monotonic() - started, outcome[0]


def chain(error: BaseException | None) -> list[BaseException]:
    """``error`` and every exception it was raised from or during."""
    found = []
    while error is not None and error not in found:
        found.append(error)
        error = error.__cause__ or error.__context__
    return found


def silent_sessions(engine: sa.Engine) -> int:
    """Server sessions of the silent dispatcher still holding a transaction open."""
    with engine.connect() as conn:
        return int(
            conn.execute(
                sa.text(
                    "SELECT count(*) FROM pg_stat_activity WHERE application_name = :app "
                    "AND state LIKE 'idle in transaction%'"
                ),
                {"app": SILENT_APP},
            ).scalar_one()
        )


def state(engine: sa.Engine) -> dict[str, Any]:
    """Statuses and outbox rows, read directly (not through the proxy)."""
    with engine.connect() as conn:
        statuses = dict(
            conn.execute(
                sa.text("SELECT status, count(*) FROM event_reminders GROUP BY status")
            ).all()
        )
        sent_without_outbox = conn.execute(
            sa.text(
                "SELECT count(*) FROM event_reminders r WHERE r.status = 'Sent' AND NOT EXISTS "
                "(SELECT 1 FROM outbox o WHERE o.reminder_id = r.id)"
            )
        ).scalar_one()
        outbox = conn.execute(
            sa.text("SELECT count(*), count(DISTINCT reminder_id), count(published_at) FROM outbox")
        ).one()
    return {
        "statuses": statuses,
        "sent_without_outbox": sent_without_outbox,
        "outbox": tuple(outbox),
    }


def test_a_dispatch_silent_at_commit_ends_in_one_error_and_the_next_cycle_takes_the_rows(
    engine: sa.Engine,
    database_url_via_proxy: str,
    pg_proxy: FaultProxy,
    publisher: KafkaPublisher,
):
    bulk_due(engine, 300)
    proxied = make_engine(database_url_via_proxy, pool_size=2, application_name=SILENT_APP)
    batches = {"written": 0}

    @event.listens_for(proxied, "after_cursor_execute")
    def _count(_conn, _cursor, statement, *_args):  # type: ignore[no-untyped-def]
        if "INSERT INTO outbox" in statement:
            batches["written"] += 1

    @event.listens_for(proxied, "commit")
    def _silence(_conn):  # type: ignore[no-untyped-def]
        if batches["written"] == 2:  # the second batch's COMMIT never reaches the server
            pg_proxy.set_mode("stuck")

    def dispatch() -> None:
        cycle.run_cycle(proxied, None, batch_size=100, max_batches=10)

    try:
        took, error = ends_within(2 * PROMISE_SECONDS, dispatch)
        silenced_at = time.monotonic() - took
        # One error, the client's read bound (then the cycle's failure record could not connect
        # either): a disconnect to SQLAlchemy, which dropped the connection.
        assert any(isinstance(e, SilentDatabase) for e in chain(error)), chain(error)
        assert isinstance(error, sa.exc.OperationalError) and "\n" not in str(error.orig)
        assert took < PROMISE_SECONDS, took

        # The first batch whole (Sent with its outbox rows); the second not at all.
        assert state(engine) == {
            "statuses": {"Sent": 100, "Pending": 200},
            "sent_without_outbox": 0,
            "outbox": (100, 100, 0),
        }
        # The server ends the silent session (idle in transaction), and the batch's row locks go
        # with it: server-timed, 30 s after the silence began.
        while silent_sessions(engine) and time.monotonic() - silenced_at < 2 * PROMISE_SECONDS:
            time.sleep(0.5)
        assert silent_sessions(engine) == 0
        assert time.monotonic() - silenced_at < PROMISE_SECONDS + 10

        pg_proxy.set_mode("pass")
        report = cycle.run_cycle(proxied, publisher, batch_size=100, max_batches=10)
        assert report.counts.sent == 200
        assert state(engine) == {
            "statuses": {"Sent": 300},
            "sent_without_outbox": 0,
            "outbox": (300, 300, 300),
        }
    finally:
        pg_proxy.set_mode("pass")
        proxied.dispose()


SCENARIO = "reminder_pipeline_tests.faults.scenario_silent_database"


@pytest.mark.slow
def test_a_dispatch_whose_database_packets_are_dropped_ends_and_the_next_cycle_takes_the_rows():
    require_netns()
    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": root}
    done = run_in_own_network([sys.executable, "-m", SCENARIO], env=env, timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    # Noticed by the kernel (keepalives, tcp_user_timeout) or the read bound: within 30 s.
    assert found["noticed_seconds"] < PROMISE_SECONDS, found
    assert found["silent_error"], found
    assert found["half_moved"] == 0, found
    assert found["server_ended_session_seconds"] < PROMISE_SECONDS + 10, found
    assert found["after"] == {"Sent": found["due"]}, found
