"""The dispatch cycle of the seed, as plain calls: one per Dagster op, plus a whole cycle for the CLI.

``select_due_batch → resolve_event_status → transition_and_outbox → relay_outbox``.

The rule that keeps this correct whatever runs the steps: the step that writes
(:func:`transition_and_outbox`) locks the candidates again in its own transaction, re-reads the
row and event status under that lock and decides on *that*. Selection may run in an earlier
transaction (separate Dagster steps, a re-execution from the UI days later): a row that was
cancelled, sent by another instance or locked since then is simply not written.
"""

from __future__ import annotations

import gc
import logging
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime

from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import Connection, Engine

from .domain import contract
from .domain.model import Action, CycleCounts, Decision, DueReminder, PoisonRow, ReminderStatus
from .domain.payload import PayloadError, build_payload
from .domain.transitions import decide_all
from .logs import event, events
from .messaging.relay import BackgroundRelay, Publisher, RelayResult
from .messaging.relay import relay_outbox as _relay_outbox
from .observability import ledger, tracing
from .store import repository
from .store.repository import ClaimedMessage, OutboxMessage

log = logging.getLogger(__name__)

# SQLSTATE classes that belong to a row's data, not to the infrastructure: a failing set-based
# write is retried row by row so that only the offending row is excluded.
_DATA_ERROR_CLASSES = ("22", "23")


class AsOfInFutureError(ValueError):
    """``as_of`` later than now would dispatch reminders before they are due."""


def now_utc() -> datetime:
    """The system clock, in UTC (the seed's AsOf)."""
    return datetime.now(UTC)


def check_as_of(as_of: datetime | None, now: datetime | None = None) -> datetime:
    """Default ``as_of`` to now; refuse a naive or future one."""
    now = now or now_utc()
    if as_of is None:
        return now
    if as_of.tzinfo is None:
        raise AsOfInFutureError("as_of must carry a time zone (e.g. 2026-11-30T10:00:00Z)")
    if as_of > now:
        raise AsOfInFutureError(f"as_of {as_of.isoformat()} is in the future; it must be <= now")
    return as_of


@dataclass(frozen=True)
class Selection:
    """What :func:`select_due_batch` found: the candidates, oldest first."""

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
    skipped_locked: int = 0
    gone: int = 0
    outbox_rows: int = 0
    max_lateness_seconds: float | None = None
    lateness_seconds: list[float] = field(default_factory=list)
    #: The outbox rows written, as the relay publishes them (for a drain's background relay).
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
            max_lateness_seconds=self.max_lateness_seconds,
            lateness_seconds=list(self.lateness_seconds),
        )


def select_due_batch(conn: Connection, as_of: datetime, batch_size: int) -> Selection:
    """Step 1: due Pending rows (``due_at < as_of``), oldest first, locked FOR UPDATE SKIP LOCKED.

    The locks last as long as ``conn``'s transaction. Rows held by another instance are not
    waited for; how many there were is counted as ``skipped_locked``.
    """
    candidates = repository.select_due_for_update_skip_locked(conn, as_of, batch_size)
    upper = candidates[-1].due_at if len(candidates) >= batch_size else as_of
    skipped_locked = repository.count_due_not_ours(
        conn, as_of, upper, [c.reminder_id for c in candidates]
    )
    return Selection(as_of, batch_size, candidates, skipped_locked)


def resolve_event_status(candidates: Sequence[DueReminder]) -> list[Decision]:
    """Step 2 (pure): send for a Planned/InProgress event, skip for Cancelled/Completed."""
    return decide_all(list(candidates))


def _message(
    reminder: DueReminder, correlation_id: str | None, trace: dict[str, str]
) -> OutboxMessage:
    payload = build_payload(reminder)
    headers = contract.headers(payload["ReminderId"], correlation_id)
    # The cycle span's W3C context, stored with the row: the relay sends it whenever it publishes,
    # so a consumer continues this trace.
    headers.update(trace)
    return OutboxMessage(message_key=payload["EventId"], payload=payload, headers=headers)


def _is_data_error(error: sa_exc.DBAPIError) -> bool:
    sqlstate = getattr(error.orig, "sqlstate", None) or ""
    return sqlstate[:2] in _DATA_ERROR_CLASSES


