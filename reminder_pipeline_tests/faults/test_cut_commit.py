"""A commit whose answer never comes (issue 34, item 5), on the session's real PostgreSQL and
broker.

A fault proxy (:mod:`reminder_pipeline_testkit.fault_proxy`) between a client and PostgreSQL cuts
the connection right after the client sent the statement that commits, before its answer reaches it,
with the server either having it (it commits) or not (it rolls back). The client cannot know which.
For each of three writes, in both outcomes, nothing is lost and nothing doubles:

* a dispatch batch's ``COMMIT`` mid-drain: the cycle fails in one line (exit 1 on the command
  line), and the next cycle, through the same engine once the proxy passes again, leaves every
  due reminder Sent or Skipped once, one outbox row per Sent reminder, each published once;
* the relay's mark-published statement (its connection is AUTOCOMMIT: the statement is its own
  commit), by a relay pass and by a drain's relay thread: the call fails in one line; marked, the
  next relay publishes nothing again; not marked, it publishes the rows again (at least once),
  each second copy the same payload bytes, key and identity headers;
* the consumer's de-dup write (the PostgreSQL store, AUTOCOMMIT): each reminder notified once,
  and the store remembers every one of them, so a redelivery of them all notifies nobody again.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from confluent_kafka import Consumer, TopicPartition
from sqlalchemy.engine import Engine

from reminder_pipeline import cycle
from reminder_pipeline.cli import exits
from reminder_pipeline.config import KafkaSettings
from reminder_pipeline.consumer import ConsumerMetrics, PostgresDedupStore, ReminderConsumer
from reminder_pipeline.consumer import metrics as m
from reminder_pipeline.domain import contract
from reminder_pipeline.domain.model import CycleCounts
from reminder_pipeline.messaging.kafka import KafkaPublisher
from reminder_pipeline.messaging.relay import publish_outbox
from reminder_pipeline.store.engine import make_engine
from reminder_pipeline_testkit.dedup_store import dedup_database
from reminder_pipeline_testkit.fault_proxy import FaultProxy, pg_url_via

from ..chaos.harness import check_invariants, seed_mixed
from ..consumer.lane import RecordingSink, a_payload, committed, new_lane
from ..support import KafkaReader, ReadMessage, make_due_event, outbox_rows, reminders, utcnow

pytestmark = pytest.mark.server

#: The two outcomes of a cut: the server got the statement (and committed), or it did not.
OUTCOMES = [pytest.param(True, id="server-committed"), pytest.param(False, id="server-did-not")]
#: The application name of the connections that go through the proxy (the cut matches only them).
APP = "rp-cut-commit"
#: The statement that commits a transaction (psycopg sends it alone). Anchored: psycopg starts a
#: transaction with ``BEGIN ISOLATION LEVEL READ COMMITTED``, which a bare ``COMMIT`` would match.
COMMIT = rb"^\s*COMMIT\b"
#: The relay's mark (store/queries.py MARK_PUBLISHED).
MARK_PUBLISHED = rb"UPDATE\s+outbox\s+SET\s+published_at"
#: The de-dup store's write (consumer/dedup.py PostgresDedupStore.record).
DEDUP_WRITE = rb"INSERT\s+INTO\s+reminder_dedup"
#: Generous on a loaded machine: a wait that does not end fails here rather than hanging.
DEADLINE = 60.0


def _await(condition: Callable[[], bool], what: str, timeout: float = DEADLINE) -> None:
    """Poll ``condition`` (a cheap read) until it holds; fail naming ``what`` if it never does."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@pytest.fixture
def cut_engine(database_url_via_proxy: str) -> Iterator[Engine]:
    """The application's engine on the test's database, through the fault proxy."""
    engine = make_engine(database_url_via_proxy, application_name=APP)
    yield engine
    engine.dispose()


def _sessions_settled(engine: Engine) -> bool:
    """No session through the proxy is inside a transaction or running a statement: a cut
    session has committed or rolled back and is gone, and its locks with it."""
    with engine.connect() as conn:
        busy = conn.execute(
            sa.text(
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE application_name = :app AND state IS DISTINCT FROM 'idle'"
            ),
            {"app": APP},
        ).scalar_one()
    return busy == 0


def _relay_threads_done() -> bool:
    return not any(t.name == "outbox-relay" and t.is_alive() for t in threading.enumerate())


def _assert_one_line_failure(error: BaseException) -> None:
    """What the command line makes of it: an infrastructure failure, exit 1, one line."""
    assert exits.exit_code(error) == exits.EXIT_FAILURE, repr(error)
    line = exits.message(error)
    assert line.startswith("database error: ") and "\n" not in line, line


