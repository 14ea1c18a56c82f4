"""One dispatch cycle: select_due_batch, resolve_event_status, transition_and_outbox, relay_outbox.

This module owns a cycle; the CLI and the Dagster ops are adapters over these calls, which take
and return plain records:

* :func:`start` - the cycle's settings and clock (``cycle started``);
* :func:`select` - step 1 as a Dagster op runs it: due rows reserved for the run, in a short
  transaction of its own, so concurrent runs take disjoint batches;
* :func:`resolve` - step 2: the selected rows' event status, send or skip (a preview);
* :func:`write` - step 3: lock and re-read, decide on that state, write set-based; then, when
  the cycle may drain more batches, go on selecting and writing (each batch one transaction);
* :func:`finish` - step 4: publish what is unpublished, measure the backlog, record the cycle
  (``cycle completed``, the metrics ledger);
* :func:`run_cycle` - all of it in one process (CLI, demo, tests), each batch selected and
  written in one transaction.

The rule that keeps a cycle correct whatever runs its steps, and whenever: the writing step
(:func:`transition_and_outbox`) locks the candidates again in its own transaction, re-reads
each row and its event under that lock and decides on *that* (docs/design.md). Log lines and
span events of a batch are emitted after its transaction committed: nothing but database work
happens while its rows are locked.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

from sqlalchemy.engine import Connection, Engine

from .. import config as settings
from ..domain import contract
from ..domain.model import (
    Action,
    ClaimedMessage,
    CycleCounts,
    Decision,
    DueReminder,
    PoisonRow,
    ReminderStatus,
)
from ..domain.plan import plan_batch
from ..domain.transitions import action_for, decide_all
from ..logs import Journal
from ..messaging.relay import OutboxRelay, Publisher, RelayResult, relay_outbox
from ..observability import ledger, tracing
from ..store import repository
from .memory import young_generation

#: How long the rows a Dagster run selected stay reserved for its writing step. The write
#: follows the selection within seconds; a run that dies in between releases its rows by
#: itself, before the next minute's tick selects again.
RESERVATION_SECONDS = 30.0
#: The relay always gets at least this long, even when the drain spent the budget: a few seconds
#: past the budget beat a "publish failed" for messages the broker was about to acknowledge.
MIN_RELAY_SECONDS = 5.0

#: A host whose clock differs from the database's by more than this is logged and counted (its
#: clock is never used for what is due or for what a cycle writes: the database's is).
CLOCK_SKEW_WARN_SECONDS = ledger.CLOCK_SKEW_WARN_SECONDS
#: Rows a drain may have handed to its relay and not yet published: two batches of 1,000, or
#: ten of 200 (the relay publishes what queued up in one round; memory stays bounded).
RELAY_QUEUE_ROWS = 2000

#: What a batch progress callback receives: the cycle's counts so far.
Progress = Callable[[CycleCounts], None]


def now_utc() -> datetime:
    """This host's clock, in UTC (durations and tests; a cycle's times are the database's)."""
    return datetime.now(UTC)


def database_now(engine: Engine) -> datetime:
    """The database server's clock now."""
    with engine.connect() as conn:
        return repository.database_clock(conn)


def read_clock(engine: Engine) -> tuple[datetime, float]:
    """The database's clock, and how far this host's is ahead of it (seconds, + = fast)."""
    before = time.time()
    now = database_now(engine)
    after = time.time()
    # The query's round trip is split evenly: the server read its clock somewhere in between.
    return now, (before + after) / 2 - now.timestamp()


def check_as_of(as_of: object, now: datetime | None = None) -> datetime:
    """Default ``as_of`` to now; refuse a naive or future one (``config.check_as_of``'s lines)."""
    now = now or now_utc()
    return settings.check_as_of(as_of, now=now) or now


# --- the records a cycle hands from step to step (plain values: what Dagster steps store) ------


