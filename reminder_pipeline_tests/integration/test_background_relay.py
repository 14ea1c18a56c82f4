"""A drain's background relay: handed-over rows published once, in outbox id order, the relay's rules kept.

Against the real database and broker. The relay of a multi-batch drain is fed each committed
batch's outbox rows in memory; these tests pin what must not change because of that: every row
published exactly once and marked, older unpublished rows (an earlier cycle's, another
instance's) first, nothing published while another relay holds the lock.
"""

from __future__ import annotations

import gc
import threading
import time
from collections import Counter
from datetime import timedelta

from reminder_pipeline import cycle
from reminder_pipeline.messaging.relay import OutboxRelay
from reminder_pipeline.store import outbox_queries, outbox_repository, queries, repository

from ..support import make_event, outbox_rows, reminders, utcnow


def _events(engine, n: int, start_minutes: int = 50):
    """``n`` events with two due reminders each (same key twice: per-key order is observable)."""
    now = utcnow()
    return [
        make_event(
            engine,
            start_at=now + timedelta(minutes=start_minutes + i % 5),
            offsets=(70, 65),
            now=now - timedelta(days=1),
        )
        for i in range(n)
    ]


def _assert_once_in_outbox_order(engine, kafka_reader, event_ids) -> None:
    ids = [r["id"] for e in event_ids for r in reminders(engine, e)]
    messages = kafka_reader.wait_for(ids)
    assert Counter(m.value["ReminderId"] for m in messages) == Counter(str(i) for i in ids)
    rows = outbox_rows(engine)
    assert all(o["published_at"] is not None and o["publish_attempts"] == 0 for o in rows)
    order = {str(o["reminder_id"]): o["id"] for o in rows}
    by_key: dict[str, list[int]] = {}
    for m in sorted(messages, key=lambda m: (m.partition, m.offset)):
        by_key.setdefault(m.key, []).append(order[m.value["ReminderId"]])
    for key, outbox_ids in by_key.items():
        assert outbox_ids == sorted(outbox_ids), f"key {key} out of outbox order"


def test_a_drain_publishes_every_batch_once_while_it_writes_the_next(
    engine, publisher, kafka_reader
):
    event_ids = _events(engine, 23)
    counts, relay = cycle.drain(engine, utcnow(), 5, max_batches=100, publisher=publisher)
    assert counts.sent == 46 and counts.batches == 10  # 9 full batches and a short last one
    assert relay.published == 46 and relay.failed == 0 and not relay.busy
    _assert_once_in_outbox_order(engine, kafka_reader, event_ids)


def test_rows_an_earlier_cycle_left_unpublished_go_out_first(engine, publisher, kafka_reader):
    earlier = _events(engine, 6)
    cycle.drain(engine, utcnow(), 1000)  # written, never published (a broker outage, say)
    assert all(o["published_at"] is None for o in outbox_rows(engine))
    later = _events(engine, 6, start_minutes=40)
    _, relay = cycle.drain(engine, utcnow(), 4, max_batches=100, publisher=publisher)
    assert relay.published == 24
    _assert_once_in_outbox_order(engine, kafka_reader, earlier + later)


def test_an_older_unpublished_row_written_meanwhile_is_read_from_the_outbox_first(
    engine, publisher, kafka_reader
):
    relay = OutboxRelay(engine, publisher).start(deadline=time.monotonic() + 60)
    try:
        # Another instance commits a row (no hand-over: only the outbox knows it) ...
        foreign = _events(engine, 1)
        cycle.drain(engine, utcnow(), 1000)
        foreign_ids = {o["id"] for o in outbox_rows(engine)}
        # ... then this drain commits a batch and hands it over: its ids are newer.
        ours = _events(engine, 3, start_minutes=40)
        batch = cycle.dispatch_batch(engine, utcnow(), 1000)
        assert len(batch.messages) == 6 and min(m.id for m in batch.messages) > max(foreign_ids)
        relay.hand_over(batch.messages)
    finally:
        result = relay.finish(timeout=60)
    assert result.published == 8  # the foreign 2 and our 6, each once
    _assert_once_in_outbox_order(engine, kafka_reader, foreign + ours)


