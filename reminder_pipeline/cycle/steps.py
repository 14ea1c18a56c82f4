"""A cycle step by step (the Dagster ops adapt these) and whole in one process (the CLI)."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Sequence
from datetime import datetime

from sqlalchemy.engine import Engine

from ..config import DEFAULT_BATCH_SIZE, DEFAULT_CYCLE_BUDGET_SECONDS, DEFAULT_MAX_BATCHES
from ..domain.model import Action, CycleCounts
from ..domain.transitions import action_for
from ..domain.writers import WRITER_DAGSTER, WRITER_IN_PROCESS
from ..logs import Journal
from ..messaging.relay import OutboxSpans, Publisher, RelayResult, publish_rows
from ..observability import ledger, tracing
from ..observability.ledger import CLOCK_SKEW_WARN_SECONDS
from ..store import outbox_repository, repository
from ..store.repository import ScanPosition
from .batch import batch_failed, lock_candidates, report_batch, write_rows
from .clock import as_of_or_now, read_clock
from .drain import drain
from .records import Cycle, CycleReport, Decisions, Progress, Written
from .scan import leave_floor, start_of_scan

#: How long the rows a Dagster run selected stay reserved for its writing step. The write
#: follows the selection within seconds; a run that dies in between releases its rows by
#: itself, before the next minute's tick selects again.
RESERVATION_SECONDS = 30.0
#: The relay always gets at least this long, even when the drain spent the budget: a few seconds
#: past the budget beat a "publish failed" for messages the broker was about to acknowledge.
MIN_RELAY_SECONDS = 5.0


def start(
    run_id: str,
    *,
    engine: Engine,
    as_of: datetime | None = None,
    batch_size: int,
    max_batches: int = DEFAULT_MAX_BATCHES,
    budget_seconds: float = DEFAULT_CYCLE_BUDGET_SECONDS,
    journal: Journal | None = None,
) -> Cycle:
    """A new cycle on the database's clock, read once: AsOf defaults to it and is never after it.

    ``as_of``: an operator's AsOf, a datetime since it was parsed where it was given (the run
    config, the CLI). The host's clock only times the cycle (its budget, its duration); a host
    more than :data:`CLOCK_SKEW_WARN_SECONDS` off the database's
    is logged (``host clock differs from the database's``) and counted in the cycle's figures.
    """
    journal = journal or Journal()
    started = time.time()
    now, skew = read_clock(engine)
    scan = start_of_scan(engine)
    cycle = Cycle(
        run_id,
        as_of_or_now(as_of, now),
        batch_size,
        max_batches,
        budget_seconds,
        started,
        skew,
        scan.start,
        scan.full_sweep,
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
        full_sweep=cycle.full_sweep,
    )
    return cycle


def select(
    engine: Engine, cycle: Cycle, *, journal: Journal | None = None
) -> repository.Reservation:
    """Step 1, select: the cycle's batch of due rows, reserved for its run (committed before
    returning)."""
    with engine.begin() as conn:
        reserved = repository.reserve_due(
            conn, cycle.as_of, cycle.batch_size, cycle.run_id, RESERVATION_SECONDS, cycle.scan_from
        )
    (journal or Journal()).event(
        logging.INFO,
        "batch selected",
        run_id=cycle.run_id,
        count=len(reserved.ids),
        skipped_locked=reserved.skipped_locked,
    )
    return reserved


def decide(engine: Engine, ids: Sequence[str]) -> Decisions:
    """Step 2, decide: send or skip for each selected row, on its event status read without a
    lock (a preview: the cycle's rule, :func:`~reminder_pipeline.domain.transitions.action_for`; a
    row gone since is a skip; step 3 decides again on what it reads under its lock)."""
    with engine.connect() as conn:
        statuses = repository.preview_event_statuses(conn, ids)
    decided = Decisions([], [])
    for reminder_id in ids:
        send = reminder_id in statuses and action_for(statuses[reminder_id]) is Action.SEND
        (decided.send if send else decided.skip).append(reminder_id)
    return decided


def write(
    engine: Engine,
    cycle: Cycle,
    ids: Sequence[str],
    *,
    run_id: str,
    skipped_locked: int = 0,
    after: ScanPosition | None = None,
    publisher: Publisher | None = None,
    journal: Journal | None = None,
    progress: Progress | None = None,
    writer: str = WRITER_DAGSTER,
) -> Written:
    """Step 3, write: the selected rows locked and read again, decided on that and written once;
    then drain on if the cycle may.

    ``run_id`` is the run writing: it may differ from ``cycle.run_id`` when the step is
    re-executed from the UI, days later maybe; then the budget starts afresh, the rows reserved
    by the selecting run are still its to write, and the floor of the due scan is left to the
    cycles of now. ``after``: where the scan continues past the selection (the reservation's
    ``next_from``). ``writer``: who moves the rows (the Dagster ops' step; recorded on each row
    with ``run_id``).
    """
    journal = journal or Journal()
    own = cycle.run_id == run_id
    started = cycle.started_at if own else time.time()
    with tracing.cycle_span(
        run_id,
        as_of=cycle.as_of.isoformat(),
        batch_size=cycle.batch_size,
        max_batches=cycle.max_batches,
    ):
        try:
            with engine.begin() as conn:
                selection = lock_candidates(conn, ids, cycle.as_of, reserved_by=cycle.run_id)
                outcome = write_rows(
                    conn, selection.rows, cycle.as_of, run_id=run_id, writer=writer
                )
            outcome.selected = len(ids)
            outcome.skipped_locked = selection.skipped_locked
            outcome.gone = selection.gone
        except BaseException as error:
            journal.event(
                logging.WARNING, batch_failed(error), run_id=run_id, error_kind=type(error).__name__
            )
            raise
        outcome.skipped_locked += skipped_locked
        report_batch(journal, outcome, run_id)
        scan = cycle.scan
        scan.advance(after or cycle.scan_from, len(ids), cycle.batch_size, outcome.skipped_locked)
        counts = outcome.counts()
        outbox = OutboxSpans()
        outbox.add(m.id for m in outcome.messages)
        if progress is not None:
            progress(counts)
        relayed = RelayResult()
        if (
            cycle.max_batches > 1
            and len(ids) >= cycle.batch_size
            and time.time() - started < cycle.budget_seconds
        ):
            more, relayed = drain(
                engine,
                cycle.as_of,
                cycle.batch_size,
                max_batches=cycle.max_batches - 1,
                budget_seconds=cycle.budget_seconds,
                run_id=run_id,
                publisher=publisher,
                started=started,
                journal=journal,
                progress=(lambda c: progress(_plus(counts, c))) if progress else None,
                continuing=True,
                written=outbox,
                writer=writer,
                scan=scan,
            )
            counts.add(more)
            # The step's summary: in a run's event log a drain's batches are folded.
            journal.event(
                logging.INFO,
                "batches written",
                run_id=run_id,
                **{**counts.counters(), "published": relayed.published},
            )
        if own:
            leave_floor(engine, scan, cycle.as_of)
        tracing.set_attributes(**counts.as_dict())
    return Written(run_id, counts, relayed, outbox)


def _plus(first: CycleCounts, more: CycleCounts) -> CycleCounts:
    total = CycleCounts()
    total.add(first)
    total.add(more)
    return total


def relay(
    engine: Engine,
    cycle: Cycle,
    written: Written,
    *,
    run_id: str,
    publisher: Publisher | None = None,
    publisher_error: str | None = None,
    journal: Journal | None = None,
) -> CycleReport:
    """Step 4, relay: publish what the outbox holds, measure what is left, record the cycle.

    ``publisher_error``: why there is no publisher (the broker is unreachable): every
    unpublished row then counts as a failed publish. A broker outage is a publish failure, not a
    failed cycle: the rows were dispatched, so the ledger records the cycle as succeeded (the
    dispatcher's liveness) with its ``publish_failed`` count, and the outbox backlog tells the
    rest. A re-executed relay (``run_id`` differs from the run that wrote) reports only what it
    published; the sends were counted by the run that made them.

    The relay sees the written rows out (:func:`~reminder_pipeline.messaging.relay.publish_rows`:
    while another relay holds the lock it waits, within the budget, for that one to publish them
    or let go); those still unpublished at the end are the report's ``relay.left``, a partial
    publish like a failed delivery (logged ``partial publish``; the CLI's exit 3).
    """
    journal = journal or Journal()
    own = written.run_id == run_id
    started = cycle.started_at if own else time.time()
    counts = written.counts if own else CycleCounts()
    result = RelayResult().merge(written.relay) if own else RelayResult()
    if publisher is not None:
        remaining = max(started + cycle.budget_seconds - time.time(), MIN_RELAY_SECONDS)
        result.merge(
            publish_rows(engine, publisher, written.outbox, budget_seconds=remaining, run_id=run_id)
        )
    elif publisher_error is not None:
        with engine.connect() as conn:
            waiting = outbox_repository.outbox_lag(conn).unpublished
            ours = outbox_repository.count_unpublished_in(conn, written.outbox.spans)
        result.merge(RelayResult(failed=waiting, last_error=publisher_error, left=ours))
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
        lag = outbox_repository.outbox_lag(conn)
    counts.published = result.published
    counts.publish_failed = result.failed
    counts.duration_ms = int((time.time() - started) * 1000)
    if result.left and not result.failed:  # a failed delivery is logged as such by the relay
        journal.event(
            logging.WARNING,
            "partial publish: outbox rows of this run stay unpublished",
            run_id=run_id,
            unpublished_of_run=result.left,
            relay_busy=result.busy,
            relay_lock_holder=result.holder,
        )
    journal.event(
        logging.INFO,
        "cycle completed",
        run_id=run_id,
        **counts.counters(),
        duration_ms=counts.duration_ms,
        backlog_remaining=left.count,
        outbox_unpublished=lag.unpublished,
        unpublished_of_run=result.left,
    )
    ledger.record_cycle(
        engine,
        run_id,
        counts,
        as_of=cycle.as_of,
        clock_skew_seconds=cycle.clock_skew_seconds if own else None,
    )
    return CycleReport(
        run_id,
        cycle.as_of,
        cycle.batch_size,
        counts,
        result,
        left.count,
        left.oldest_due_age_seconds,
        lag.unpublished,
        clock_skew_seconds=cycle.clock_skew_seconds,
        reexecuted_relay_only=not own,
        full_sweep=cycle.full_sweep and own,
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
    # The ledger's times are the database's; this host's clock gives only the duration.
    duration = time.time() - started_at
    ledger.record_cycle(engine, run_id, None, duration_seconds=duration, as_of=as_of, error=error)


def backlog_left(engine: Engine) -> int:
    """Due Pending rows not yet processed (for progress lines)."""
    with engine.connect() as conn:
        return repository.backlog(conn, repository.database_clock(conn)).count


def run_cycle(
    engine: Engine,
    publisher: Publisher | None,
    *,
    as_of: datetime | None = None,
    batch_size: int = DEFAULT_BATCH_SIZE,
    max_batches: int = DEFAULT_MAX_BATCHES,
    budget_seconds: float = DEFAULT_CYCLE_BUDGET_SECONDS,
    run_id: str | None = None,
    journal: Journal | None = None,
    progress: Progress | None = None,
    writer: str = WRITER_IN_PROCESS,
) -> CycleReport:
    """One whole cycle: each batch selected and written in one transaction, then the relay.

    In one trace span, recorded in the metrics ledger afterwards; a failed cycle is recorded as
    an error, then the exception propagates. ``writer``: who runs it, recorded on each row it
    moves (``cli:dispatch``, ``cli:up``; in process by default; domain/writers.py).
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
        outbox = OutboxSpans()
        scan = cycle.scan
        try:
            counts, relayed = drain(
                engine,
                cycle.as_of,
                batch_size,
                max_batches=max_batches,
                budget_seconds=budget_seconds,
                run_id=cycle.run_id,
                publisher=publisher,
                started=cycle.started_at,
                journal=journal,
                progress=progress,
                written=outbox,
                writer=writer,
                scan=scan,
            )
            leave_floor(engine, scan, cycle.as_of)
            report = relay(
                engine,
                cycle,
                Written(cycle.run_id, counts, relayed, outbox),
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
