"""The outbox relay: unpublished outbox rows to Kafka, at least once, in id order, then marked published."""

from __future__ import annotations

import logging
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
) -> RelayResult:
    """Publish unpublished outbox rows until none are left, the budget ends or the broker fails.

    One relay publishes per database at a time (a session advisory lock, held on a connection
    with no transaction open): a single writer keeps each key's messages in outbox order on the
    topic. A second relay waits up to ``lock_wait_seconds`` and then leaves the work to the first.
    A row is marked published only after its delivery report succeeded; a crash in between
    publishes it again (at least once; ``outbox.publish_attempts`` counts the hand-overs).
    ``on_acknowledged`` is called with the acknowledged ids just before they are marked (the
    crash-point tests stop the process there).
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
            while time.monotonic() < deadline:
                with engine.begin() as conn:
                    messages = repository.claim_unpublished(conn, batch_size)
                if not messages:
                    break
                results = publisher.publish(messages, timeout=max(deadline - time.monotonic(), 1.0))
                ok = acknowledged_in_key_order(messages, results)
                if on_acknowledged is not None:
                    on_acknowledged(ok)
                with engine.begin() as conn:
                    repository.mark_published(conn, ok)
                result.batches += 1
                result.published += len(ok)
                failed = len(messages) - len(ok)
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
