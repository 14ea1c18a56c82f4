"""The shared de-duplication store in the real PostgreSQL, made by compose's initdb role script.

Its login can read, insert and delete rows of ``reminder_dedup`` and nothing else: no other
table, no DDL, no temporary tables, no other database's data. Through the real broker, two
members of one group where the first is killed before its offset commit: with a SQLite file per
host the next owner of the partition notifies that reminder again (the duplicate the contract
rules out, observed here), with the shared PostgreSQL store it does not.
"""

from __future__ import annotations

import threading
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from confluent_kafka import Message
from sqlalchemy.engine import make_url

from reminder_pipeline.config import ConfigError
from reminder_pipeline.consumer import PostgresDedupStore, ReminderConsumer, SqliteDedupStore
from reminder_pipeline.consumer.dedup import DedupStore, DedupStoreError

from .lane import IDLE_TIMEOUT, Lane, RecordingSink, a_payload


def _dsn(url: str, database: str | None = None) -> str:
    parsed = make_url(url).set(drivername="postgresql")
    return (parsed.set(database=database) if database else parsed).render_as_string(
        hide_password=False
    )


def test_the_store_remembers_across_connections_and_prunes_past_its_retention(
    shared_dedup_url: str,
) -> None:
    reminder, owner, event = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    with PostgresDedupStore(shared_dedup_url) as one, PostgresDedupStore(shared_dedup_url) as two:
        one.mark_delivered(reminder, owner, uuid.uuid4())
        assert two.is_delivered(reminder, owner) and not two.is_handled(reminder)
        one.mark_handled(reminder, event)
        two.mark_handled(reminder, event)  # a second host recording the same fact: no error
        assert two.is_handled(reminder) and two.counts() == (1, 1)
        assert two.prune(timedelta(0)) == 2 and one.counts() == (0, 0)


def test_the_login_can_use_its_table_and_nothing_else(
    shared_dedup_url: str, database_url: str
) -> None:
    """Everything the consumer does works; every other act is refused by the server."""
    with psycopg.connect(_dsn(shared_dedup_url), autocommit=True) as conn:
        conn.execute(
            "INSERT INTO reminder_dedup (reminder_id, recipient_user_id, other_id) "
            "VALUES (gen_random_uuid(), gen_random_uuid(), gen_random_uuid())"
        )
        assert conn.execute("SELECT count(*) FROM reminder_dedup").fetchone() == (1,)
        assert conn.execute("DELETE FROM reminder_dedup").rowcount == 1
        for forbidden in (
            "UPDATE reminder_dedup SET other_id = gen_random_uuid()",
            "TRUNCATE reminder_dedup",
            "DROP TABLE reminder_dedup",
            "ALTER TABLE reminder_dedup ADD COLUMN x int",
            "CREATE INDEX nope ON reminder_dedup (other_id)",
            "CREATE TABLE public.mine (x int)",
            "CREATE TEMPORARY TABLE mine (x int)",
            "CREATE SCHEMA mine",
            "CREATE ROLE someone",
            "CREATE DATABASE another",
        ):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(forbidden)
    # The application's database (events with their titles, the outbox): no row of it.
    login = make_url(shared_dedup_url)
    app = make_url(database_url).set(username=login.username, password=login.password)
    try:
        conn = psycopg.connect(_dsn(app.render_as_string(hide_password=False)), autocommit=True)
    except psycopg.OperationalError:
        return  # not even a connection: stricter still
    with conn:
        for table in ("calendar_events", "event_reminders", "outbox"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(f"SELECT 1 FROM {table} LIMIT 1")


def test_a_bad_url_or_a_missing_table_is_one_line(shared_dedup_url: str) -> None:
    with pytest.raises(ConfigError, match=r"^--dedup-url: 'sqlite' is not a postgresql:// URL"):
        PostgresDedupStore("sqlite:///x.db")
    other_db = make_url(shared_dedup_url).set(database="postgres")
    with pytest.raises(DedupStoreError, match=r"^--dedup-url: ") as caught:
        PostgresDedupStore(other_db.render_as_string(hide_password=False))
    assert "\n" not in str(caught.value)


class Killed(BaseException):
    """The member dies: not an Exception, so nothing in the runner absorbs it."""


class DiesBeforeItsFirstCommit(ReminderConsumer):
    """A member killed after notifying its first reminder, before committing its offset."""

    def _commit(self, message: Message) -> None:
        raise Killed


def _two_members(lane: Lane, first: DedupStore, second: DedupStore) -> RecordingSink:
    """Member A is killed before its first commit; member B takes its partitions over."""
    payloads = [a_payload() for _ in range(9)]
    for i, p in enumerate(payloads):
        lane.produce(p, partition=i % 3)
    sink = RecordingSink([p["ReminderId"] for p in payloads])
    member_a = DiesBeforeItsFirstCommit(lane.kafka, sink, first, lane.options())
    with pytest.raises(Killed):
        member_a.run(idle_timeout=IDLE_TIMEOUT)
    assert len(sink.delivered) == 1  # notified, never committed
    member_b = ReminderConsumer(lane.kafka, sink, second, lane.options())
    done = threading.Event()

    def all_notified(*_: Any) -> None:
        if len(set(sink.reminder_ids())) == len(payloads):
            done.set()

    sink.stop = done
    original = sink.deliver

    def deliver(notification: Any) -> None:
        original(notification)
        all_notified()

    sink.deliver = deliver  # type: ignore[method-assign]
    member_b.run(stop=done, idle_timeout=IDLE_TIMEOUT)
    assert len(set(sink.reminder_ids())) == len(payloads)
    return sink


def test_a_member_killed_before_its_commit_with_a_file_per_host_notifies_twice(
    lane: Lane, tmp_path: Path
) -> None:
    """The duplicate with separate files: host B's file never heard of host A's delivery."""
    with (
        SqliteDedupStore(tmp_path / "host-a.sqlite3") as host_a,
        SqliteDedupStore(tmp_path / "host-b.sqlite3") as host_b,
    ):
        sink = _two_members(lane, host_a, host_b)
    duplicates = len(sink.delivered) - len(set(sink.reminder_ids()))
    assert duplicates == 1


def test_a_member_killed_before_its_commit_with_the_shared_store_notifies_once(
    lane: Lane, shared_dedup_url: str
) -> None:
    with (
        PostgresDedupStore(shared_dedup_url) as host_a,
        PostgresDedupStore(shared_dedup_url) as host_b,
    ):
        sink = _two_members(lane, host_a, host_b)
    assert len(sink.delivered) == len(set(sink.reminder_ids())) == 9
