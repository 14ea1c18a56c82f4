"""The outbox relay: unpublished outbox rows to Kafka, at least once, in id order, then marked published."""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Protocol

from sqlalchemy.engine import Connection, Engine

from ..logs import event
from ..store import repository
from ..store.repository import ClaimedMessage
from .kafka import DeliveryResult

log = logging.getLogger(__name__)


class Publisher(Protocol):
    """What the relay needs from a producer."""

    def publish(self, messages: Sequence[ClaimedMessage], timeout: float) -> list[DeliveryResult]:
        """Produce and report per-row delivery."""


@dataclass
class RelayResult:
    """What one relay pass did."""

    published: int = 0
    failed: int = 0
    batches: int = 0
    busy: bool = False
    last_error: str | None = None

    def merge(self, other: RelayResult) -> RelayResult:
        """Add another pass's result to this one; returns self."""
        self.published += other.published
        self.failed += other.failed
        self.batches += other.batches
        self.busy = self.busy or other.busy
        self.last_error = other.last_error or self.last_error
        return self


def acknowledged_in_key_order(
    messages: Sequence[ClaimedMessage], results: Sequence[DeliveryResult]
) -> list[int]:
    """Ids safe to mark published: per key, the acknowledged rows before the first failure.

    A failed row holds back the later rows of its key, so they are produced again after it on
    the next pass and a consumer never sees a key's reminders only out of order.
    """
    error_by_id = {r.outbox_id: r.error for r in results}
    blocked: set[str] = set()
    ok: list[int] = []
    for message in sorted(messages, key=lambda m: m.id):
        if message.message_key in blocked:
            continue
        if error_by_id.get(message.id) is None and message.id in error_by_id:
            ok.append(message.id)
        else:
            blocked.add(message.message_key)
    return ok


@contextmanager
def relay_lock(
    engine: Engine, wait_seconds: float, correlation_id: str | None = None
) -> Iterator[Connection | None]:
    """Hold the relay's session advisory lock for the block; yields None when another relay has it.

    The lock lives on an AUTOCOMMIT connection, which the relay then uses for its statements
    (each one atomic on its own): holding the lock never keeps a transaction, and its snapshot,
    open while the broker is slow.
    """
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        if not repository.try_relay_lock(conn) and not repository.wait_relay_lock(
            conn, wait_seconds
        ):
            event(log, logging.INFO, "relay busy in another process", run_id=correlation_id)
            yield None
            return
        try:
            yield conn
        finally:
            repository.release_relay_lock(conn)


def _publish_and_mark(
    conn: Connection,
    publisher: Publisher,
    messages: Sequence[ClaimedMessage],
    deadline: float,
    result: RelayResult,
    correlation_id: str | None,
    on_acknowledged: Callable[[list[int]], None] | None = None,
) -> bool:
    """Produce ``messages``, mark the acknowledged ones (key order kept); False after a failure."""
    results = publisher.publish(messages, timeout=max(deadline - time.monotonic(), 1.0))
    ok = acknowledged_in_key_order(messages, results)
    if on_acknowledged is not None:
        on_acknowledged(ok)
    failed = len(messages) - len(ok)
    repository.mark_published(conn, ok)
    if failed:
        acknowledged = set(ok)
        repository.record_publish_failures(
            conn, [m.id for m in messages if m.id not in acknowledged]
        )
    result.batches += 1
    result.published += len(ok)
    if failed:
        result.failed += failed
        result.last_error = next((r.error for r in results if r.error), None)
        event(log, logging.ERROR, "outbox publish failed; rows stay unpublished",
              run_id=correlation_id, failed=failed, published=len(ok), error=result.last_error)
        return False
    return True


