"""Measurements and alternatives for the catch-up figure, applied by monkeypatching, so their
effect is measured in the benchmark's own harness (``--variants``). Not used by the default figures.

The first round of proposals (the contract check as straight-line code, the batch as one jsonb
parameter, no re-read inside ``dispatch_batch``, one log record per batch, the trace context once
per batch, capped span events) is in the code since 2026-11-30; see benchmarks/README.md for the
before/after figures. What is left here:

* ``sqlpayload`` - the payload built set-based in SQL inside the transition statement (like the
  raw limit); Python screens rows for the poison conditions only. A design change (the payload
  rules would live in SQL too), measured to show what it would still buy. (No hand-over: its
  rows are published by the cycle's final relay pass.)
* ``seqrelay`` - the relay inline after each batch, reading the rows back from the outbox (the
  design before the background relay), to show what the hand-over buys.
* ``workers2`` - two dispatch threads in one drain (one background relay).
* ``nolog`` / ``notrace`` / ``nogc`` - what the per-item log lines, the span events and the
  cyclic garbage collector cost (measurements, not proposals).
"""

from __future__ import annotations

import json
import logging
from typing import Any


def apply(spec: str) -> list[str]:
    names = [n.strip() for n in spec.split(",") if n.strip() and n.strip() != "none"]
    for name in names:
        apply_one = globals().get(f"_apply_{name}")
        if apply_one is None:
            raise SystemExit(f"unknown variant {name!r}")
        apply_one()
    return names


def _apply_nolog() -> None:
    logging.getLogger("reminder_pipeline").setLevel(logging.WARNING)


def _apply_notrace() -> None:
    from reminder_pipeline.observability import tracing

    tracing.item_event = lambda name, **ids: None
    tracing.item_events = lambda name, items: None
    tracing.trace_headers = lambda: {}


def _apply_nogc() -> None:
    import gc

    gc.disable()


def _apply_seqrelay() -> None:
    from reminder_pipeline import cycle
    from reminder_pipeline.messaging import relay as relay_mod

    class Inline:
        def __init__(self, engine, publisher, *, deadline, correlation_id=None, **_: Any):
            self.args = (engine, publisher, deadline, correlation_id)
            self.result = relay_mod.RelayResult()

        def hand_over(self, messages):
            import time

            engine, publisher, deadline, cid = self.args
            if messages:
                self.result.merge(relay_mod.relay_outbox(
                    engine, publisher, budget_seconds=max(deadline - time.monotonic(), 1.0),
                    correlation_id=cid))

        def finish(self, timeout=None):
            return self.result

        def abandon(self):
            pass

    cycle.BackgroundRelay = Inline