def transition_and_outbox(
    conn: Connection,
    candidate_ids: Sequence[str | uuid.UUID],
    as_of: datetime,
    *,
    correlation_id: str | None = None,
    now: datetime | None = None,
    held: Sequence[DueReminder] | None = None,
    log_preface: Sequence[dict] = (),
) -> BatchOutcome:
    """Steps 3-4 in ``conn``'s transaction: lock and re-read the candidates, decide, write.

    ``held``: the candidates as :func:`select_due_batch` read them *in this same transaction*
    (``dispatch_batch``). They are locked FOR UPDATE by it since, so nothing can have changed
    them and they are not locked and read a second time. Anything else (a selection from an
    earlier transaction, a Dagster step) must leave it None. ``log_preface``: log lines (fields,
    with their ``msg``) written in the same record as the batch's per-reminder lines.

    Sent rows get ``sent_at`` (the clock at this write, never earlier than ``as_of``) and exactly
    one outbox row each; Skipped rows publish nothing. A poison row (its payload cannot be built
    or breaks the contract) is excluded, logged at ERROR, left Pending with a back-off; the rest
    commits with the caller's transaction. Infrastructure errors propagate: the caller's
    transaction rolls back and releases every lock.
    """
    now = now or now_utc()
    sent_at = max(now, as_of)
    outcome = BatchOutcome()
    # Ids are text; a selection pickled by an older version (a step re-executed from the UI
    # after an upgrade) may still hold uuid.UUIDs.
    candidate_ids = [str(i) for i in candidate_ids]
    if held is not None and [r.reminder_id for r in held] == list(candidate_ids):
        locked = list(held)
    else:
        locked = repository.lock_candidates(conn, candidate_ids, as_of)
    locked_ids = {r.reminder_id for r in locked}
    missing = [i for i in candidate_ids if i not in locked_ids]
    # Still Pending but not lockable: another instance or an event cascade holds them.
    outcome.skipped_locked = repository.count_still_pending(conn, missing)
    outcome.gone = len(missing) - outcome.skipped_locked

    planned: list[tuple[Decision, OutboxMessage | None]] = []
    trace = tracing.trace_headers()  # the cycle span's context: the same for every row
    for decision in resolve_event_status(locked):
        reminder = decision.reminder
        if decision.action is Action.SKIP:
            planned.append((decision, None))
            continue
        try:
            planned.append((decision, _message(reminder, correlation_id, trace)))
        except PayloadError as error:
            outcome.poison.append(
                PoisonRow(reminder.reminder_id, reminder.event_id, reminder.tenant_id, str(error))
            )

    applied = _apply(conn, planned, sent_at, outcome)
    repository.record_poison(conn, outcome.poison, now)

    by_id = {d.reminder.reminder_id: (d.reminder, m) for d, m in planned}
    sent_ids: list[dict] = []
    for row in applied:
        reminder, message = by_id[row.reminder_id]
        if row.status is ReminderStatus.SENT:
            outcome.sent.append(reminder)
            if row.outbox_id is not None and message is not None:
                outcome.messages.append(ClaimedMessage(row.outbox_id, contract.TOPIC,
                                                       message.message_key, row.payload or "",
                                                       message.headers))
            p = message.payload if message is not None else {}
            sent_ids.append({"reminder_id": p.get("ReminderId"), "event_id": p.get("EventId"),
                             "offset_minutes": reminder.offset_minutes,
                             "tenant_id": p.get("TenantId")})
            if row.lateness_seconds is not None:
                outcome.lateness_seconds.append(row.lateness_seconds)
                outcome.max_lateness_seconds = max(
                    outcome.max_lateness_seconds or row.lateness_seconds, row.lateness_seconds
                )
        else:
            outcome.skipped.append(reminder)
    _log_outcome(outcome, correlation_id, sent_ids, log_preface)
    return outcome


def _apply(
    conn: Connection,
    planned: list[tuple[Decision, OutboxMessage | None]],
    sent_at: datetime,
    outcome: BatchOutcome,
) -> list[repository.AppliedTransition]:
    """Write the transitions set-based; on a data error, isolate the offending rows one by one."""
    transitions = [(d.reminder.reminder_id, d.target_status, m) for d, m in planned]
    savepoint = conn.begin_nested()
    try:
        applied, outcome.outbox_rows = repository.apply_transitions(
            conn, transitions, topic=contract.TOPIC, sent_at=sent_at
        )
        savepoint.commit()
        return applied
    except sa_exc.DBAPIError as error:
        savepoint.rollback()
        if not _is_data_error(error):
            raise
    applied = []
    outcome.outbox_rows = 0
    for decision, message in planned:
        reminder = decision.reminder
        savepoint = conn.begin_nested()
        try:
            rows, written = repository.apply_transitions(
                conn,
                [(reminder.reminder_id, decision.target_status, message)],
                topic=contract.TOPIC,
                sent_at=sent_at,
            )
            savepoint.commit()
        except sa_exc.DBAPIError as error:
            savepoint.rollback()
            if not _is_data_error(error):
                raise
            sqlstate = getattr(error.orig, "sqlstate", "")
            outcome.poison.append(
                PoisonRow(reminder.reminder_id, reminder.event_id, reminder.tenant_id,
                          f"database rejected the row (SQLSTATE {sqlstate})")
            )
            continue
        applied.extend(rows)
        outcome.outbox_rows += written
    return applied


