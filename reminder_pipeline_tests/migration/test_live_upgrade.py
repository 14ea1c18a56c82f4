"""Upgrades on a live database, against a real PostgreSQL (``store/migrations/online_ddl.py``).

* A step that meets a table lock held by another session (a report's open transaction) gives up
  within its lock_timeout while the lock is held, and a retry succeeds once it is gone; when it
  never goes, ``reminder-pipeline db upgrade`` stops with one line naming the table and the
  holder (exit 1), the revision stays where it was, and a second run finishes.
* A concurrent index build cancelled half-way leaves an INVALID index; the next run finds it,
  drops it and builds it again.
* Two upgrades started together both succeed, one after the other: the one waiting for the
  migration lock holds no snapshot that the other's concurrent index builds would wait for (a
  session blocked in ``pg_advisory_lock`` does, and the server ended that deadlock by failing one).
* From 0006 to head with rows present, stopped half-way (in 0009), the database stays at the
  last completed revision with that migration's first steps done; a second run finishes it at
  the declared schema (storage parameters included) with every row kept, and a third changes
  nothing.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from reminder_pipeline import logs
from reminder_pipeline.cli import main
from reminder_pipeline.store import migrate
from reminder_pipeline.store.migrations import online_ddl

from ..support import schema_differences

#: Bounds on waiting for what must happen (a retry, a build that waits): failures, not timings.
PATIENCE_SECONDS = 60


def _dsn(engine: Engine) -> str:
    return engine.url.set(drivername="postgresql").render_as_string(hide_password=False)


@contextmanager
def open_transaction(
    engine: Engine, sql: str, application_name: str = "long-report"
) -> Iterator[psycopg.Connection]:
    """Another session that ran ``sql`` and keeps its transaction (and the locks it took) open
    until the block ends or it ends the transaction itself; the server ends it after
    :data:`PATIENCE_SECONDS` idle, so a migration that would wait for it for ever fails the test
    instead of hanging it."""
    with psycopg.connect(
        _dsn(engine),
        application_name=application_name,
        options=f"-c idle_in_transaction_session_timeout={PATIENCE_SECONDS * 1000}",
    ) as conn:
        conn.execute(sql)
        yield conn
        conn.rollback()


class Retries(logging.Handler):
    """The migration steps' retries, as logged: the fields of each, and an event per retry."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.seen: list[dict[str, Any]] = []
        self.arrived = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if "retrying" in record.getMessage():
            self.seen.append(logs.fields_of(record))
            self.arrived.set()


@pytest.fixture
def retries() -> Iterator[Retries]:
    handler = Retries()
    logger = logging.getLogger(online_ddl.__name__)
    logger.addHandler(handler)
    yield handler
    logger.removeHandler(handler)


def test_a_step_that_meets_a_held_lock_gives_up_within_its_lock_timeout_and_succeeds_on_retry(
    empty_engine, retries
):
    migrate.upgrade(empty_engine, "0006")
    # A report's open transaction read event_reminders: 0007's ADD COLUMN (ACCESS EXCLUSIVE)
    # cannot have the table until the report ends.
    with (
        open_transaction(empty_engine, "SELECT count(*) FROM event_reminders") as report,
        ThreadPoolExecutor(1) as pool,
    ):
        upgrade = pool.submit(migrate.upgrade, empty_engine)
        assert retries.arrived.wait(PATIENCE_SECONDS), "the step never gave up its wait"
        [first, *_] = retries.seen
        assert first["table"] == "event_reminders" and first["lock"] == "ACCESS EXCLUSIVE"
        assert first["holder_pid"] == report.info.backend_pid
        assert first["holder_application_name"] == "long-report"
        assert first["lock_timeout_ms"] == online_ddl.LOCK_TIMEOUT_MS
        assert not upgrade.done() and migrate.current_revision(empty_engine) == "0006"
        report.rollback()  # the report ends: the next attempt gets the lock
        upgrade.result(timeout=PATIENCE_SECONDS)
    assert migrate.current_revision(empty_engine) == migrate.head_revision()