def test_with_another_relay_holding_the_lock_nothing_is_published_and_rows_stay(engine, publisher):
    _events(engine, 2)
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as other:
        other.execute(outbox_queries.TRY_RELAY_LOCK, {"key": outbox_queries.RELAY_LOCK_KEY})
        relay = OutboxRelay(engine, publisher, lock_wait_seconds=0.2).start(
            deadline=time.monotonic() + 30
        )
        batch = cycle.dispatch_batch(engine, utcnow(), 1000)
        relay.hand_over(batch.messages)
        result = relay.finish(timeout=30)
        other.execute(outbox_queries.RELAY_UNLOCK, {"key": outbox_queries.RELAY_LOCK_KEY})
    assert result.busy and result.published == 0
    # A stopped relay takes nothing more in memory (a drain through an outage or a busy lock
    # would otherwise keep every batch): the rows wait in the outbox.
    more = _events(engine, 1, start_minutes=40)
    later = cycle.dispatch_batch(engine, utcnow(), 1000)
    assert len(later.messages) == 2 and more
    relay.hand_over(later.messages)
    assert not relay.running and relay.queued == 0
    assert len(outbox_rows(engine)) == 6
    assert all(o["published_at"] is None for o in outbox_rows(engine))  # the lock holder's work


class _HeldPublisher:
    """The real publisher, held at each publish until released: a relay falling behind."""

    def __init__(self, publisher) -> None:
        self._publisher = publisher
        self.entered = threading.Event()
        self.release = threading.Event()

    def publish(self, messages, timeout=None):
        self.entered.set()
        assert self.release.wait(60)
        return self._publisher.publish(messages, timeout)


def test_a_dispatcher_waits_for_a_relay_that_falls_behind_and_nothing_is_lost(
    engine, publisher, kafka_reader
):
    event_ids = _events(engine, 5)  # 10 due rows: 5 batches of 2
    held = _HeldPublisher(publisher)
    relay = OutboxRelay(engine, held).start(deadline=time.monotonic() + 120, max_queued=2)
    try:
        relay.hand_over(cycle.dispatch_batch(engine, utcnow(), 2).messages)
        assert held.entered.wait(30)  # the thread took the first batch and is publishing it
        for _ in range(2):
            relay.hand_over(cycle.dispatch_batch(engine, utcnow(), 2).messages)
        assert relay.queued == 2
        fourth = cycle.dispatch_batch(engine, utcnow(), 2).messages
        waiting = threading.Thread(target=relay.hand_over, args=(fourth,))
        waiting.start()
        waiting.join(0.5)
        assert waiting.is_alive() and relay.queued == 2  # no third batch waits in memory
        held.release.set()
        waiting.join(30)
        assert not waiting.is_alive()
        relay.hand_over(cycle.dispatch_batch(engine, utcnow(), 2).messages)
    finally:
        held.release.set()
        result = relay.finish(timeout=60)
    assert result.published == 10 and result.failed == 0
    _assert_once_in_outbox_order(engine, kafka_reader, event_ids)


def test_batches_queued_while_the_relay_publishes_go_out_in_one_round(
    engine, publisher, kafka_reader
):
    event_ids = _events(engine, 4)  # 8 due rows: 4 batches of 2
    held = _HeldPublisher(publisher)
    relay = OutboxRelay(engine, held).start(deadline=time.monotonic() + 120, max_queued=5)
    try:
        relay.hand_over(cycle.dispatch_batch(engine, utcnow(), 2).messages)
        assert held.entered.wait(30)  # the first batch is being published
        for _ in range(3):
            relay.hand_over(cycle.dispatch_batch(engine, utcnow(), 2).messages)
        # The three wait behind it (a relay thread slower to start than the first batch's commit
        # read that batch from the outbox instead: its hand-over waits too, and goes as seen).
        assert relay.queued in (3, 4)
    finally:
        held.release.set()
        result = relay.finish(timeout=60)
    # The first batch, then the three that queued up meanwhile in one produce-flush-mark round.
    assert (result.published, result.batches) == (8, 2)
    _assert_once_in_outbox_order(engine, kafka_reader, event_ids)