def _log_outcome(
    outcome: BatchOutcome, correlation_id: str | None, sent: list[dict], preface: Sequence[dict] = ()
) -> None:
    # Each reminder: a log line and an event on the cycle span, with the same identifiers. The
    # lines of a batch go out as one record (logs.events): one line each in the JSON stream, one
    # entry in a Dagster run's event log (where every entry costs a database connection). The
    # span keeps the first MAX_ITEM_EVENTS events. ``sent``: the sent rows' ids, as strings
    # already (from their payloads).
    skipped = [{"reminder_id": str(r.reminder_id), "event_id": str(r.event_id),
                "event_status": r.event_status, "tenant_id": str(r.tenant_id)}
               for r in outcome.skipped]
    lines = list(preface)
    lines += [{"msg": "reminder sent", **ids} for ids in sent]
    lines += [{"msg": "reminder skipped", **ids} for ids in skipped]
    events(log, logging.INFO, "batch written", lines, run_id=correlation_id)
    tracing.item_events("reminder sent", sent)
    tracing.item_events("reminder skipped", skipped)
    for p in outcome.poison:
        ids = {"reminder_id": str(p.reminder_id), "event_id": str(p.event_id),
               "tenant_id": None if p.tenant_id is None else str(p.tenant_id)}
        event(log, logging.ERROR, "item failed", run_id=correlation_id, exception=p.error, **ids)
        tracing.item_event("item failed", **ids)


def dispatch_batch(
    engine: Engine,
    as_of: datetime,
    batch_size: int,
    *,
    correlation_id: str | None = None,
) -> BatchOutcome:
    """Select and transition one batch in a single transaction (locks held from select to commit)."""
    with engine.begin() as conn:
        selection = select_due_batch(conn, as_of, batch_size)
        # Logged with the batch's reminder lines (one record): nothing is logged for a batch
        # that rolls back but "cycle failed".
        selected = {"msg": "batch selected", "count": len(selection.candidates),
                    "skipped_locked": selection.skipped_locked}
        outcome = transition_and_outbox(conn, selection.ids, as_of, correlation_id=correlation_id,
                                        held=selection.candidates, log_preface=[selected])
        outcome.skipped_locked += selection.skipped_locked
        return outcome


@dataclass
class CycleReport:
    """A whole cycle: counts, the relay's result, and the backlog left behind."""

    run_id: str
    as_of: datetime
    batch_size: int
    counts: CycleCounts
    relay: RelayResult
    backlog_remaining: int
    oldest_due_age_seconds: float | None

    def as_dict(self) -> dict:
        """Flat dict for the CLI, logs and metadata."""
        data = self.counts.as_dict()
        data.update(
            run_id=self.run_id,
            as_of=self.as_of.isoformat(),
            batch_size=self.batch_size,
            published=self.relay.published,
            publish_failed=self.relay.failed,
            backlog_remaining=self.backlog_remaining,
            oldest_due_age_seconds=self.oldest_due_age_seconds,
        )
        return data


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
) -> tuple[CycleCounts, RelayResult]:
    """Dispatch up to ``max_batches`` batches, each its own transaction, publishing after each.

    Stops early when a batch comes back short (nothing more is due), or when the cycle's time
    budget is spent: what is left is picked up by the next cycle (the seed: oldest first).
    With a publisher, the relay runs on a thread of its own (:class:`BackgroundRelay`): each
    committed batch's outbox rows are handed to it and published while the next batch is
    written; the returned relay result is its whole work.
    """
    with _young_generation(_DRAIN_GC_GEN0):
        return _drain(engine, as_of, batch_size, max_batches=max_batches,
                      budget_seconds=budget_seconds, correlation_id=correlation_id,
                      publisher=publisher, started=started)


#: The collector's young-generation threshold during a drain. A batch allocates ~10 objects per
#: row that live for the batch (rows, decisions, payloads); with the default 700, many survive
#: two collections and are promoted, and the full collections that follow walk the whole heap
#: of a process with Dagster loaded: ~15 % of a 100k catch-up (measured, benchmarks/README.md).
#: Nearly all of it is freed by reference counting anyway; cycles still get collected.
_DRAIN_GC_GEN0 = 50_000