@dataclass(frozen=True)
class Cycle:
    """One cycle's settings and start (wall clock: a re-executed step runs in another process)."""

    run_id: str
    as_of: datetime
    batch_size: int
    max_batches: int = 1
    budget_seconds: float = 30.0
    started_at: float = field(default_factory=time.time)
    #: How far the starting host's clock was ahead of the database's (seconds; + = fast).
    clock_skew_seconds: float = 0.0

    def plain(self) -> dict[str, Any]:
        """As builtins."""
        return {**asdict(self), "as_of": self.as_of.isoformat()}

    @classmethod
    def from_plain(cls, data: Mapping[str, Any]) -> Cycle:
        """From :meth:`plain`."""
        return cls(**{**data, "as_of": datetime.fromisoformat(data["as_of"])})


@dataclass(frozen=True)
class Decisions:
    """Step 2's preview: which selected rows would be sent and which skipped."""

    send: list[str]
    skip: list[str]


@dataclass
class Written:
    """What step 3 did in run ``run_id``: its counts, and what it already published."""

    run_id: str
    counts: CycleCounts
    relay: RelayResult = field(default_factory=RelayResult)

    def plain(self) -> dict[str, Any]:
        """As builtins."""
        return {"run_id": self.run_id, "counts": asdict(self.counts), "relay": self.relay.plain()}

    @classmethod
    def from_plain(cls, data: Mapping[str, Any]) -> Written:
        """From :meth:`plain`."""
        return cls(data["run_id"], CycleCounts(**data["counts"]), RelayResult(**data["relay"]))


@dataclass
class CycleReport:
    """A whole cycle: counts, the relay's result, and what is left behind."""

    run_id: str
    as_of: datetime
    batch_size: int
    counts: CycleCounts
    relay: RelayResult
    backlog_remaining: int
    oldest_due_age_seconds: float | None
    outbox_unpublished: int = 0
    #: How far the host that started the cycle was ahead of the database's clock (seconds).
    clock_skew_seconds: float = 0.0
    #: A step re-executed from the UI that only relayed: the sends were the parent run's.
    reexecuted_relay_only: bool = False

    def figures(self) -> dict[str, int | float | bool]:
        """The cycle's figures as numbers, never None (what the asset plots over runs)."""
        c = self.counts
        return {
            "sent_count": c.sent,
            "skipped_count": c.skipped,
            "skipped_locked_count": c.skipped_locked,
            "failed_count": c.failed,
            "published_count": self.relay.published,
            "publish_failed_count": self.relay.failed,
            "time_zone_fallback_count": c.time_zone_fallbacks,
            "duration_ms": c.duration_ms,
            "backlog_remaining": self.backlog_remaining,
            "oldest_due_age_seconds": float(self.oldest_due_age_seconds or 0),
            "max_lateness_seconds": float(c.max_lateness_seconds or 0),
            "outbox_unpublished": self.outbox_unpublished,
            "batch_size": self.batch_size,
            "batches": c.batches,
            "clock_skew_seconds": round(self.clock_skew_seconds, 3),
            "clock_skewed": abs(self.clock_skew_seconds) > CLOCK_SKEW_WARN_SECONDS,
            "reexecuted_relay_only": self.reexecuted_relay_only,
        }

    def as_dict(self) -> dict[str, Any]:
        """Flat dict for the CLI, logs and metadata."""
        data: dict[str, Any] = self.counts.as_dict()
        data.update(
            run_id=self.run_id,
            as_of=self.as_of.isoformat(),
            batch_size=self.batch_size,
            published=self.relay.published,
            publish_failed=self.relay.failed,
            backlog_remaining=self.backlog_remaining,
            oldest_due_age_seconds=self.oldest_due_age_seconds,
            outbox_unpublished=self.outbox_unpublished,
            clock_skew_seconds=round(self.clock_skew_seconds, 3),
        )
        return data


@dataclass(frozen=True)
class Selection:
    """Step 1 in the caller's transaction: the candidates, oldest first, locked by it."""

    as_of: datetime
    batch_size: int
    candidates: list[DueReminder]
    skipped_locked: int = 0

    @property
    def ids(self) -> list[str]:
        """Candidate reminder ids, oldest first."""
        return [c.reminder_id for c in self.candidates]


