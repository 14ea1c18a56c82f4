"""The shared de-duplication store in the real PostgreSQL, made by compose's initdb role script.

Its login can read, insert and delete rows of ``reminder_dedup`` and nothing else: no other
table, no DDL, no temporary tables, no other database's data. Through the real broker, two
members of one group under rebalances: B runs, A joins (the partitions are split), reminders
arrive, A is killed after notifying (and recording) its first batch and before committing it (its
partitions go to B, from before that batch). With a SQLite file per host B notifies those
reminders again (the duplicates the contract rules out, observed here); with the shared
PostgreSQL store it does not.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import psycopg
import pytest
from confluent_kafka import Message
from sqlalchemy.engine import make_url

from reminder_pipeline.cli.consume import consume_main
from reminder_pipeline.config import ConfigError, Settings
from reminder_pipeline.consumer import (
    PostgresDedupStore,
    ReminderConsumer,
    SqliteDedupStore,
)
from reminder_pipeline.consumer.dedup import DedupStore, DedupStoreError

from .lane import Lane, RecordingSink, a_payload, committed, wait_until

#: Group joins against the embedded broker take seconds; generous on a shared machine.
JOIN_TIMEOUT = 60.0


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
    with pytest.raises(
        ConfigError, match=r"^--dedup-url: 'sqlite:///x.db' is not a postgresql:// URL"
    ):
        PostgresDedupStore("sqlite:///x.db")
    other_db = make_url(shared_dedup_url).set(database="postgres")
    with pytest.raises(DedupStoreError, match=r"^--dedup-url: ") as caught:
        PostgresDedupStore(other_db.render_as_string(hide_password=False))
    assert "\n" not in str(caught.value)


class Killed(BaseException):
    """The member dies: not an Exception, so nothing in the runner absorbs it."""


class DiesBeforeItsFirstCommit(ReminderConsumer):
    """A member killed after notifying its first batch, before committing its offsets."""

    def _commit(self, message: Message) -> None:
        raise Killed


def _await(condition: Callable[[], bool], what: str, timeout: float = JOIN_TIMEOUT) -> None:
    wait_until(condition, then=lambda: None, timeout=timeout)
    assert condition(), f"timed out waiting for {what}"


def _two_members(lane: Lane, first: DedupStore, second: DedupStore) -> tuple[RecordingSink, int]:
    """B runs; A joins (a rebalance splits the partitions); reminders arrive; A is killed before
    its first commit (a rebalance gives B its partitions, from before A's batch). Returns the
    sink and how many reminders A notified before it was killed (its first batch)."""
    sink = RecordingSink()
    member_b = ReminderConsumer(lane.kafka, sink, second, lane.options())
    member_a = DiesBeforeItsFirstCommit(lane.kafka, sink, first, lane.options())
    stop_b, outcome_a = threading.Event(), []

    def run_a() -> None:
        try:
            member_a.run()
        except Killed:
            outcome_a.append("killed")

    thread_b = threading.Thread(target=member_b.run, kwargs={"stop": stop_b}, daemon=True)
    thread_a = threading.Thread(target=run_a, daemon=True)
    thread_b.start()
    try:
        _await(lambda: len(member_b.owned) == 3, "B to own every partition")
        before = member_b.assignments
        thread_a.start()
        _await(
            lambda: (
                member_b.assignments > before
                and bool(member_a.owned)
                and len(member_a.owned | member_b.owned) == 3
            ),
            "the rebalance to split the partitions between A and B",
        )
        payloads = [a_payload() for _ in range(9)]
        for i, p in enumerate(payloads):
            lane.produce(p, partition=i % 3)
        wanted = {p["ReminderId"] for p in payloads}
        _await(lambda: outcome_a == ["killed"], "A to be killed before its first commit")
        _await(
            lambda: (
                set(sink.reminder_ids()) == wanted
                and committed(lane.kafka, lane.group_id, lane.topic) == {0: 3, 1: 3, 2: 3}
            ),
            "B to notify every reminder and commit every partition to its end",
        )
    finally:
        stop_b.set()
        thread_b.join(timeout=30)
        thread_a.join(timeout=30)
    assert not thread_b.is_alive() and not thread_a.is_alive()
    return sink, member_a.stats.reminders_notified


def test_a_member_killed_before_its_commit_with_a_file_per_host_notifies_twice(
    lane: Lane, tmp_path: Path
) -> None:
    """The duplicate with separate files: host B's file never heard of host A's delivery."""
    with (
        SqliteDedupStore(tmp_path / "host-a.sqlite3") as host_a,
        SqliteDedupStore(tmp_path / "host-b.sqlite3") as host_b,
    ):
        sink, notified_by_a = _two_members(lane, host_a, host_b)
    duplicates = len(sink.delivered) - len(set(sink.reminder_ids()))
    # A's notified and uncommitted batch (one reminder or more), each notified again by B.
    assert notified_by_a >= 1 and duplicates == notified_by_a


def test_a_member_killed_before_its_commit_with_the_shared_store_notifies_once(
    lane: Lane, shared_dedup_url: str
) -> None:
    with (
        PostgresDedupStore(shared_dedup_url) as host_a,
        PostgresDedupStore(shared_dedup_url) as host_b,
    ):
        sink, notified_by_a = _two_members(lane, host_a, host_b)
    assert notified_by_a >= 1
    assert len(sink.delivered) == len(set(sink.reminder_ids())) == 9


def test_consume_with_a_dedup_url_remembers_in_postgresql(
    lane: Lane, shared_dedup_url: str, tmp_path: Path
) -> None:
    """``consume --dedup-url`` end to end: the reminder is notified and remembered in the table."""
    message = a_payload()
    lane.produce(message)
    settings = Settings.from_env(
        {
            "KAFKA_BOOTSTRAP_SERVERS": lane.kafka.bootstrap_servers,
            "REMINDER_PIPELINE_HOME": str(tmp_path),
        }
    )
    sink = RecordingSink()
    code = consume_main(
        settings,
        group_id=lane.group_id,
        dedup_url=shared_dedup_url,
        once=True,
        sink=sink,
        options=lane.options(once_idle_seconds=1.0),
    )
    assert code == 0 and sink.reminder_ids() == [message["ReminderId"]]
    with PostgresDedupStore(shared_dedup_url) as store:
        assert store.is_handled(uuid.UUID(message["ReminderId"]))
    assert not (tmp_path / "notifications").exists()  # no SQLite file beside it