def _read_to_the_end(reader: KafkaReader, settings: KafkaSettings) -> None:
    """Read the topic up to where it ends now (each partition's high watermark): every copy the
    relays produced is acknowledged by then, so a second copy cannot be missed."""
    probe = Consumer({**settings.client_config(), "group.id": f"cut-commit-{uuid.uuid4().hex[:8]}"})
    try:
        ends = {
            p: probe.get_watermark_offsets(TopicPartition(reader.topic, p), timeout=10)[1]
            for p in range(contract.PARTITIONS)
        }
    finally:
        probe.close()

    def read_all() -> bool:
        last: dict[int, int] = {}
        for msg in reader.messages:
            last[msg.partition] = max(last.get(msg.partition, -1), msg.offset)
        return all(last.get(p, -1) + 1 >= end for p, end in ends.items() if end > 0)

    _await(lambda: read_all() or bool(reader.drain(idle=0.2)), "the topic read to its end")


def _done(engine: Engine) -> int:
    """Reminders that left Pending (Sent or Skipped)."""
    with engine.connect() as conn:
        return int(
            conn.execute(
                sa.text("SELECT count(*) FROM event_reminders WHERE status <> 'Pending'")
            ).scalar_one()
        )


# -- a dispatch batch's COMMIT --------------------------------------------------------------------


@pytest.mark.parametrize("server_gets_it", OUTCOMES)
def test_a_batch_commit_cut_mid_drain_is_neither_lost_nor_doubled_by_the_next_cycle(
    server_gets_it: bool,
    engine: Engine,
    cut_engine: Engine,
    pg_proxy: FaultProxy,
    publisher: KafkaPublisher,
    kafka_reader: KafkaReader,
    kafka_settings: KafkaSettings,
    caplog: pytest.LogCaptureFixture,
) -> None:
    scenario = seed_mixed(engine, 40, seed=34)
    first: list[CycleCounts] = []

    def arm_after_the_first_batch(counts: CycleCounts) -> None:
        # Batch 1 committed and went to the relay; the next COMMIT (batch 2's) is cut.
        if not first:
            first.append(counts)
            pg_proxy.cut_after(COMMIT, server_gets_it=server_gets_it, application_name=APP)

    with (
        caplog.at_level(logging.INFO, logger="reminder_pipeline"),
        pytest.raises(sa.exc.DBAPIError) as failed,
    ):
        cycle.run_cycle(
            cut_engine,
            publisher,
            batch_size=10,
            max_batches=50,
            budget_seconds=60,
            progress=arm_after_the_first_batch,
        )
    assert pg_proxy.wait_cuts(1, DEADLINE)
    _assert_one_line_failure(failed.value)
    # The log does not guess: the outcome of a COMMIT with no answer is the server's.
    messages = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("batch not confirmed: connection lost") for m in messages), messages
    assert "batch rolled back" not in messages

    # The failed cycle's relay let go, and the cut session is gone: its batch is whole either way.
    _await(_relay_threads_done, "the failed cycle's relay thread to end")
    _await(lambda: _sessions_settled(engine), "the cut session to end")
    batch_one = first[0].sent + first[0].skipped
    if server_gets_it:
        assert _done(engine) > batch_one, "the server had the COMMIT: batch 2 must be written"
    else:
        assert _done(engine) == batch_one, "the server never had the COMMIT: batch 2 rolled back"

    # The next cycle, through the same engine (its pool heals) and the proxy passing again.
    report = cycle.run_cycle(
        cut_engine, publisher, batch_size=10, max_batches=50, budget_seconds=60
    )
    assert not report.relay.busy and report.relay.failed == 0
    assert report.outbox_unpublished == 0
    verdict = check_invariants(engine, kafka_reader, scenario, report.as_of)
    _read_to_the_end(kafka_reader, kafka_settings)
    mine = Counter(
        msg.value["ReminderId"]
        for msg in kafka_reader.messages
        if msg.value.get("TenantId") == str(scenario.tenant_id)
    )
    assert verdict.sent > 0 and verdict.skipped > 0
    assert len(mine) == verdict.sent and set(mine.values()) == {1}, "a reminder published twice"


# -- the relay's mark-published -------------------------------------------------------------------