@dataclass
class BatchOutcome:
    """What :func:`transition_and_outbox` wrote for one batch."""

    sent: list[DueReminder] = field(default_factory=list)
    skipped: list[DueReminder] = field(default_factory=list)
    poison: list[PoisonRow] = field(default_factory=list)
    time_zone_fallbacks: list[DueReminder] = field(default_factory=list)
    #: Candidates still Pending that another transaction (or another run's reservation) holds.
    skipped_locked: int = 0
    #: Candidates no longer Pending or due (sent, skipped or deleted since they were selected).
    gone: int = 0
    #: Rows the selection of this batch took (a short batch ends a drain).
    selected: int = 0
    outbox_rows: int = 0
    lateness_seconds: list[float] = field(default_factory=list)
    #: The outbox rows written, as the relay publishes them (a drain hands them to its relay).
    messages: list[ClaimedMessage] = field(default_factory=list, repr=False)

    def counts(self) -> CycleCounts:
        """This batch as cycle counts."""
        return CycleCounts(
            selected=len(self.sent) + len(self.skipped) + len(self.poison),
            sent=len(self.sent),
            skipped=len(self.skipped),
            skipped_locked=self.skipped_locked,
            failed=len(self.poison),
            batches=1,
            time_zone_fallbacks=len(self.time_zone_fallbacks),
            max_lateness_seconds=max(self.lateness_seconds, default=None),
            lateness_seconds=list(self.lateness_seconds),
        )


# --- the design's steps in the caller's transaction -----------------------------------------------


def select_due_batch(conn: Connection, as_of: datetime, batch_size: int) -> Selection:
    """Step 1: due Pending rows (``due_at < as_of``), oldest first, locked FOR UPDATE SKIP LOCKED.

    The locks last as long as ``conn``'s transaction. Rows held by another instance are not
    waited for; how many there were is counted exactly (``skipped_locked``).
    """
    due = repository.select_due_for_update_skip_locked(conn, as_of, batch_size)
    return Selection(as_of, batch_size, due.reminders, due.skipped_locked)


def resolve_event_status(candidates: Sequence[DueReminder]) -> list[Decision]:
    """Step 2 (pure): send for a Planned/InProgress event, skip for Cancelled/Completed."""
    return decide_all(list(candidates))


def transition_and_outbox(
    conn: Connection,
    candidate_ids: Sequence[str | uuid.UUID],
    as_of: datetime,
    *,
    correlation_id: str | None = None,
    reserved_by: str | None = None,
    held: Sequence[DueReminder] | None = None,
    now: datetime | None = None,
) -> BatchOutcome:
    """Step 3 in ``conn``'s transaction: lock and re-read the candidates, decide, write.

    The design's rule: the candidates are locked again here (FOR UPDATE SKIP LOCKED) and re-read
    with their event; only what is still Pending and due, and not reserved by another run, is
    decided, on *that* state (:func:`~reminder_pipeline.domain.plan.plan_batch`), and written by
    one set-based statement: Sent rows get ``sent_at`` (the database's clock, never before
    ``as_of``; ``now`` pins it for tests)
    and exactly one outbox row each, Skipped rows publish nothing. A poison row (its message
    cannot be built, breaks the contract, or the database refuses its data) is left Pending with
    a back-off. Infrastructure errors propagate: the caller's transaction rolls back whole.

    ``reserved_by``: the run whose reservation the candidates may carry (the run that selected
    them). ``held``: the candidates as :func:`select_due_batch` read and locked them *in this
    same transaction*; nothing can have changed them since, so they are not read again.
    """
    ids = [str(i) for i in candidate_ids]  # a selection stored by an older version held UUIDs
    if held is not None and [r.reminder_id for r in held] == ids:
        locked = list(held)
    else:
        locked = repository.lock_candidates(conn, ids, as_of, reserved_by)
    outcome = BatchOutcome(selected=len(ids))
    taken = {r.reminder_id for r in locked}
    missing = [i for i in ids if i not in taken]
    outcome.skipped_locked = repository.count_still_pending(conn, missing)
    outcome.gone = len(missing) - outcome.skipped_locked

    plan = plan_batch(locked, correlation_id=correlation_id, trace=tracing.trace_headers())
    applied = repository.apply_transitions(
        conn, plan.transitions(), topic=contract.TOPIC, not_before=as_of, now=now
    )
    outcome.poison = plan.poison + applied.refused
    repository.record_poison(conn, outcome.poison, now)

    by_id = {r.reminder_id: r for r in locked}
    messages = {r.reminder_id: m for r, m in plan.sends}
    fallbacks = {r.reminder_id for r in plan.time_zone_fallbacks}
    for row in applied.rows:
        reminder = by_id[row.reminder_id]
        if row.status is not ReminderStatus.SENT:
            outcome.skipped.append(reminder)
            continue
        outcome.sent.append(reminder)
        if row.reminder_id in fallbacks:
            outcome.time_zone_fallbacks.append(reminder)
        if row.lateness_seconds is not None:
            outcome.lateness_seconds.append(row.lateness_seconds)
        message = messages[row.reminder_id]
        if row.outbox_id is not None:
            outcome.messages.append(
                ClaimedMessage(
                    row.outbox_id,
                    contract.TOPIC,
                    message.message_key,
                    row.payload or "",
                    message.headers,
                )
            )
    outcome.outbox_rows = applied.outbox_rows
    return outcome