def test_hand_overs_do_not_wait_while_the_relay_waits_for_the_lock(engine, publisher, kafka_reader):
    event_ids = _events(engine, 3)  # 6 due rows: 3 batches of 2
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as other:
        other.execute(outbox_queries.TRY_RELAY_LOCK, {"key": outbox_queries.RELAY_LOCK_KEY})
        relay = OutboxRelay(engine, publisher, lock_wait_seconds=60).start(
            deadline=time.monotonic() + 120, max_queued=1
        )
        try:
            batches = [cycle.dispatch_batch(engine, utcnow(), 2).messages for _ in range(3)]
            handing = threading.Thread(target=lambda: [relay.hand_over(b) for b in batches])
            handing.start()
            handing.join(30)
            assert not handing.is_alive()  # the relay may never get the lock: nobody waits on it
            assert relay.queued == 3
            other.execute(outbox_queries.RELAY_UNLOCK, {"key": outbox_queries.RELAY_LOCK_KEY})
        finally:
            result = relay.finish(timeout=60)
    assert result.published == 6 and not result.busy
    _assert_once_in_outbox_order(engine, kafka_reader, event_ids)


def test_a_hand_over_another_relay_published_before_the_lock_came_is_not_published_again(
    engine, publisher, kafka_reader
):
    # Four runs at once (defs/test_parallel_runs.py): run A's relay, holding the lock, published
    # from the outbox the rows run B had committed and handed to its own relay, still waiting for
    # the lock; B's relay then published them again.
    _events(engine, 3)  # 6 due rows: 3 batches of 2
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as other:
        other.execute(outbox_queries.TRY_RELAY_LOCK, {"key": outbox_queries.RELAY_LOCK_KEY})
        relay = OutboxRelay(engine, publisher, lock_wait_seconds=60).start(
            deadline=time.monotonic() + 120, max_queued=1
        )
        try:
            batches = [cycle.dispatch_batch(engine, utcnow(), 2).messages for _ in range(3)]
            for batch in batches:
                relay.hand_over(batch)
            # The lock holder publishes the first batch (its marks are what a relay leaves).
            outbox_repository.mark_published(other, [(m.id, 0, None) for m in batches[0]])
            other.execute(outbox_queries.RELAY_UNLOCK, {"key": outbox_queries.RELAY_LOCK_KEY})
        finally:
            result = relay.finish(timeout=60)
    assert result.published == 4 and not result.busy
    first = {
        str(r["reminder_id"]) for r in outbox_rows(engine) if r["id"] in {m.id for m in batches[0]}
    }
    rest = [str(r["reminder_id"]) for r in outbox_rows(engine)]
    kafka_reader.wait_for([r for r in rest if r not in first], timeout=60)
    kafka_reader.drain()
    assert Counter(m.value["ReminderId"] for m in kafka_reader.for_reminders(rest)) == Counter(
        {r: 1 for r in rest if r not in first}
    )


def test_the_drain_leaves_the_collector_as_it_found_it(engine, publisher):
    _events(engine, 2)
    before = gc.get_threshold()
    cycle.drain(engine, utcnow(), 1, max_batches=10, publisher=publisher)
    assert gc.get_threshold() == before


def test_the_due_columns_name_every_field_of_due_reminder(engine):
    """Rows become DueReminder by column name: each statement that locks and reads due rows
    names every field of the one row type (and the selection its count and where the next batch
    starts)."""
    from reminder_pipeline.domain.model import DueReminder

    names = list(DueReminder._fields)
    with engine.begin() as conn:
        result = conn.execute(
            queries.SELECT_DUE_FOR_UPDATE_SKIP_LOCKED,
            {"as_of": utcnow(), "batch_size": 1, **repository.scan_params()},
        )
        assert list(result.keys()) == [*names, "skipped_locked", "next_due_at", "next_id"]
        with engine.begin() as conn:
            result = conn.execute(
                queries.LOCK_CANDIDATES_SKIP_LOCKED,
                {"ids": [], "as_of": utcnow(), "reserved_by": None},
            )
            assert list(result.keys()) == names