def _publish_from_outbox(
    conn: Connection,
    publisher: Publisher,
    *,
    batch_size: int,
    deadline: float,
    result: RelayResult,
    correlation_id: str | None,
    on_acknowledged: Callable[[list[int]], None] | None = None,
    stop: threading.Event | None = None,
    seen: set[int] | None = None,
) -> bool:
    """Publish unpublished rows read from the outbox, oldest id first, until none are left.

    Must run under :func:`relay_lock`. Returns False after a failed delivery (the rest waits).
    ``seen`` collects the ids handed to the producer.
    """
    while time.monotonic() < deadline and not (stop is not None and stop.is_set()):
        messages = repository.unpublished(conn, batch_size)
        if not messages:
            return True
        if seen is not None:
            seen.update(m.id for m in messages)
        if not _publish_and_mark(conn, publisher, messages, deadline, result, correlation_id,
                                 on_acknowledged):
            return False
    return True


def relay_outbox(
    engine: Engine,
    publisher: Publisher,
    *,
    batch_size: int = 1000,
    budget_seconds: float = 30.0,
    lock_wait_seconds: float = 1.0,
    correlation_id: str | None = None,
    on_acknowledged: Callable[[list[int]], None] | None = None,
    stop: threading.Event | None = None,
) -> RelayResult:
    """Publish unpublished outbox rows until none are left, the budget ends or the broker fails.

    One relay publishes per database at a time (a session advisory lock, held on a connection
    with no transaction open): a single writer keeps each key's messages in outbox order on the
    topic. A second relay waits up to ``lock_wait_seconds`` and then leaves the work to the first:
    the holder keeps reading until the outbox has nothing unpublished (a drain's relay checks for
    older rows before each batch), so the wait only has to cover a holder that read its last,
    empty batch just before this relay's rows committed; a second is plenty, and a longer wait
    only made parallel catch-ups end late.
    A row is marked published only after its delivery report succeeded; a crash in between
    publishes it again (at least once). A row handed over but not acknowledged gets one more
    ``outbox.publish_attempts`` (failed attempts).
    ``on_acknowledged`` is called with the acknowledged ids just before they are marked (the
    crash-point tests stop the process there). ``stop``, when set, ends the pass before its next
    batch.
    """
    result = RelayResult()
    deadline = time.monotonic() + budget_seconds
    with relay_lock(engine, lock_wait_seconds, correlation_id) as conn:
        if conn is None:
            result.busy = True
            return result
        _publish_from_outbox(conn, publisher, batch_size=batch_size, deadline=deadline,
                             result=result, correlation_id=correlation_id,
                             on_acknowledged=on_acknowledged, stop=stop)
    return result