def _apply_workers2() -> None:
    import threading
    import time

    from reminder_pipeline import cycle
    from reminder_pipeline.domain.model import CycleCounts
    from reminder_pipeline.messaging.relay import BackgroundRelay, RelayResult

    def drain(engine, as_of, batch_size, *, max_batches=1, budget_seconds=30.0,
              correlation_id=None, publisher=None, started=None):
        started = started if started is not None else time.monotonic()
        relay = (BackgroundRelay(engine, publisher, deadline=started + budget_seconds,
                                 correlation_id=correlation_id) if publisher else None)
        totals = CycleCounts()
        lock = threading.Lock()
        left = [max_batches]

        def work():
            while True:
                with lock:
                    if left[0] <= 0:
                        return
                    left[0] -= 1
                outcome = cycle.dispatch_batch(engine, as_of, batch_size,
                                               correlation_id=correlation_id)
                with lock:
                    totals.add(outcome.counts())
                if relay is not None:
                    relay.hand_over(outcome.messages)
                if len(outcome.sent) + len(outcome.skipped) + len(outcome.poison) < batch_size:
                    return

        threads = [threading.Thread(target=work) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return totals, (relay.finish() if relay else RelayResult())

    cycle.drain = drain


# --- sqlpayload ----------------------------------------------------------------------------------
# The outbox payload built set-based in SQL, like the raw limit, inside the transition statement:
# Python only decides send/skip and screens each row for the poison conditions build_payload
# rejects (missing/out-of-range start, negative offset, empty or > 64-char kind, unknown time
# zone); the statement receives two small arrays (ids, statuses) plus the batch's constant headers.
# The JSON is what build_payload makes (StartAt with microseconds only when non-zero).

APPLY_TRANSITIONS_SQL_PAYLOAD = """
    WITH decided AS (
        SELECT * FROM unnest(CAST(:ids AS uuid[]), CAST(:statuses AS text[])) AS d(id, status)
    ),
    moved AS (
        UPDATE event_reminders r
           SET status = d.status,
               sent_at = CASE WHEN d.status = 'Sent' THEN CAST(:sent_at AS timestamptz) END,
               updated_at = now(),
               last_error = NULL,
               next_attempt_at = NULL
          FROM decided d
         WHERE r.id = d.id AND r.status = 'Pending'
        RETURNING r.id, r.status, r.sent_at, r.due_at, r.calendar_event_id, r.offset_minutes
    ),
    published AS (
        INSERT INTO outbox (topic, message_key, payload, headers, reminder_id)
        SELECT :topic, e.id::text,
               jsonb_build_object(
                   'ReminderId', m.id::text, 'EventId', e.id::text,
                   'TenantId', e.tenant_id::text, 'OwnerUserId', e.owner_user_id::text,
                   'ClientUserId', e.client_user_id::text, 'Kind', e.kind,
                   'StartAt', to_char(e.start_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS')
                              || CASE WHEN extract(microseconds FROM e.start_at)::bigint % 1000000 <> 0
                                      THEN to_char(e.start_at AT TIME ZONE 'UTC', '.US') ELSE '' END
                              || 'Z',
                   'TimeZone', e.time_zone, 'OffsetMinutes', m.offset_minutes,
                   'AppointmentId', e.appointment_id::text),
               CAST(:headers AS jsonb) || jsonb_build_object('reminder-id', m.id::text),
               m.id
          FROM moved m JOIN calendar_events e ON e.id = m.calendar_event_id
         WHERE m.status = 'Sent'
         ORDER BY m.due_at
        RETURNING reminder_id
    )
    SELECT m.id, m.status,
           EXTRACT(EPOCH FROM (m.sent_at - m.due_at)) AS lateness_seconds,
           (SELECT count(*) FROM published) AS outbox_rows
      FROM moved m
"""


def payload_problem(reminder) -> str | None:
    """Why build_payload would refuse ``reminder`` (a poison row), or None."""
    from reminder_pipeline.domain.payload import PayloadError, check_time_zone

    if reminder.start_at is None:
        return "StartAt is missing or outside the representable range"
    if reminder.offset_minutes is None or reminder.offset_minutes < 0:
        return "OffsetMinutes is negative or missing"
    if not reminder.kind:
        return "Kind is empty"
    if len(reminder.kind) > 64:
        return "breaks the contract: Kind: is too long"
    try:
        check_time_zone(reminder.time_zone)
    except PayloadError as exc:
        return str(exc)
    return None


def _apply_sqlpayload() -> None:
    from sqlalchemy import text

    from reminder_pipeline import cycle
    from reminder_pipeline.domain import contract
    from reminder_pipeline.domain.model import Action, PoisonRow, ReminderStatus
    from reminder_pipeline.observability import tracing
    from reminder_pipeline.store import repository

    statement = text(APPLY_TRANSITIONS_SQL_PAYLOAD)

    def transition_and_outbox(conn, candidate_ids, as_of, *, correlation_id=None, now=None,
                              held=None):
        now = now or cycle.now_utc()
        sent_at = max(now, as_of)
        outcome = cycle.BatchOutcome()
        if held is not None and [r.reminder_id for r in held] == list(candidate_ids):
            locked = list(held)
        else:
            locked = repository.lock_candidates(conn, candidate_ids, as_of)
        locked_ids = {r.reminder_id for r in locked}
        missing = [i for i in candidate_ids if i not in locked_ids]
        outcome.skipped_locked = repository.count_still_pending(conn, missing)
        outcome.gone = len(missing) - outcome.skipped_locked
        ids, statuses, by_id = [], [], {}
        for decision in cycle.resolve_event_status(locked):
            r = decision.reminder
            if decision.action is Action.SEND:
                problem = payload_problem(r)
                if problem is not None:
                    outcome.poison.append(PoisonRow(r.reminder_id, r.event_id, r.tenant_id, problem))
                    continue
            ids.append(r.reminder_id)
            statuses.append(str(decision.target_status))
            by_id[r.reminder_id] = r
        if ids:
            headers = contract.headers("", correlation_id)
            headers.pop(contract.HEADER_REMINDER_ID)
            headers.update(tracing.trace_headers())
            savepoint = conn.begin_nested()
            rows = conn.execute(statement, {
                "ids": ids, "statuses": statuses, "sent_at": sent_at, "topic": contract.TOPIC,
                "headers": json.dumps(headers),
            }).all()
            savepoint.commit()
            outcome.outbox_rows = int(rows[0].outbox_rows) if rows else 0
            for row in rows:
                reminder = by_id[row.id]
                if row.status == ReminderStatus.SENT.value:
                    outcome.sent.append(reminder)
                    late = repository._finite(row.lateness_seconds)
                    if late is not None:
                        outcome.lateness_seconds.append(late)
                        outcome.max_lateness_seconds = max(outcome.max_lateness_seconds or late, late)
                else:
                    outcome.skipped.append(reminder)
        repository.record_poison(conn, outcome.poison, now)
        sent = [{"reminder_id": str(r.reminder_id), "event_id": str(r.event_id),
                 "offset_minutes": r.offset_minutes, "tenant_id": str(r.tenant_id)}
                for r in outcome.sent]
        cycle._log_outcome(outcome, correlation_id, sent)
        return outcome

    cycle.transition_and_outbox = transition_and_outbox


