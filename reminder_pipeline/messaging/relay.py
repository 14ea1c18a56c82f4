"""The outbox relay: unpublished outbox rows to Kafka, at least once, in id order, then marked.

One relay publishes per database at a time (a session advisory lock): a single writer keeps each
key's messages in outbox order on the topic. The lock is held on an AUTOCOMMIT connection that
the relay then uses for its statements (each atomic on its own), so a slow broker never keeps a
transaction, and its snapshot, open. A row is marked published only after its delivery report
succeeded; a crash in between publishes it again (at least once). A failed row holds back the
later rows of its key and counts a failed attempt (``outbox.publish_attempts``).

The lock is never held across a wait without a bound (:mod:`.relay_lock`): a relay whose
connection went silent loses it within seconds, and then marks nothing more.

:class:`OutboxRelay` runs in the foreground (:meth:`OutboxRelay.run`: publish until nothing is
unpublished) or, during a multi-batch drain, on a thread of its own fed each committed batch's
rows (:meth:`OutboxRelay.start`, :meth:`OutboxRelay.hand_over`, :meth:`OutboxRelay.finish`):
batch k is published while batch k+1 is written.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from contextlib import suppress
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import DBAPIError

from ..config import DEFAULT_CYCLE_BUDGET_SECONDS
from ..domain.model import ClaimedMessage
from ..logs import event
from ..store import outbox_repository
from .kafka import DeliveryResult
from .low_water import LowWater
from .relay_lock import LockKeeper, lock_holder, lock_session

log = logging.getLogger(__name__)

#: How long one attempt at the lock waits before leaving the work to the relay holding it. The
#: holder reads the outbox until nothing is unpublished, so the wait only has to cover a holder
#: that read its last, empty batch just before our rows committed (a longer wait only made
#: parallel catch-ups end late); a cycle whose own rows still wait tries again
#: (:func:`publish_rows`).
LOCK_WAIT_SECONDS = 1.0
#: Rows per publish: one read (or hand-over), one produce-and-flush, one mark.
RELAY_BATCH_SIZE = 1000


class Publisher(Protocol):
    """What the relay needs from a producer."""

    def publish(self, messages: Sequence[ClaimedMessage]) -> list[DeliveryResult]:
        """Produce ``messages`` and report each one's delivery."""


@dataclass
class RelayResult:
    """What the relay did."""

    published: int = 0
    failed: int = 0
    batches: int = 0
    busy: bool = False
    last_error: str | None = None
    #: Of the rows the relay was to see out (:func:`publish_rows`), how many are still unpublished
    #: at its end: more than 0 is a partial publish, like ``failed``.
    left: int = 0
    #: Who held the lock when the relay found it busy (``pid N (application_name ...)``).
    holder: str | None = None

    def merge(self, other: RelayResult) -> RelayResult:
        """Add another pass's result to this one; returns self (``left``: the later pass's)."""
        self.published += other.published
        self.failed += other.failed
        self.batches += other.batches
        self.busy = self.busy or other.busy
        self.last_error = other.last_error or self.last_error
        self.left = other.left
        self.holder = other.holder or self.holder
        return self

    @property
    def partial(self) -> bool:
        """Some rows could not be published: failed, or left behind by a busy or spent relay."""
        return self.failed > 0 or self.left > 0

    def plain(self) -> dict[str, Any]:
        """As builtins (what Dagster steps hand on)."""
        return asdict(self)


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
        if message.id in error_by_id and error_by_id[message.id] is None:
            ok.append(message.id)
        else:
            blocked.add(message.message_key)
    return ok