class BackgroundRelay:
    """The relay of a multi-batch drain, on a thread of its own, fed the rows just written.

    A catch-up otherwise alternates "write a batch" (Postgres busy) with "publish it" (broker and
    Python busy), and the relay would read back from the outbox every row the dispatcher has
    just written. Here the dispatcher hands each committed batch's outbox rows over
    (:meth:`hand_over`: ids from the insert's RETURNING, the payload as stored) and goes on
    writing the next batch while this thread produces, waits for the acknowledgements and marks
    the rows published. The relay's rules stay: it holds the advisory lock for the whole drain
    (one publisher per database), publishes older unpublished rows from the outbox first, and
    reads from the outbox again whenever an unpublished row older than a handed-over batch
    exists (another instance's, or left by a failure), so rows still go out in id order; a row
    is marked only after its acknowledgement. When the lock is busy (another relay is running)
    it publishes nothing: the other relay finds the rows in the outbox. After a failed delivery
    it stops for this cycle; the rows stay unpublished for the next pass.
    :meth:`finish` waits for the hand-overs to be published and returns the result.
    """

    def __init__(
        self,
        engine: Engine,
        publisher: Publisher,
        *,
        deadline: float,
        correlation_id: str | None = None,
        batch_size: int = 1000,
        lock_wait_seconds: float = 1.0,
        max_queued: int = 2,
    ) -> None:
        self._engine = engine
        self._publisher = publisher
        self._deadline = deadline
        self._correlation_id = correlation_id
        self._batch_size = batch_size
        self._lock_wait_seconds = lock_wait_seconds
        self.max_queued = max_queued
        self._queue: deque[list[ClaimedMessage]] = deque()
        self._ready = threading.Condition()
        self._closing = False
        self._publishing = False  # the lock is held: hand-overs beyond max_queued wait
        self._stop = threading.Event()
        self._result = RelayResult()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="outbox-relay", daemon=True)
        self._thread.start()

    def hand_over(self, messages: Sequence[ClaimedMessage]) -> None:
        """Outbox rows of a batch that just committed (any order; published in id order).

        Waits while :attr:`max_queued` batches are already waiting for a relay that holds the
        lock: a dispatcher never runs more than that far ahead of its relay (memory stays
        bounded, and when the relay falls behind, e.g. publishing the rows of several parallel
        dispatchers, this process's CPU goes to it). While the relay still waits for the lock
        (at most ``lock_wait_seconds``) nothing waits: it may never get it. Dropped when this relay has stopped (lock busy, a failed delivery, an
        error): the rows are in the outbox, where the next relay pass finds them, and a drain
        that goes on through a broker outage must not pile every batch up in memory.
        """
        if not messages:
            return
        with self._ready:
            while self.running and self._publishing and len(self._queue) >= self.max_queued:
                self._ready.wait(0.5)  # woken when the thread takes a batch or ends
            if self.running:
                self._queue.append(sorted(messages, key=lambda m: m.id))
                self._ready.notify_all()

    @property
    def running(self) -> bool:
        """Whether the relay thread still publishes what is handed over."""
        return self._thread.is_alive() and not self._stop.is_set()

    @property
    def queued(self) -> int:
        """Handed-over batches not yet taken up by the thread."""
        with self._ready:
            return len(self._queue)

    def _next(self) -> list[ClaimedMessage] | None:
        with self._ready:
            while not self._queue and not self._closing:
                self._ready.wait()
            batch = self._queue.popleft() if self._queue else None
            self._ready.notify_all()  # a dispatcher waiting for room
            return batch

    def _run(self) -> None:
        try:
            with relay_lock(self._engine, self._lock_wait_seconds, self._correlation_id) as conn:
                if conn is None:
                    self._result.busy = True
                    return
                with self._ready:
                    self._publishing = True
                self._publish(conn)
        except BaseException as exc:  # handed to the dispatcher's thread by finish()
            self._error = exc
        finally:
            with self._ready:  # anything handed over meanwhile is in the outbox already
                self._queue.clear()
                self._stop.set()  # not running any more: hand_over drops, and stops waiting
                self._ready.notify_all()

    def _publish(self, conn: Connection) -> None:
        seen: set[int] = set()  # ids a read from the outbox already handed to the producer
        common = {"publisher": self._publisher, "result": self._result,
                  "correlation_id": self._correlation_id}
        if not _publish_from_outbox(conn, batch_size=self._batch_size,
                                    deadline=self._deadline, stop=self._stop, seen=seen, **common):
            return
        while (batch := self._next()) is not None:
            if self._stop.is_set() or time.monotonic() >= self._deadline:
                return
            batch = [m for m in batch if m.id not in seen]
            if not batch:
                continue
            if repository.has_unpublished_before(conn, batch[0].id):
                ok = _publish_from_outbox(conn, batch_size=self._batch_size,
                                          deadline=self._deadline, stop=self._stop, seen=seen,
                                          **common)
            else:
                ok = _publish_and_mark(conn, messages=batch, deadline=self._deadline,
                                       **common)
            if not ok:
                return

    def finish(self, timeout: float | None = None) -> RelayResult:
        """Publish what was handed over, stop the thread, return what it did (re-raising its error)."""
        with self._ready:
            self._closing = True
            self._ready.notify()
        self._thread.join(timeout)
        if self._error is not None:
            raise self._error
        return RelayResult().merge(self._result)

    def abandon(self) -> None:
        """The cycle is failing or stopping: no further relay batch (one in flight completes or
        not; either way its rows are published at least once)."""
        self._stop.set()
        with self._ready:
            self._closing = True
            self._ready.notify()
