"""A relay that goes silent while it holds the relay lock does not hold up publishing.

On a real PostgreSQL and the real broker: a relay reaches the database through the fault proxy,
which goes "stuck" (sockets open, nothing forwarded: a peer that keeps ACKing) right after the
broker acknowledged its batch, before the mark. The server ends the silent lock session by
itself (``idle_session_timeout`` on the lock session) and its advisory lock with it within 30 s;
meanwhile the ``outbox_backlog`` check names the holder (pid, application name, idle) and the
exporter's snapshot reads the same session; another dispatcher started while the lock was held
publishes its own rows and the stuck relay's within its cycle; the stuck relay fails with a
database error, and every message is on the topic.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
import sqlalchemy as sa

from reminder_pipeline import cycle
from reminder_pipeline.cli.exits import EXIT_FAILURE, exit_code
from reminder_pipeline.messaging.kafka import KafkaPublisher
from reminder_pipeline.messaging.relay import publish_outbox
from reminder_pipeline.observability import health
from reminder_pipeline.observability.exporter import read_snapshot
from reminder_pipeline.store import outbox_queries
from reminder_pipeline.store.engine import make_engine
from reminder_pipeline_testkit.fault_proxy import FaultProxy
from reminder_pipeline_tests.support import bulk_due, outbox_rows, reminders, utcnow

pytestmark = pytest.mark.server

STUCK_APP = "stuck-relay"
#: The promise: a relay whose session goes silent loses the lock within 30 s (server-timed).
PROMISE_SECONDS = 30.0


def lock_held(engine: sa.Engine) -> bool:
    """Whether any session of this database holds the relay lock (pg_locks, read directly)."""
    with engine.connect() as conn:
        return bool(
            conn.execute(
                sa.text(
                    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted "
                    "AND objid = :key AND database = (SELECT oid FROM pg_database "
                    "WHERE datname = current_database())"
                ),
                {"key": outbox_queries.RELAY_LOCK_KEY},
            ).scalar_one()
        )


def in_thread(call: Any) -> tuple[threading.Thread, dict[str, Any]]:
    """Run ``call`` on a daemon thread; its result or error lands in the returned dict."""
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["result"] = call()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            outcome["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


def test_a_stuck_relay_loses_the_lock_and_another_dispatcher_publishes(
    engine, database_url_via_proxy, pg_proxy: FaultProxy, kafka_settings, publisher, kafka_reader
):
    bulk_due(engine, 20)
    cycle.drain(engine, utcnow(), 1000)  # the stuck relay's rows, written and unpublished
    stuck_rows = {str(o["reminder_id"]) for o in outbox_rows(engine)}

    stuck_engine = make_engine(database_url_via_proxy, application_name=STUCK_APP)
    stuck_publisher = KafkaPublisher(kafka_settings)
    acknowledged = threading.Event()

    def go_silent(_ids: list[int]) -> None:  # the broker acknowledged; the mark never arrives
        pg_proxy.set_mode("stuck")
        acknowledged.set()

    stuck, stuck_outcome = in_thread(
        lambda: publish_outbox(
            stuck_engine, stuck_publisher, run_id="stuck-run", on_acknowledged=go_silent
        )
    )
    try:
        assert acknowledged.wait(60), stuck_outcome
        silent_since = time.monotonic()
        assert lock_held(engine)

        # While it holds the lock, the backlog check names the holder, as pg_stat_activity has it.
        check = health.outbox_backlog(engine, utcnow())
        assert f"Relay lock held by pid {check.metadata['relay_lock_holder_pid']} " in (
            check.description
        )
        assert f"application_name '{STUCK_APP} relay stuck-run'" in check.description
        holder = read_snapshot(engine).relay_lock  # the exporter's gauge reads the same session
        assert holder is not None and holder.pid == check.metadata["relay_lock_holder_pid"]

        # Another dispatcher starts while the lock is held; its relay waits for the holder.
        bulk_due(engine, 10)
        other, other_outcome = in_thread(
            lambda: cycle.run_cycle(engine, publisher, budget_seconds=60)
        )

        deadline = silent_since + 45
        while lock_held(engine) and time.monotonic() < deadline:
            time.sleep(0.2)
        freed_after = time.monotonic() - silent_since
        assert freed_after <= PROMISE_SECONDS, f"relay lock still held {freed_after:.0f} s on"

        other.join(90)
        report = other_outcome.get("result")
        assert report is not None, other_outcome.get("error")
        assert report.relay.busy and report.relay.left == 0 and not report.relay.failed
        assert all(o["published_at"] is not None for o in outbox_rows(engine))
        every = {str(r["id"]) for r in reminders(engine)}
        assert len(every) == 30 and stuck_rows < every
        assert {m.value["ReminderId"] for m in kafka_reader.wait_for(every)} == every
    finally:
        pg_proxy.set_mode("pass")
        pg_proxy.close()  # the held connections end: a stuck relay without a read bound returns
        stuck.join(60)
        stuck_publisher.close(timeout=0)
        stuck_engine.dispose()

    # The stuck relay failed on its dead session: a database error, one line and exit 1 in the CLI.
    assert not stuck.is_alive()
    assert exit_code(stuck_outcome.get("error")) == EXIT_FAILURE, stuck_outcome