@pytest.mark.parametrize("drains", [False, True], ids=["a-relay-pass", "a-drains-relay"])
@pytest.mark.parametrize("server_gets_it", OUTCOMES)
def test_a_mark_published_cut_loses_nothing_and_a_second_copy_is_the_same_message(
    server_gets_it: bool,
    drains: bool,
    engine: Engine,
    cut_engine: Engine,
    pg_proxy: FaultProxy,
    publisher: KafkaPublisher,
    kafka_reader: KafkaReader,
    kafka_settings: KafkaSettings,
) -> None:
    events = [make_due_event(engine, minutes_overdue=minutes) for minutes in (5, 4, 3, 2, 1)]
    cycle.drain(engine, utcnow(), 1000)  # Sent, in the outbox, not yet published
    ids = [str(reminders(engine, e)[0]["id"]) for e in events]
    assert len(outbox_rows(engine)) == len(ids)

    pg_proxy.cut_after(MARK_PUBLISHED, server_gets_it=server_gets_it, application_name=APP)
    with pytest.raises(sa.exc.DBAPIError) as failed:
        if drains:  # a multi-batch cycle's relay thread, which starts with what the outbox holds
            cycle.run_cycle(cut_engine, publisher, batch_size=10, max_batches=5, budget_seconds=30)
        else:  # the relay step, the command line's `relay`
            publish_outbox(cut_engine, publisher, budget_seconds=30)
    assert pg_proxy.wait_cuts(1, DEADLINE)
    _assert_one_line_failure(failed.value)
    _await(_relay_threads_done, "the failed relay thread to end")
    _await(lambda: _sessions_settled(engine), "the cut relay session to end")

    marked = [o["published_at"] is not None for o in outbox_rows(engine)]
    assert marked == [server_gets_it] * len(ids)

    # The next relay, through the same engine and the proxy passing again.
    again = publish_outbox(cut_engine, publisher, budget_seconds=30)
    assert not again.busy and again.failed == 0
    assert again.published == (0 if server_gets_it else len(ids))
    assert all(o["published_at"] is not None for o in outbox_rows(engine)), "a row never marked"

    _read_to_the_end(kafka_reader, kafka_settings)
    copies: dict[str, list[ReadMessage]] = {}
    for msg in kafka_reader.for_reminders(ids):
        copies.setdefault(msg.value["ReminderId"], []).append(msg)
    assert sorted(copies) == sorted(ids), "a reminder never reached the topic"
    expected = 1 if server_gets_it else 2
    assert {r: len(c) for r, c in copies.items()} == dict.fromkeys(ids, expected)
    # A second copy is the same message: the same bytes, key and identity headers.
    identity = (contract.HEADER_REMINDER_ID, contract.HEADER_MESSAGE_ID)
    for first, *rest in copies.values():
        for copy in rest:
            assert (copy.raw_value, copy.key) == (first.raw_value, first.key)
            assert [copy.headers.get(h) for h in identity] == [first.headers[h] for h in identity]


# -- the consumer's de-dup write ------------------------------------------------------------------


@pytest.mark.parametrize("server_gets_it", OUTCOMES)
def test_a_dedup_write_cut_notifies_each_reminder_once_and_absorbs_a_redelivery(
    server_gets_it: bool,
    pg_admin_url: str,
    kafka_settings: KafkaSettings,
    pg_proxy: FaultProxy,
    tmp_path: Path,
) -> None:
    lane = new_lane(kafka_settings, tmp_path)
    payloads = [a_payload() for _ in range(6)]
    for i, p in enumerate(payloads):
        lane.produce(p, partition=i % 3)
    wanted = [p["ReminderId"] for p in payloads]

    with dedup_database(pg_admin_url) as url:
        through = pg_url_via(url, pg_proxy)
        through += ("&" if "?" in through else "?") + f"application_name={APP}"
        with PostgresDedupStore(through) as store:
            # The first write's answer is lost, and so is that of the store's own second try on a
            # new connection: the store is away, the runner holds the batch, and once the store
            # answers the batch's deliveries are recorded before anything else is asked.
            pg_proxy.cut_after(
                DEDUP_WRITE, server_gets_it=server_gets_it, times=2, application_name=APP
            )
            sink, metrics, stop = RecordingSink(), ConsumerMetrics(), threading.Event()
            consumer = ReminderConsumer(lane.kafka, sink, store, lane.options(), metrics)
            thread = threading.Thread(target=consumer.run, kwargs={"stop": stop}, daemon=True)
            thread.start()
            try:
                _await(lambda: len(sink.delivered) >= len(wanted), "every reminder notified")
                _await(
                    lambda: (
                        sum(committed(lane.kafka, lane.group_id, lane.topic).values())
                        == len(wanted)
                    ),
                    "every offset committed",
                )
            finally:
                stop.set()
                thread.join(timeout=60)
            assert not thread.is_alive()
        assert pg_proxy.cuts_done() == 2
        outages = metrics.registry.get_sample_value(m.OUTAGES, {"dependency": "dedup_store"})
        assert outages == 1
        assert Counter(sink.reminder_ids()) == Counter(wanted), "a reminder notified twice or lost"

        # Every reminder is remembered, the cut write's too: a redelivery of them all (a new
        # group reads the topic from the start) notifies nobody again.
        with PostgresDedupStore(url) as direct:
            assert direct.counts()[0] == len(wanted)
            again = RecordingSink()
            replay = ReminderConsumer(
                lane.kafka, again, direct, lane.options(group_id=f"{lane.group_id}-replay")
            )
            stats = replay.run(max_messages=len(wanted), idle_timeout=20)
        assert stats.duplicates == len(wanted) and again.delivered == []