@dataclass
class OutboxSpans:
    """Outbox rows by id span (first, last): a run's own rows, which its relay must see out.

    One span per batch written (merged with the previous one when they touch). A batch's ids are
    consecutive unless another writer inserted at the same moment; such a row inside a batch's
    span counts with it.
    """

    spans: list[tuple[int, int]] = field(default_factory=list)

    def add(self, ids: Iterable[int]) -> None:
        """Note a batch's outbox ids."""
        ids = list(ids)
        if not ids:
            return
        first, last = min(ids), max(ids)
        if self.spans and self.spans[-1][0] <= first <= self.spans[-1][1] + 1:
            self.spans[-1] = (self.spans[-1][0], max(last, self.spans[-1][1]))
        else:
            self.spans.append((first, last))

    def plain(self) -> list[list[int]]:
        """As builtins (what Dagster steps hand on)."""
        return [[first, last] for first, last in self.spans]

    @classmethod
    def from_plain(cls, data: Iterable[Sequence[int]]) -> OutboxSpans:
        """From :meth:`plain`."""
        return cls([(int(first), int(last)) for first, last in data])


_DONE = object()


class OutboxRelay:
    """Publishes the outbox's unpublished rows, oldest id first; marks each once acknowledged."""

    def __init__(
        self,
        engine: Engine,
        publisher: Publisher,
        *,
        batch_size: int = RELAY_BATCH_SIZE,
        lock_wait_seconds: float = LOCK_WAIT_SECONDS,
        run_id: str | None = None,
        on_acknowledged: Callable[[list[int]], None] | None = None,
        quiet_busy: bool = False,
    ) -> None:
        self._engine = engine
        self._publisher = publisher
        self._batch_size = batch_size
        self._lock_wait_seconds = lock_wait_seconds
        self._run_id = run_id
        #: Called with the acknowledged ids just before they are marked (crash-point tests).
        self._on_acknowledged = on_acknowledged
        self.result = RelayResult()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._handed: queue.Queue[Any] = queue.Queue()
        self._early: list[list[ClaimedMessage]] = []  # handed over while waiting for the lock
        self._finished = False  # finish() was met while taking several batches at once
        self._error: BaseException | None = None
        self._keeper: LockKeeper | None = None  # the lock session's keep-alive, once held
        self._low = LowWater()  # read from the database once the lock is held
        self._quiet_busy = quiet_busy  # a retry: busy was logged already

    # -- foreground ------------------------------------------------------------------------------

    def run(self, budget_seconds: float, stop: threading.Event | None = None) -> RelayResult:
        """Publish until nothing is unpublished, the budget is spent, ``stop`` is set, or a
        delivery fails (the rest waits for the next pass). Busy: another relay holds the lock."""
        deadline = time.monotonic() + budget_seconds
        if stop is not None:
            self._stop = stop
        with (
            self._engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn,
            lock_session(
                conn,
                lambda: (
                    outbox_repository.try_relay_lock(conn)
                    or outbox_repository.wait_relay_lock(conn, self._lock_wait_seconds)
                ),
                self._run_id,
            ) as keeper,
        ):
            if keeper is None:
                self._busy(conn)
            else:
                self._keeper = keeper
                self._low = LowWater(outbox_repository.relay_low_water(conn))
                self._from_outbox(conn, deadline, seen=set())
                self._leave_low_water(conn)
        return self.result

    def _leave_low_water(self, conn: Connection) -> None:
        """Where the next relay's reads start, written at the end of a pass that did not fail (it
        only moves up; after a failed one the next relay starts from the last mark written).

        What the pass's last reads proposed is settled first by one more look from the mark (the
        rows the pass published last: a batch or two), so the next pass does not read them again.
        """
        if conn.invalidated or (self._keeper is not None and self._keeper.error is not None):
            return  # the session is gone, and the lock with it: the next holder writes it
        try:
            if self._low.pending:
                clean_to = max(upto for upto, _ in self._low.pending)
                older, snapshot = outbox_repository.first_unpublished_before(
                    conn, self._low.low, clean_to
                )
                self._low.saw(snapshot, clean_to if older is None else older)
            outbox_repository.set_relay_low_water(conn, self._low.low)
        except DBAPIError as error:  # the pass's work is done; the next relay reads a little more
            event(
                log,
                logging.WARNING,
                "relay low-water mark not moved",
                run_id=self._run_id,
                error_kind=type(error.orig or error).__name__,
            )

    def _busy(self, conn: Connection) -> None:
        self.result.busy = True
        self.result.holder = lock_holder(conn, self._run_id, quiet=self._quiet_busy)

    # -- background (a multi-batch drain) ----------------------------------------------------------

    def start(self, deadline: float, max_queued: int = 2) -> OutboxRelay:
        """Publish on a thread of its own until :meth:`finish`; returns self.

        Once it holds the lock, at most ``max_queued`` handed-over batches wait for it: a
        dispatcher never runs further ahead (memory stays bounded, and when the relay falls
        behind, e.g. publishing several dispatchers' rows, the process's CPU goes to it).
        """
        self._handed = queue.Queue(maxsize=max_queued)
        self._thread = threading.Thread(
            target=self._background, args=(deadline,), name="outbox-relay", daemon=True
        )
        self._thread.start()
        return self

    @property
    def running(self) -> bool:
        """Whether the relay thread still publishes what is handed over."""
        return self._thread is not None and self._thread.is_alive() and not self._stop.is_set()

    @property
    def queued(self) -> int:
        """Handed-over batches not yet taken up for publishing."""
        return self._handed.qsize() + len(self._early)

    def hand_over(self, messages: Sequence[ClaimedMessage]) -> None:
        """Outbox rows of a batch that just committed (any order; published in id order).

        Blocks while the queue is full. Dropped when the relay has stopped (lock busy, a failed
        delivery, an error): the rows are in the outbox, where the next pass finds them.
        """
        if not messages:
            return
        batch = sorted(messages, key=lambda m: m.id)
        while self.running:
            try:
                self._handed.put(batch, timeout=0.2)
                return
            except queue.Full:
                continue

    def finish(self, timeout: float | None = None) -> RelayResult:
        """Publish what was handed over, stop the thread, return the result (or its error)."""
        while self.running:
            try:
                self._handed.put(_DONE, timeout=0.2)
                break
            except queue.Full:
                continue
        if self._thread is not None:
            self._thread.join(timeout)
        if self._error is not None:
            raise self._error
        return self.result

    def abandon(self) -> None:
        """The cycle is failing or stopping: no further batch (one in flight completes or not;
        either way its rows are published at least once)."""
        self._stop.set()

    def _background(self, deadline: float) -> None:
        try:
            with (
                self._engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn,
                lock_session(
                    conn, lambda: self._lock_taking_hand_overs(conn), self._run_id
                ) as keeper,
            ):
                if keeper is None:
                    self._busy(conn)
                    return
                self._keeper = keeper
                self._low = LowWater(outbox_repository.relay_low_water(conn))
                self._publish_handed_over(conn, deadline)
                self._leave_low_water(conn)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the dispatcher's thread by finish()
            self._error = exc
        finally:
            self._stop.set()  # not running any more: hand_over drops
            self._early.clear()
            while not self._handed.empty():  # what was handed over is in the outbox already
                self._handed.get_nowait()

    def _lock_taking_hand_overs(self, conn: Connection) -> bool:
        """Wait for the lock, taking hand-overs meanwhile: nobody waits for a relay that may never
        get it (the queue's bound applies once the relay publishes)."""
        give_up = time.monotonic() + self._lock_wait_seconds
        while not outbox_repository.try_relay_lock(conn):
            if time.monotonic() >= give_up or self._stop.is_set():
                return False
            with suppress(queue.Empty):
                self._early.append(self._handed.get(timeout=0.05))
        return True

    def _publish_handed_over(self, conn: Connection, deadline: float) -> None:
        seen: set[int] = set()  # ids a read from the outbox already handed to the producer
        # What the outbox held when the relay started (a run's reserved batch, rows an earlier
        # cycle left) goes first, read from the outbox; the drain's rows committed since come by
        # hand-over. Unbounded, the first pass chased the drain's new rows in the outbox while
        # the hand-overs queued up and held the drain back (a fresh producer's first delivery
        # takes 0.5-1 s).
        up_to = outbox_repository.last_outbox_id(conn)
        if up_to is not None and not self._from_outbox(conn, deadline, seen, up_to=up_to):
            return
        while (batch := self._next_publish()) is not _DONE:
            if time.monotonic() >= deadline:
                return
            batch = [m for m in batch if m.id not in seen]
            if up_to is not None and any(m.id <= up_to for m in batch):
                # Committed before this relay held the lock: another relay (a parallel run's) may
                # have published them meanwhile. The outbox says which are still unpublished.
                if not self._from_outbox(conn, deadline, seen):
                    return
                batch = [m for m in batch if m.id > up_to and m.id not in seen]
            if not batch:
                continue
            older, snapshot = outbox_repository.first_unpublished_before(
                conn, self._low.low, batch[0].id
            )
            self._low.saw(snapshot, batch[0].id if older is None else older)
            if older is not None:
                ok = self._from_outbox(conn, deadline, seen)  # older rows first: id order
            else:
                ok = self._publish(conn, batch)
            if not ok:
                return

    def _next_publish(self) -> Any:
        """The next handed-over batch joined with those already waiting, up to ``batch_size`` rows.

        A drain in batches of 200 hands over small batches; one produce-flush-mark round each
        made the dispatcher wait for the relay (a third of a 200-row drain's time). Batches that
        queued up meanwhile go out in one round: the round's fixed cost is paid once.
        """
        first = self._next()
        if first is _DONE:
            return _DONE
        joined = list(first)
        while len(joined) < self._batch_size and not self._finished:
            if self._early:
                more = self._early.pop(0)
            else:
                try:
                    more = self._handed.get_nowait()
                except queue.Empty:
                    break
            if more is _DONE:
                self._finished = True
                break
            joined.extend(more)
        if len(joined) > len(first):
            joined.sort(key=lambda m: m.id)
        return joined

    def _next(self) -> Any:
        """The next handed-over batch, or _DONE once finished or abandoned."""
        if self._early:
            return self._early.pop(0)
        if self._finished:
            return _DONE
        while not self._stop.is_set():
            try:
                return self._handed.get(timeout=0.2)
            except queue.Empty:
                self._check_session()  # waiting for the drain: a lost lock stops the relay now
        return _DONE

    def _check_session(self) -> None:
        if self._keeper is not None:
            self._keeper.check(self._run_id)

    # -- shared --------------------------------------------------------------------------------

    def _from_outbox(
        self, conn: Connection, deadline: float, seen: set[int], up_to: int | None = None
    ) -> bool:
        """Publish unpublished rows read from the outbox (ids up to ``up_to`` if given), oldest
        first, until none are left.

        False after a failed delivery. ``seen`` collects the ids handed to the producer.
        """
        while time.monotonic() < deadline and not self._stop.is_set():
            read = outbox_repository.unpublished(
                conn, self._batch_size, low=self._low.low, up_to=up_to
            )
            self._low.saw(read.snapshot, read.clean_to)
            messages = read.messages
            if not messages:
                return True
            seen.update(m.id for m in messages)
            if not self._publish(conn, messages):
                return False
            # Every row read is published now: the rows up to the last were published or in flight
            # on the read's snapshot.
            self._low.propose(messages[-1].id + 1, read.snapshot.xmax)
        return True

    def _publish(self, conn: Connection, messages: Sequence[ClaimedMessage]) -> bool:
        """Produce, then mark the acknowledged rows (key order kept); False after a failure."""
        results = self._publisher.publish(messages)
        self._check_session()  # the lock went while the broker answered: mark nothing
        ok = acknowledged_in_key_order(messages, results)
        if self._on_acknowledged is not None:
            self._on_acknowledged(ok)
        landed = {r.outbox_id: r for r in results}
        outbox_repository.mark_published(
            conn, [(i, landed[i].partition, landed[i].offset) for i in ok]
        )
        self.result.batches += 1
        self.result.published += len(ok)
        failed = len(messages) - len(ok)
        if not failed:
            return True
        acknowledged = set(ok)
        outbox_repository.record_publish_failures(
            conn, [m.id for m in messages if m.id not in acknowledged]
        )
        self.result.failed += failed
        self.result.last_error = next((r.error for r in results if r.error), None)
        event(
            log,
            logging.ERROR,
            "outbox publish failed; rows stay unpublished",
            run_id=self._run_id,
            failed=failed,
            published=len(ok),
            error=self.result.last_error,
        )
        return False