def test_a_lock_that_never_goes_stops_the_upgrade_with_one_line_and_a_second_run_finishes(
    empty_engine, monkeypatch, capsys
):
    migrate.upgrade(empty_engine, "0006")
    monkeypatch.setattr(online_ddl, "ATTEMPTS", 2)
    monkeypatch.setenv("DATABASE_URL", empty_engine.url.render_as_string(hide_password=False))
    with open_transaction(empty_engine, "SELECT count(*) FROM event_reminders") as report:
        assert main(["db", "upgrade"]) == 1
        stopped = [
            line
            for line in capsys.readouterr().err.splitlines()
            if line.startswith("reminder-pipeline: error")
        ]
        pid = report.info.backend_pid
    assert len(stopped) == 1
    assert stopped[0].startswith(
        "reminder-pipeline: error: ALTER TABLE event_reminders: its ACCESS EXCLUSIVE lock on "
        "event_reminders was not granted within 500 ms in 2 attempts; held by pid "
        f'{pid} (application "long-report", '
    )
    assert migrate.current_revision(empty_engine) == "0006"

    assert main(["db", "upgrade"]) == 0
    assert capsys.readouterr().out.startswith(f"database at revision {migrate.head_revision()}")
    assert migrate.current_revision(empty_engine) == migrate.head_revision()


def _index_valid(engine: Engine, name: str) -> bool | None:
    with engine.connect() as conn:
        return conn.execute(online_ddl.INDEX_VALID, {"name": name}).scalar()


def _waiting_build(engine: Engine) -> int | None:
    """The migration's backend while its CREATE INDEX CONCURRENTLY waits for a lock, else None."""
    with engine.connect() as conn:
        return conn.execute(
            sa.text(
                "SELECT pid FROM pg_stat_activity WHERE application_name = :name "
                "AND query LIKE 'CREATE INDEX CONCURRENTLY%' AND wait_event_type = 'Lock'"
            ),
            {"name": migrate.APPLICATION_NAME},
        ).scalar()


def test_a_concurrent_build_cancelled_half_way_is_rebuilt_by_the_next_run(empty_engine):
    migrate.upgrade(empty_engine, "0008")
    index = "ix_event_reminders_poison"
    # A calendar write still open on event_reminders: a concurrent build waits for it (before it
    # reads the table), the index already in the catalog, not yet valid.
    writer = (
        "WITH e AS (INSERT INTO calendar_events (id, tenant_id, owner_user_id, kind, start_at, "
        "time_zone) VALUES (gen_random_uuid(), gen_random_uuid(), gen_random_uuid(), 'Meeting', "
        "now() + interval '1 day', 'UTC') RETURNING id) "
        "INSERT INTO event_reminders (id, calendar_event_id, offset_minutes, due_at) "
        "SELECT gen_random_uuid(), id, 15, now() + interval '1 day' FROM e"
    )
    with (
        open_transaction(empty_engine, writer, "calendar") as calendar,
        ThreadPoolExecutor(1) as pool,
    ):
        upgrade = pool.submit(migrate.upgrade, empty_engine)
        deadline = time.monotonic() + PATIENCE_SECONDS
        while (pid := _waiting_build(empty_engine)) is None and not upgrade.done():
            assert time.monotonic() < deadline, "the build never waited for the open write"
            time.sleep(0.05)
        assert pid is not None, upgrade.exception()
        with empty_engine.connect() as conn:
            assert conn.execute(sa.text("SELECT pg_cancel_backend(:pid)"), {"pid": pid}).scalar()
        with pytest.raises(
            sa.exc.OperationalError, match="canceling statement due to user request"
        ):
            upgrade.result(timeout=PATIENCE_SECONDS)
        calendar.commit()
    # What a failed concurrent build leaves: the index, INVALID; the revision where it was.
    assert _index_valid(empty_engine, index) is False
    assert migrate.current_revision(empty_engine) == "0008"

    migrate.upgrade(empty_engine)
    assert _index_valid(empty_engine, index) is True
    assert migrate.current_revision(empty_engine) == migrate.head_revision()


