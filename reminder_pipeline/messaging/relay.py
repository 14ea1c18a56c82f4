"""The outbox relay: unpublished outbox rows to Kafka, at least once, in id order, then marked published."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from sqlalchemy.engine import Engine

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


def relay_outbox(
    engine: Engine,
    publisher: Publisher,
    *,
    batch_size: int = 1000,
    budget_seconds: float = 30.0,
    lock_wait_seconds: float = 5.0,
    correlation_id: str | None = None,
    on_acknowledged: Callable[[list[int]], None] | None = None,
    stop: threading.Event | None = None,
) -> RelayResult:
    """Publish unpublished outbox rows until none are left, the budget ends or the broker fails.

    One relay publishes per database at a time (a session advisory lock, held on a connection
    with no transaction open): a single writer keeps each key's messages in outbox order on the
    topic. A second relay waits up to ``lock_wait_seconds`` and then leaves the work to the first.
    A row is marked published only after its delivery report succeeded; a crash in between
    publishes it again (at least once). A row handed over but not acknowledged gets one more
    ``outbox.publish_attempts`` (failed attempts).
    ``on_acknowledged`` is called with the acknowledged ids just before they are marked (the
    crash-point tests stop the process there). ``stop``, when set, ends the pass before its next
    batch.
    """
    result = RelayResult()
    deadline = time.monotonic() + budget_seconds
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as lock_conn:
        if not repository.try_relay_lock(lock_conn) and not repository.wait_relay_lock(
            lock_conn, lock_wait_seconds
        ):
            result.busy = True
            event(log, logging.INFO, "relay busy in another process", run_id=correlation_id)
            return result
        try:
            while time.monotonic() < deadline and not (stop is not None and stop.is_set()):
                with engine.begin() as conn:
                    messages = repository.unpublished(conn, batch_size)
                if not messages:
                    break
                results = publisher.publish(messages, timeout=max(deadline - time.monotonic(), 1.0))
                ok = acknowledged_in_key_order(messages, results)
                if on_acknowledged is not None:
                    on_acknowledged(ok)
                failed = len(messages) - len(ok)
                with engine.begin() as conn:
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
                          run_id=correlation_id, failed=failed, published=len(ok),
                          error=result.last_error)
                    break
        finally:
            repository.release_relay_lock(lock_conn)
    return result


class BackgroundRelay:
    """Relay passes on a thread of their own while the dispatcher writes its next batches.

    A catch-up otherwise alternates "write a batch" (Postgres busy, Python waiting) with "publish
    it" (broker and Python busy): overlapping them roughly halves the wall time on two cores.
    Correctness is the relay's own: the advisory lock keeps one publisher per database, a row is
    marked only after its acknowledgement. :meth:`notify` after each committed batch;
    :meth:`finish` publishes what is left (within the budget) and returns the merged result.
    After a failed pass (broker down) it stops trying for this cycle: the rows stay unpublished
    for the next one instead of each batch waiting out a delivery timeout.
    """

    def __init__(
        self,
        engine: Engine,
        publisher: Publisher,
        *,
        deadline: float,
        correlation_id: str | None = None,
    ) -> None:
        self._engine = engine
        self._publisher = publisher
        self._deadline = deadline
        self._correlation_id = correlation_id
        self._wake = threading.Event()
        self._closing = threading.Event()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._result = RelayResult()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="outbox-relay", daemon=True)
        self._thread.start()

    def notify(self) -> None:
        """New outbox rows were committed."""
        self._wake.set()

    def _run(self) -> None:
        try:
            while True:
                self._wake.wait()
                self._wake.clear()
                closing = self._closing.is_set()
                remaining = self._deadline - time.monotonic()
                if remaining <= 0:
                    return
                if self._stop.is_set():
                    return
                passed = relay_outbox(self._engine, self._publisher, budget_seconds=remaining,
                                      correlation_id=self._correlation_id, stop=self._stop)
                with self._lock:
                    self._result.merge(passed)
                if closing or passed.failed or passed.busy:
                    return
        except BaseException as exc:  # handed to the dispatcher's thread by finish()
            self._error = exc

    def finish(self, timeout: float | None = None) -> RelayResult:
        """Publish what is left, stop the thread, return what it did (re-raising its error)."""
        self._closing.set()
        self._wake.set()
        self._thread.join(timeout)
        if self._error is not None:
            raise self._error
        with self._lock:
            return RelayResult().merge(self._result)

    def abandon(self) -> None:
        """The cycle is failing or stopping: no new relay batch (one in flight completes or not;
        either way its rows are published at least once)."""
        self._stop.set()
        self._closing.set()
        self._wake.set()