def publish_outbox(
    engine: Engine,
    publisher: Publisher,
    *,
    batch_size: int = RELAY_BATCH_SIZE,
    budget_seconds: float = DEFAULT_CYCLE_BUDGET_SECONDS,
    lock_wait_seconds: float = LOCK_WAIT_SECONDS,
    run_id: str | None = None,
    on_acknowledged: Callable[[list[int]], None] | None = None,
    stop: threading.Event | None = None,
    quiet_busy: bool = False,
) -> RelayResult:
    """One foreground pass of :class:`OutboxRelay` (the CLI's ``relay``, the relay step)."""
    relay = OutboxRelay(
        engine,
        publisher,
        batch_size=batch_size,
        lock_wait_seconds=lock_wait_seconds,
        run_id=run_id,
        on_acknowledged=on_acknowledged,
        quiet_busy=quiet_busy,
    )
    return relay.run(budget_seconds, stop=stop)


def publish_rows(
    engine: Engine,
    publisher: Publisher,
    rows: OutboxSpans,
    *,
    budget_seconds: float,
    lock_wait_seconds: float = LOCK_WAIT_SECONDS,
    run_id: str | None = None,
    stop: threading.Event | None = None,
) -> RelayResult:
    """Publish until ``rows`` are out of the outbox or the budget is spent; ``left`` says how
    many of them are still unpublished at the end (a partial publish when above 0).

    A pass of the relay (:func:`publish_outbox`). While another relay holds the lock, ``rows``
    wait for it: the pass is tried again every ``lock_wait_seconds`` until that relay published
    them or let go of the lock (one gone silent loses it within
    :data:`.relay_lock.RELAY_IDLE_SESSION_SECONDS`), within the budget. "Busy" alone is no
    partial publish: the holder publishing our rows is the normal case.
    """
    deadline = time.monotonic() + budget_seconds
    result = RelayResult()
    while True:
        remaining = deadline - time.monotonic()
        passed = publish_outbox(
            engine,
            publisher,
            budget_seconds=max(remaining, 0.0),
            lock_wait_seconds=max(min(lock_wait_seconds, remaining), 0.001),
            run_id=run_id,
            stop=stop,
            quiet_busy=result.busy,
        )
        result.merge(passed)
        with engine.connect() as conn:
            result.left = outbox_repository.count_unpublished_in(conn, rows.spans)
        if (
            not result.left
            or not passed.busy
            or time.monotonic() >= deadline
            or (stop is not None and stop.is_set())
        ):
            break
    if result.left and result.busy:
        event(
            log,
            logging.WARNING,
            "outbox rows left unpublished: the relay lock stayed busy",
            run_id=run_id,
            left=result.left,
            holder=result.holder,
            waited_seconds=round(budget_seconds, 1),
        )
    return result


def publish_all(
    engine: Engine,
    publisher: Publisher,
    *,
    budget_seconds: float,
    lock_wait_seconds: float = LOCK_WAIT_SECONDS,
) -> RelayResult:
    """The ``relay`` command: :func:`publish_rows` over every row unpublished when it starts."""
    with engine.connect() as conn:
        newest = outbox_repository.last_outbox_id(conn)
    rows = OutboxSpans([] if newest is None else [(0, newest)])
    return publish_rows(
        engine,
        publisher,
        rows,
        budget_seconds=budget_seconds,
        lock_wait_seconds=lock_wait_seconds,
    )