@contextmanager
def _young_generation(threshold: int) -> Iterator[None]:
    before = gc.get_threshold()
    if before[0] == 0 or before[0] >= threshold:  # collector disabled, or already roomier
        yield
        return
    gc.set_threshold(threshold, *before[1:])
    try:
        yield
    finally:
        gc.set_threshold(*before)


def _drain(
    engine: Engine,
    as_of: datetime,
    batch_size: int,
    *,
    max_batches: int,
    budget_seconds: float,
    correlation_id: str | None,
    publisher: Publisher | None,
    started: float | None,
) -> tuple[CycleCounts, RelayResult]:
    started = started if started is not None else time.monotonic()
    counts = CycleCounts()
    relay: BackgroundRelay | None = None
    if publisher is not None:
        relay = BackgroundRelay(engine, publisher, deadline=started + max(budget_seconds, 1.0),
                                correlation_id=correlation_id)
    try:
        for _ in range(max_batches):
            outcome = dispatch_batch(engine, as_of, batch_size, correlation_id=correlation_id)
            counts.add(outcome.counts())
            if relay is not None:
                relay.hand_over(outcome.messages)
            selected = len(outcome.sent) + len(outcome.skipped) + len(outcome.poison) + outcome.gone
            if selected + outcome.skipped_locked < batch_size:
                break
            if time.monotonic() - started >= budget_seconds:
                event(log, logging.WARNING, "cycle budget spent; the rest waits for the next cycle",
                      run_id=correlation_id, budget_seconds=budget_seconds)
                break
    except BaseException:
        if relay is not None:
            relay.abandon()
        raise
    return counts, (relay.finish() if relay is not None else RelayResult())


def run_cycle(
    engine: Engine,
    publisher: Publisher | None,
    *,
    as_of: datetime | None = None,
    batch_size: int = 200,
    max_batches: int = 1,
    budget_seconds: float = 30.0,
    run_id: str | None = None,
) -> CycleReport:
    """One whole cycle (CLI, demo, tests): dispatch, relay everything unpublished, measure the backlog.

    Runs in one trace span and is recorded in the metrics ledger afterwards, in its own
    transaction; a failed cycle is recorded as an error, then the exception propagates.
    """
    started_at = now_utc()
    as_of = check_as_of(as_of)
    run_id = run_id or str(uuid.uuid4())
    with tracing.cycle_span(run_id, as_of=as_of.isoformat(), batch_size=batch_size,
                            max_batches=max_batches):
        try:
            report = _run_cycle(engine, publisher, as_of, batch_size, max_batches,
                                budget_seconds, run_id)
        except Exception as exc:
            event(log, logging.ERROR, "cycle failed", run_id=run_id, error_kind=type(exc).__name__)
            ledger.record_cycle(engine, run_id, None, started_at=started_at, as_of=as_of, error=exc)
            raise
        tracing.set_attributes(**report.counts.as_dict(),
                               backlog_remaining=report.backlog_remaining)
        ledger.record_cycle(engine, run_id, report.counts, started_at=started_at, as_of=as_of)
    return report


def _run_cycle(
    engine: Engine,
    publisher: Publisher | None,
    as_of: datetime,
    batch_size: int,
    max_batches: int,
    budget_seconds: float,
    run_id: str,
) -> CycleReport:
    started = time.monotonic()
    event(log, logging.INFO, "cycle started", run_id=run_id, as_of=as_of.isoformat(),
          batch_size=batch_size, max_batches=max_batches)
    counts, relay = drain(engine, as_of, batch_size, max_batches=max_batches,
                          budget_seconds=budget_seconds, correlation_id=run_id,
                          publisher=publisher, started=started)
    if publisher is not None:
        # Also picks up rows an earlier cycle left unpublished (broker outage, crash).
        remaining = max(budget_seconds - (time.monotonic() - started), 1.0)
        relay.merge(_relay_outbox(engine, publisher, budget_seconds=remaining,
                                          correlation_id=run_id))
    with engine.connect() as conn:
        left = repository.backlog(conn, now_utc())
    counts.published = relay.published
    counts.publish_failed = relay.failed
    counts.duration_ms = int((time.monotonic() - started) * 1000)
    report = CycleReport(run_id, as_of, batch_size, counts, relay, left.count,
                         left.oldest_due_age_seconds)
    event(log, logging.INFO, "cycle completed", run_id=run_id, sent=counts.sent,
          skipped=counts.skipped, skipped_locked=counts.skipped_locked, failed=counts.failed,
          published=relay.published, publish_failed=relay.failed,
          duration_ms=counts.duration_ms, backlog_remaining=left.count)
    return report