def dispatch_batch(
    engine: Engine,
    as_of: datetime,
    batch_size: int,
    *,
    correlation_id: str | None = None,
    journal: Journal | None = None,
) -> BatchOutcome:
    """Select and write one batch in one transaction (locks held from select to commit).

    Its log lines and span events follow the commit; a batch that rolls back logs that it did,
    and never "reminder sent".
    """
    journal = journal or Journal()
    try:
        with engine.begin() as conn:
            selection = select_due_batch(conn, as_of, batch_size)
            outcome = transition_and_outbox(
                conn, selection.ids, as_of, held=selection.candidates, correlation_id=correlation_id
            )
    except BaseException as error:
        journal.event(
            logging.WARNING,
            "batch rolled back",
            run_id=correlation_id,
            error_kind=type(error).__name__,
        )
        raise
    outcome.skipped_locked += selection.skipped_locked
    _report(
        journal,
        outcome,
        correlation_id,
        selected=(len(selection.candidates), selection.skipped_locked),
    )
    return outcome


def _report(
    journal: Journal,
    outcome: BatchOutcome,
    run_id: str | None,
    selected: tuple[int, int] | None = None,
) -> None:
    """A committed batch's log lines (one record) and span events; warnings and errors apart."""
    lines: list[dict[str, Any]] = []
    if selected is not None:
        lines.append({"msg": "batch selected", "count": selected[0], "skipped_locked": selected[1]})
    sent = [
        {
            "reminder_id": r.reminder_id,
            "event_id": r.event_id,
            "offset_minutes": r.offset_minutes,
            "tenant_id": r.tenant_id,
        }
        for r in outcome.sent
    ]
    skipped = [
        {
            "reminder_id": r.reminder_id,
            "event_id": r.event_id,
            "event_status": r.event_status,
            "tenant_id": r.tenant_id,
        }
        for r in outcome.skipped
    ]
    lines += [{"msg": "reminder sent", **ids} for ids in sent]
    lines += [{"msg": "reminder skipped", **ids} for ids in skipped]
    journal.batch(logging.INFO, "batch written", lines, run_id=run_id)
    tracing.item_events("reminder sent", sent)
    tracing.item_events("reminder skipped", skipped)
    for r in outcome.time_zone_fallbacks:
        journal.event(
            logging.WARNING,
            "time zone not canonical; sent with UTC",
            run_id=run_id,
            reminder_id=r.reminder_id,
            event_id=r.event_id,
            tenant_id=r.tenant_id,
        )
    for p in outcome.poison:
        ids = {"reminder_id": p.reminder_id, "event_id": p.event_id, "tenant_id": p.tenant_id}
        journal.event(logging.ERROR, "item failed", run_id=run_id, exception=p.error, **ids)
        tracing.item_event("item failed", **ids)


