"""Prototypes of proposed fixes, applied by monkeypatching, so their effect is measured in the
benchmark's own harness before anyone edits the plain code. Not used by the default figures.

Names (comma-separated, ``all`` = every proposal):

* ``validate`` - the contract check as straight-line code equivalent to the JSON Schema (same
  patterns, same bounds, bool is not an integer) instead of jsonschema's generic validator.
* ``jsonb`` - APPLY_TRANSITIONS fed one ``jsonb`` document (one C ``json.dumps`` per batch)
  instead of five ``text[]`` arrays, whose text-format dump escapes every quote of every payload
  with a Python regex callback.
* ``noreread`` - when selection and transition share one transaction (``dispatch_batch``), the
  rows are already locked by it: reuse the selected rows instead of locking and re-reading them.
* ``trace1`` - the W3C trace context is the cycle span's, identical for every row: computed once
  per batch instead of once per row.
* ``events`` - per-item span events stop once the span holds ``MAX_ITEM_EVENTS`` (the SDK drops
  the rest anyway, after building each event's attributes).
* ``fastlog`` - ``logging._srcfile = None`` (no stack walk for the caller's file/line, which the
  JSON formatter never prints) and no thread/process lookups per record.
* ``batchlog`` - one "reminders sent"/"reminders skipped" line per batch carrying the ids, instead
  of one line per reminder: a change of the logging contract, measured to show its weight.
* ``sqlpayload`` - the payload built set-based in SQL inside the transition statement (like the
  raw limit); Python screens rows for the poison conditions only (see the section below).
  A design change: not part of ``all``.
* ``notrace`` / ``nolog`` are measurements only (what the per-item span events / log lines cost),
  not proposals.
"""

from __future__ import annotations

import json
import logging
import re
import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from reminder_pipeline.domain.contract import PAYLOAD_FIELDS, ContractViolation  # noqa: E402

PROPOSALS = ("validate", "jsonb", "noreread", "trace1", "events", "fastlog")


def apply(spec: str) -> list[str]:
    names = [n.strip() for n in spec.split(",") if n.strip() and n.strip() != "none"]
    if "all" in names:
        names = [n for n in names if n != "all"] + [p for p in PROPOSALS if p not in names]
    for name in names:
        globals()[f"_apply_{name}"]()
    return names


# --- validate ---------------------------------------------------------------------------------

_GUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
_START = re.compile(r"^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,6})?Z$")


def fast_validate(payload: dict[str, Any]) -> None:
    """What ``contract.validate`` checks, as straight-line code (same messages' meaning)."""
    if not isinstance(payload, dict):
        raise ContractViolation("payload: is not of type 'object'")
    if len(payload) != len(PAYLOAD_FIELDS) or any(k not in payload for k in PAYLOAD_FIELDS):
        extra = sorted(set(payload) - set(PAYLOAD_FIELDS))
        missing = [k for k in PAYLOAD_FIELDS if k not in payload]
        raise ContractViolation(f"payload: missing {missing} / unexpected {extra}")
    for name in ("ReminderId", "EventId", "TenantId", "OwnerUserId"):
        value = payload[name]
        if not isinstance(value, str) or not _GUID.search(value):
            raise ContractViolation(f"{name}: is not a guid")
    for name in ("ClientUserId", "AppointmentId"):
        value = payload[name]
        if value is not None and (not isinstance(value, str) or not _GUID.search(value)):
            raise ContractViolation(f"{name}: is not a guid or null")
    for name in ("Kind", "TimeZone"):
        value = payload[name]
        if not isinstance(value, str) or not 1 <= len(value) <= 64:
            raise ContractViolation(f"{name}: must be a string of 1..64 characters")
    value = payload["StartAt"]
    if not isinstance(value, str) or not _START.search(value):
        raise ContractViolation("StartAt: is not an ISO-8601 UTC timestamp")
    value = payload["OffsetMinutes"]
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 2147483647:
        raise ContractViolation("OffsetMinutes: must be an integer in 0..2147483647")


def _apply_validate() -> None:
    from reminder_pipeline.domain import contract

    contract.validate = fast_validate


# --- jsonb --------------------------------------------------------------------------------------

APPLY_TRANSITIONS_JSONB = """
    WITH decided AS (
        SELECT * FROM jsonb_to_recordset(CAST(:batch AS jsonb))
            AS d(id uuid, status text, message_key text, payload jsonb, headers jsonb)
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
        RETURNING r.id, r.status, r.sent_at, r.due_at
    ),
    published AS (
        INSERT INTO outbox (topic, message_key, payload, headers, reminder_id)
        SELECT :topic, d.message_key, d.payload, d.headers, m.id
          FROM moved m JOIN decided d ON d.id = m.id
         WHERE m.status = 'Sent'
         ORDER BY m.due_at
        RETURNING reminder_id
    )
    SELECT m.id, m.status,
           EXTRACT(EPOCH FROM (m.sent_at - m.due_at)) AS lateness_seconds,
           (SELECT count(*) FROM published) AS outbox_rows
      FROM moved m
"""


def _apply_jsonb() -> None:
    from sqlalchemy import text

    from reminder_pipeline.domain.model import ReminderStatus
    from reminder_pipeline.store import repository

    statement = text(APPLY_TRANSITIONS_JSONB)

    def apply_transitions(conn, transitions, *, topic: str, sent_at: datetime):
        if not transitions:
            return [], 0
        batch = [
            {
                "id": str(reminder_id),
                "status": str(status),
                "message_key": message.message_key if message else None,
                "payload": message.payload if message else None,
                "headers": message.headers if message else None,
            }
            for reminder_id, status, message in transitions
        ]
        rows = conn.execute(
            statement,
            {"batch": json.dumps(batch, separators=(",", ":")), "sent_at": sent_at, "topic": topic},
        ).all()
        applied = [
            repository.AppliedTransition(
                reminder_id=r.id,
                status=ReminderStatus(r.status),
                lateness_seconds=repository._finite(r.lateness_seconds),
            )
            for r in rows
        ]
        return applied, (int(rows[0].outbox_rows) if rows else 0)

    repository.apply_transitions = apply_transitions