def test_two_upgrades_started_together_both_succeed_one_after_the_other(empty_engine):
    with ThreadPoolExecutor(2) as pool:
        upgrades = [pool.submit(migrate.upgrade, empty_engine) for _ in range(2)]
        for upgrade in upgrades:
            upgrade.result(timeout=PATIENCE_SECONDS)
    assert migrate.current_revision(empty_engine) == migrate.head_revision()
    assert schema_differences(empty_engine) == []


#: A small calendar at 0006: events with a reminder each, some already dispatched (Sent, with an
#: outbox row), some poison rows (Pending after a failed attempt).
CALENDAR_AT_0006 = """
WITH e AS (
    INSERT INTO calendar_events (id, tenant_id, owner_user_id, client_user_id, kind, start_at,
                                 time_zone)
    SELECT gen_random_uuid(), gen_random_uuid(), gen_random_uuid(),
           CASE WHEN n % 3 = 0 THEN gen_random_uuid() END, 'Meeting',
           now() + make_interval(mins => n - 100), 'UTC'
      FROM generate_series(1, 300) AS n
    RETURNING id, start_at
), r AS (
    INSERT INTO event_reminders (id, calendar_event_id, offset_minutes, due_at, status, sent_at,
                                 attempts, last_error)
    SELECT gen_random_uuid(), id, 15, start_at - interval '15 minutes',
           CASE WHEN start_at < now() THEN 'Sent' ELSE 'Pending' END,
           CASE WHEN start_at < now() THEN start_at END,
           CASE WHEN n % 10 = 0 THEN 1 ELSE 0 END, NULL
      FROM (SELECT e.*, row_number() OVER () AS n FROM e) AS e
    RETURNING id, calendar_event_id, due_at, status
)
INSERT INTO outbox (topic, message_key, payload, reminder_id, due_at, published_at)
SELECT 'pin.calendar.reminder-due.v1', calendar_event_id::text, CAST('{}' AS jsonb), id, due_at, now()
  FROM r WHERE status = 'Sent'
"""


def _counts(engine: Engine) -> tuple[int, int, int]:
    with engine.connect() as conn:
        return tuple(  # type: ignore[return-value]
            conn.exec_driver_sql(f"SELECT count(*) FROM {table}").scalar_one()
            for table in ("calendar_events", "event_reminders", "outbox")
        )


def test_an_upgrade_from_0006_stopped_half_way_is_finished_by_the_next_run(
    empty_engine, monkeypatch
):
    migrate.upgrade(empty_engine, "0006")
    with empty_engine.begin() as conn:
        conn.execute(sa.text(CALENDAR_AT_0006))
    rows = _counts(empty_engine)
    monkeypatch.setattr(online_ddl, "ATTEMPTS", 1)
    # Another DDL (a DBA's VACUUM would do the same) holds outbox: 0009's last step, its storage
    # parameters, cannot have the table; everything before it can.
    with (
        open_transaction(empty_engine, "LOCK TABLE outbox IN SHARE UPDATE EXCLUSIVE MODE"),
        pytest.raises(online_ddl.LockNotGranted, match=r"^ALTER TABLE outbox: "),
    ):
        migrate.upgrade(empty_engine)
    assert migrate.current_revision(empty_engine) == "0008"
    assert _index_valid(empty_engine, "ix_event_reminders_poison") is True
    with empty_engine.connect() as conn:
        assert sa.inspect(conn).has_table("due_scan_position")
    # The one step not done: outbox's autovacuum as 0001 left it.
    assert [found[:2] for found in schema_differences(empty_engine)] == [
        ("storage parameters", "outbox")
    ]

    migrate.upgrade(empty_engine)
    assert migrate.current_revision(empty_engine) == migrate.head_revision()
    assert schema_differences(empty_engine) == []
    assert _counts(empty_engine) == rows
    migrate.upgrade(empty_engine)
    assert schema_differences(empty_engine) == []
