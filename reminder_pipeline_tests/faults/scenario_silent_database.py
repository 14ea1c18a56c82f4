"""Packet-drop scenario: a dispatch whose PostgreSQL is black-holed as a batch sends COMMIT.

Run in a network namespace of its own (``reminder_pipeline_testkit.netns.run_in_own_network``), from
the repository root: ``python -m reminder_pipeline_tests.faults.scenario_silent_database``. It
starts an embedded PostgreSQL, leaves the dispatcher's pool an idle session besides the one it works
on, drops the port's packets both ways (iptables) when the second batch commits, and prints one JSON
line: how the cycle ended and when, whether a batch was half moved, when the server had ended every
session of the dispatcher (the one idle in a transaction by ``idle_in_transaction_session_timeout``,
the idle one by its TCP keepalives), and the statuses after the packets flow again and one more
cycle ran. The server is watched through its Unix socket, which the drop does not touch.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event

from reminder_pipeline import cycle
from reminder_pipeline.local.servers import EmbeddedPostgres
from reminder_pipeline.store import migrate
from reminder_pipeline.store.engine import make_engine
from reminder_pipeline.store.pg_client import SilentDatabase
from reminder_pipeline_testkit.netns import drop_port, undrop_port
from reminder_pipeline_tests.faults.scenarios import run_on_own_server
from reminder_pipeline_tests.support import bulk_due

APP = "silent-dispatch"
DUE = 300
WAIT_SECONDS = 90.0


def _sessions(watcher: sa.Engine) -> int:
    with watcher.connect() as conn:
        return int(
            conn.execute(
                sa.text("SELECT count(*) FROM pg_stat_activity WHERE application_name = :app"),
                {"app": APP},
            ).scalar_one()
        )


def _statuses(watcher: sa.Engine) -> dict[str, int]:
    with watcher.connect() as conn:
        rows = conn.execute(sa.text("SELECT status, count(*) FROM event_reminders GROUP BY 1"))
        return {status: int(n) for status, n in rows}


def _half_moved(watcher: sa.Engine) -> int:
    """Sent reminders without their outbox row, and outbox rows of reminders not Sent."""
    with watcher.connect() as conn:
        return int(
            conn.execute(
                sa.text(
                    "SELECT (SELECT count(*) FROM event_reminders r WHERE r.status = 'Sent' "
                    "AND NOT EXISTS (SELECT 1 FROM outbox o WHERE o.reminder_id = r.id)) + "
                    "(SELECT count(*) FROM outbox o JOIN event_reminders r ON r.id = o.reminder_id"
                    " WHERE r.status <> 'Sent')"
                )
            ).scalar_one()
        )


def scenario(server: EmbeddedPostgres) -> dict[str, Any]:
    """The dispatch, the drop, the wait for the server, the cycle after."""
    server.ensure_database("app")
    socket = f"postgresql+psycopg://postgres@/app?host={server._socket_dir()}&port={server.port}"
    watcher = make_engine(socket, pool_size=1, application_name="watcher")
    migrate.upgrade(watcher)
    bulk_due(watcher, DUE)
    dispatcher = make_engine(server.url("app"), pool_size=2, application_name=APP)
    with dispatcher.connect() as one, dispatcher.connect() as two:  # two sessions in the pool
        one.exec_driver_sql("SELECT 1")
        two.exec_driver_sql("SELECT 1")
    written = {"batches": 0, "dropped_at": 0.0}

    @event.listens_for(dispatcher, "after_cursor_execute")
    def _count(_conn, _cursor, statement, *_args):  # type: ignore[no-untyped-def]
        if "INSERT INTO outbox" in statement:
            written["batches"] += 1

    @event.listens_for(dispatcher, "commit")
    def _drop(_conn):  # type: ignore[no-untyped-def]
        if written["batches"] == 2 and not written["dropped_at"]:
            drop_port(server.port)
            written["dropped_at"] = time.monotonic()

    errors: list[BaseException] = []

    def dispatch() -> None:
        try:
            cycle.run_cycle(dispatcher, None, batch_size=100, max_batches=10)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    thread = threading.Thread(target=dispatch, daemon=True)
    thread.start()
    thread.join(WAIT_SECONDS)
    noticed = time.monotonic() - written["dropped_at"]
    chain, error = [], errors[0] if errors else None
    while error is not None and error not in chain:
        chain.append(error)
        error = error.__cause__ or error.__context__
    half_moved = _half_moved(watcher)
    while _sessions(watcher) and time.monotonic() - written["dropped_at"] < WAIT_SECONDS:
        time.sleep(0.5)
    ended = time.monotonic() - written["dropped_at"]
    left = _sessions(watcher)
    undrop_port(server.port)
    cycle.run_cycle(dispatcher, None, batch_size=100, max_batches=10)
    after = _statuses(watcher)
    dispatcher.dispose()
    watcher.dispose()
    return {
        "due": DUE,
        "ended": not thread.is_alive(),
        "noticed_seconds": round(noticed, 1),
        "errors": [f"{type(e).__name__}: {' '.join(str(e).split())[:160]}" for e in chain],
        "silent_error": any(isinstance(e, SilentDatabase) for e in chain),
        "half_moved": half_moved,
        "server_ended_session_seconds": round(ended, 1) if not left else None,
        "after": after,
    }


def main() -> None:
    """Run the scenario on a server of its own and print the findings as one JSON line."""
    run_on_own_server("rp-silent-db-", scenario)


if __name__ == "__main__":
    main()