# --- noreread -----------------------------------------------------------------------------------


def _apply_noreread() -> None:
    from reminder_pipeline import cycle
    from reminder_pipeline.store import repository

    original_select = repository.select_due_for_update_skip_locked
    original_lock = repository.lock_candidates

    def select(conn, as_of, batch_size):
        rows = original_select(conn, as_of, batch_size)
        conn.info["bench_locked"] = (as_of, rows)
        return rows

    def lock(conn, ids: Sequence[uuid.UUID], as_of):
        held = conn.info.pop("bench_locked", None)
        if held is not None and held[0] == as_of and [r.reminder_id for r in held[1]] == list(ids):
            return held[1]  # selected and locked by this very transaction: nothing can have changed
        return original_lock(conn, ids, as_of)

    repository.select_due_for_update_skip_locked = select
    repository.lock_candidates = lock
    del cycle  # cycle calls repository.<name> at call time, so patching the module is enough


# --- trace1 / notrace / nolog -------------------------------------------------------------------


def _apply_trace1() -> None:
    from reminder_pipeline import cycle
    from reminder_pipeline.observability import tracing

    original = tracing.trace_headers
    cache: dict[int, dict[str, str]] = {}

    def trace_headers() -> dict[str, str]:
        from opentelemetry import trace

        span = trace.get_current_span()
        key = id(span)
        if key not in cache:
            cache.clear()
            cache[key] = original()
        return dict(cache[key])

    tracing.trace_headers = trace_headers
    del cycle


def _apply_notrace() -> None:
    from reminder_pipeline.observability import tracing

    tracing.item_event = lambda name, **ids: None
    tracing.trace_headers = lambda: {}


def _apply_nolog() -> None:
    logging.getLogger("reminder_pipeline").setLevel(logging.WARNING)


def _apply_events() -> None:
    from opentelemetry import trace

    from reminder_pipeline.observability import tracing

    original = tracing.item_event

    def item_event(name: str, **ids: Any) -> None:
        span = trace.get_current_span()
        limits = getattr(span, "_limits", None)
        events = getattr(span, "_events", None)
        if limits is not None and events is not None and len(events) >= limits.max_events:
            return  # the SDK would build the event and then drop it
        original(name, **ids)

    tracing.item_event = item_event


def _apply_fastlog() -> None:
    logging._srcfile = None  # type: ignore[attr-defined]
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False


def _apply_batchlog() -> None:
    from reminder_pipeline import cycle
    from reminder_pipeline.logs import event

    log = logging.getLogger("reminder_pipeline.cycle")

    def _log_outcome(outcome, correlation_id):
        if outcome.sent:
            event(log, logging.INFO, "reminders sent", run_id=correlation_id,
                  reminder_ids=[str(r.reminder_id) for r in outcome.sent])
        if outcome.skipped:
            event(log, logging.INFO, "reminders skipped", run_id=correlation_id,
                  reminder_ids=[str(r.reminder_id) for r in outcome.skipped])
        for p in outcome.poison:
            event(log, logging.ERROR, "item failed", run_id=correlation_id, exception=p.error,
                  reminder_id=str(p.reminder_id), event_id=str(p.event_id))

    cycle._log_outcome = _log_outcome


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


def _apply_switch() -> None:
    import sys

    sys.setswitchinterval(0.0005)


def _apply_seqrelay() -> None:
    """Measurement: the relay inline after each batch (as before the background relay)."""
    from reminder_pipeline.messaging import relay as relay_mod

    class Inline:
        def __init__(self, engine, publisher, *, deadline, correlation_id=None):
            import time as _t
            self.args = (engine, publisher, deadline, correlation_id, _t)
            self.result = relay_mod.RelayResult()

        def notify(self):
            engine, publisher, deadline, cid, _t = self.args
            self.result.merge(relay_mod.relay_outbox(
                engine, publisher, budget_seconds=max(deadline - _t.monotonic(), 1.0),
                correlation_id=cid))

        def finish(self, timeout=None):
            return self.result

        def abandon(self):
            pass

    from reminder_pipeline import cycle
    cycle.BackgroundRelay = Inline


def _apply_workers2() -> None:
    """Measurement: two dispatch threads in one drain (sharing the background relay)."""
    import threading
    import time as _t

    from reminder_pipeline import cycle
    from reminder_pipeline.domain.model import CycleCounts
    from reminder_pipeline.messaging.relay import BackgroundRelay, RelayResult

    def drain(engine, as_of, batch_size, *, max_batches=1, budget_seconds=30.0,
              correlation_id=None, publisher=None, started=None):
        started = started if started is not None else _t.monotonic()
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
                if relay is not None and outcome.outbox_rows:
                    relay.notify()
                if len(outcome.sent) + len(outcome.skipped) + len(outcome.poison) < batch_size:
                    return

        threads = [threading.Thread(target=work) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return totals, (relay.finish() if relay else RelayResult())

    cycle.drain = drain


def _apply_nogc() -> None:
    """Measurement: the cyclic garbage collector off."""
    import gc

    gc.disable()


def _apply_gcfreeze() -> None:
    """Measurement: everything allocated before the drain moved out of the collector's sight."""
    import gc

    gc.freeze()


def _apply_gcthreshold() -> None:
    """Measurement: a young generation of 50k allocations instead of 700."""
    import gc

    gc.set_threshold(50_000, 20, 20)