def drain(
    engine: Engine,
    as_of: datetime,
    batch_size: int,
    *,
    max_batches: int = 1,
    budget_seconds: float = 30.0,
    correlation_id: str | None = None,
    publisher: Publisher | None = None,
    started: float | None = None,
    journal: Journal | None = None,
    progress: Progress | None = None,
    continuing: bool = False,
) -> tuple[CycleCounts, RelayResult]:
    """Dispatch up to ``max_batches`` batches, each its own transaction.

    Stops early when a batch comes back short (nothing more is free to take), or when the
    budget (counted from ``started``, epoch seconds) is spent: what is left is the next cycle's,
    oldest first. With a publisher and more than one batch, a relay runs alongside
    (:meth:`OutboxRelay.start`): each committed batch's rows are handed to it and published
    while the next batch is written; its result is returned. ``continuing``: the cycle already
    wrote a batch, so a first look-up that finds nothing is not counted as a batch.
    """
    journal = journal or Journal()
    started = time.time() if started is None else started
    counts = CycleCounts()
    relay = None
    if publisher is not None and max_batches > 1:
        relay = OutboxRelay(engine, publisher, correlation_id=correlation_id)
        relay.start(
            deadline=time.monotonic() + max(started + budget_seconds - time.time(), 1.0),
            max_queued=max(2, RELAY_QUEUE_ROWS // batch_size),
        )
    try:
        with young_generation():
            for number in range(max_batches):
                outcome = dispatch_batch(
                    engine, as_of, batch_size, correlation_id=correlation_id, journal=journal
                )
                counts.add(outcome.counts())
                if not outcome.selected and (number or continuing):
                    # The look-up after a full batch that found nothing due is not a batch: a
                    # burst of 2,000 reads "10 batches" on the asset, not 11.
                    counts.batches -= 1
                if relay is not None:
                    relay.hand_over(outcome.messages)
                if progress is not None:
                    progress(counts)
                if outcome.selected < batch_size:
                    break
                if time.time() - started >= budget_seconds:
                    journal.event(
                        logging.WARNING,
                        "cycle budget spent; the rest waits for the next cycle",
                        run_id=correlation_id,
                        budget_seconds=budget_seconds,
                    )
                    break
    except BaseException:
        if relay is not None:
            relay.abandon()
        raise
    return counts, (relay.finish() if relay is not None else RelayResult())


# --- a cycle, step by step (the Dagster ops) ----------------------------------------------------


def start(
    run_id: str,
    *,
    engine: Engine,
    as_of: datetime | str | None = None,
    batch_size: int,
    max_batches: int = 1,
    budget_seconds: float = 30.0,
    journal: Journal | None = None,
) -> Cycle:
    """A new cycle on the database's clock, read once: AsOf defaults to it and is never after it.

    ``as_of`` may be an operator's ISO-8601 text. The host's clock only times the cycle (its
    budget, its duration); a host more than :data:`CLOCK_SKEW_WARN_SECONDS` off the database's
    is logged (``host clock differs from the database's``) and counted in the cycle's figures.
    """
    journal = journal or Journal()
    started = time.time()
    now, skew = read_clock(engine)
    cycle = Cycle(
        run_id, check_as_of(as_of, now), batch_size, max_batches, budget_seconds, started, skew
    )
    if abs(skew) > CLOCK_SKEW_WARN_SECONDS:
        journal.event(
            logging.WARNING,
            "host clock differs from the database's; the database's is used",
            run_id=run_id,
            clock_skew_seconds=round(skew, 3),
            threshold_seconds=CLOCK_SKEW_WARN_SECONDS,
        )
    journal.event(
        logging.INFO,
        "cycle started",
        run_id=run_id,
        as_of=cycle.as_of.isoformat(),
        batch_size=batch_size,
        max_batches=max_batches,
    )
    return cycle


def select(
    engine: Engine, cycle: Cycle, *, journal: Journal | None = None
) -> repository.Reservation:
    """Step 1: the cycle's batch of due rows, reserved for its run (committed before returning)."""
    with engine.begin() as conn:
        reserved = repository.reserve_due(
            conn, cycle.as_of, cycle.batch_size, cycle.run_id, RESERVATION_SECONDS
        )
    (journal or Journal()).event(
        logging.INFO,
        "batch selected",
        run_id=cycle.run_id,
        count=len(reserved.ids),
        skipped_locked=reserved.skipped_locked,
    )
    return reserved


def resolve(engine: Engine, ids: Sequence[str]) -> Decisions:
    """Step 2: each selected row's event status, read without a lock, as send or skip."""
    with engine.connect() as conn:
        statuses = repository.event_statuses(conn, ids)
    decided = Decisions([], [])
    for reminder_id in ids:
        action = action_for(statuses.get(reminder_id))
        (decided.send if action is Action.SEND else decided.skip).append(reminder_id)
    return decided


def write(
    engine: Engine,
    cycle: Cycle,
    ids: Sequence[str],
    *,
    run_id: str,
    skipped_locked: int = 0,
    publisher: Publisher | None = None,
    journal: Journal | None = None,
    progress: Progress | None = None,
) -> Written:
    """Step 3: write the selected rows (re-locked and re-read); drain on if the cycle may.

    ``run_id`` is the run writing: it may differ from ``cycle.run_id`` when the step is
    re-executed from the UI, days later maybe; then the budget starts afresh, and the rows
    reserved by the selecting run are still its to write.
    """
    journal = journal or Journal()
    started = cycle.started_at if cycle.run_id == run_id else time.time()
    with tracing.cycle_span(
        run_id,
        as_of=cycle.as_of.isoformat(),
        batch_size=cycle.batch_size,
        max_batches=cycle.max_batches,
    ):
        try:
            with engine.begin() as conn:
                outcome = transition_and_outbox(
                    conn, ids, cycle.as_of, correlation_id=run_id, reserved_by=cycle.run_id
                )
        except BaseException as error:
            journal.event(
                logging.WARNING, "batch rolled back", run_id=run_id, error_kind=type(error).__name__
            )
            raise
        outcome.skipped_locked += skipped_locked
        _report(journal, outcome, run_id)
        counts = outcome.counts()
        if progress is not None:
            progress(counts)
        relay = RelayResult()
        if (
            cycle.max_batches > 1
            and len(ids) >= cycle.batch_size
            and time.time() - started < cycle.budget_seconds
        ):
            more, relay = drain(
                engine,
                cycle.as_of,
                cycle.batch_size,
                max_batches=cycle.max_batches - 1,
                budget_seconds=cycle.budget_seconds,
                correlation_id=run_id,
                publisher=publisher,
                started=started,
                journal=journal,
                progress=(lambda c: progress(_plus(counts, c))) if progress else None,
                continuing=True,
            )
            counts.add(more)
            # The step's summary: in a run's event log a drain's batches are folded.
            journal.event(
                logging.INFO,
                "batches written",
                run_id=run_id,
                batches=counts.batches,
                sent=counts.sent,
                skipped=counts.skipped,
                failed=counts.failed,
                skipped_locked=counts.skipped_locked,
                published=relay.published,
            )
        tracing.set_attributes(**counts.as_dict())
    return Written(run_id, counts, relay)


def _plus(first: CycleCounts, more: CycleCounts) -> CycleCounts:
    total = CycleCounts()
    total.add(first)
    total.add(more)
    return total


def finish(
    engine: Engine,
    cycle: Cycle,
    written: Written,
    *,
    run_id: str,
    publisher: Publisher | None = None,
    publisher_error: str | None = None,
    journal: Journal | None = None,
) -> CycleReport:
    """Step 4: publish what the outbox holds, measure what is left, record the cycle.

    ``publisher_error``: why there is no publisher (the broker is unreachable): every
    unpublished row then counts as a failed publish. A broker outage is a publish failure, not a
    failed cycle: the rows were dispatched, so the ledger records the cycle as succeeded (the
    dispatcher's liveness) with its ``publish_failed`` count, and the outbox backlog tells the
    rest. A re-executed relay (``run_id`` differs from the run that wrote) reports only what it
    published; the sends were counted by the run that made them.
    """
    journal = journal or Journal()
    own = written.run_id == run_id
    started = cycle.started_at if own else time.time()
    counts = written.counts if own else CycleCounts()
    relay = RelayResult().merge(written.relay) if own else RelayResult()
    if publisher is not None:
        remaining = max(started + cycle.budget_seconds - time.time(), MIN_RELAY_SECONDS)
        relay.merge(
            relay_outbox(engine, publisher, budget_seconds=remaining, correlation_id=run_id)
        )
    elif publisher_error is not None:
        with engine.connect() as conn:
            waiting = repository.outbox_lag(conn).unpublished
        relay.merge(RelayResult(failed=waiting, last_error=publisher_error))
        journal.event(
            logging.ERROR,
            "outbox publish failed; rows stay unpublished",
            run_id=run_id,
            failed=waiting,
            published=0,
            error=publisher_error,
        )
    with engine.connect() as conn:
        left = repository.backlog(conn, repository.database_clock(conn))
        lag = repository.outbox_lag(conn)
    counts.published = relay.published
    counts.publish_failed = relay.failed
    counts.duration_ms = int((time.time() - started) * 1000)
    journal.event(
        logging.INFO,
        "cycle completed",
        run_id=run_id,
        sent=counts.sent,
        skipped=counts.skipped,
        skipped_locked=counts.skipped_locked,
        failed=counts.failed,
        published=relay.published,
        publish_failed=relay.failed,
        time_zone_fallbacks=counts.time_zone_fallbacks,
        duration_ms=counts.duration_ms,
        backlog_remaining=left.count,
        outbox_unpublished=lag.unpublished,
    )
    ledger.record_cycle(
        engine,
        run_id,
        counts,
        started_at=started,
        as_of=cycle.as_of,
        clock_skew_seconds=cycle.clock_skew_seconds if own else None,
    )
    return CycleReport(
        run_id,
        cycle.as_of,
        cycle.batch_size,
        counts,
        relay,
        left.count,
        left.oldest_due_age_seconds,
        lag.unpublished,
        clock_skew_seconds=cycle.clock_skew_seconds,
        reexecuted_relay_only=not own,
    )


def fail(
    engine: Engine,
    run_id: str,
    started_at: float,
    as_of: datetime | None,
    error: BaseException,
    *,
    journal: Journal | None = None,
) -> None:
    """Record a cycle that failed (``cycle failed``, a failed row in the ledger)."""
    (journal or Journal()).event(
        logging.ERROR, "cycle failed", run_id=run_id, error_kind=type(error).__name__
    )
    ledger.record_cycle(engine, run_id, None, started_at=started_at, as_of=as_of, error=error)


def backlog_left(engine: Engine) -> int:
    """Due Pending rows not yet processed (for progress lines)."""
    with engine.connect() as conn:
        return repository.backlog(conn, repository.database_clock(conn)).count


# --- a whole cycle in one process ---------------------------------------------------------------


def run_cycle(
    engine: Engine,
    publisher: Publisher | None,
    *,
    as_of: datetime | None = None,
    batch_size: int = 200,
    max_batches: int = 1,
    budget_seconds: float = 30.0,
    run_id: str | None = None,
    journal: Journal | None = None,
    progress: Progress | None = None,
) -> CycleReport:
    """One whole cycle: each batch selected and written in one transaction, then the relay.

    In one trace span, recorded in the metrics ledger afterwards; a failed cycle is recorded as
    an error, then the exception propagates.
    """
    journal = journal or Journal()
    cycle = start(
        run_id or str(uuid.uuid4()),
        engine=engine,
        as_of=as_of,
        batch_size=batch_size,
        max_batches=max_batches,
        budget_seconds=budget_seconds,
        journal=journal,
    )
    with tracing.cycle_span(
        cycle.run_id, as_of=cycle.as_of.isoformat(), batch_size=batch_size, max_batches=max_batches
    ):
        try:
            counts, relay = drain(
                engine,
                cycle.as_of,
                batch_size,
                max_batches=max_batches,
                budget_seconds=budget_seconds,
                correlation_id=cycle.run_id,
                publisher=publisher,
                started=cycle.started_at,
                journal=journal,
                progress=progress,
            )
            report = finish(
                engine,
                cycle,
                Written(cycle.run_id, counts, relay),
                run_id=cycle.run_id,
                publisher=publisher,
                journal=journal,
            )
        except Exception as error:
            fail(engine, cycle.run_id, cycle.started_at, cycle.as_of, error, journal=journal)
            raise
        tracing.set_attributes(
            **report.counts.as_dict(), backlog_remaining=report.backlog_remaining
        )
    return report
