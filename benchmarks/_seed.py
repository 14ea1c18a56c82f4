"""Set-based data generation (``INSERT ... SELECT generate_series``), deterministic per row number.

Every id is ``md5(<tag> || n)::uuid``: random-looking (like production UUIDs, so primary-key
lookups have no artificial locality) yet reproducible, so reminders can name their event without a
join. Text columns get PII-looking values so rows are as wide as real ones.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import psycopg

from benchmarks._infra import fmt_rate

# Event status by n % 100: 85 Planned, 5 InProgress, 7 Cancelled, 3 Completed.
_EVENT_STATUS = """CASE WHEN n % 100 < 85 THEN 'Planned' WHEN n % 100 < 90 THEN 'InProgress'
                        WHEN n % 100 < 97 THEN 'Cancelled' ELSE 'Completed' END"""
_KINDS = "(ARRAY['Showing','Consultation','Meeting','Task','BookingDeadline'])[1 + n % 5]"
_ZONES = "(ARRAY['Europe/Moscow','Asia/Yekaterinburg','Europe/Kaliningrad','Asia/Vladivostok','UTC'])[1 + (n / 5) % 5]"

# Start of event n relative to the base time, in seconds: a fixed pseudo-random permutation.
_START_OFFSET = "(((n::bigint * 7919) % :span) - :back)"

INSERT_EVENTS = f"""
INSERT INTO calendar_events (id, tenant_id, owner_user_id, client_user_id, kind, status, origin,
                             appointment_id, start_at, time_zone, title, description, location,
                             created_at, updated_at)
SELECT md5('event' || n)::uuid,
       md5('tenant' || (n % 50))::uuid,
       md5('owner' || (n % 2000))::uuid,
       CASE WHEN n % 3 = 0 THEN md5('client' || n)::uuid END,
       {_KINDS},
       {_EVENT_STATUS},
       CASE WHEN n % 4 = 0 THEN 'Appointment' ELSE 'Manual' END,
       CASE WHEN n % 4 = 0 THEN md5('appointment' || n)::uuid END,
       CAST(:base AS timestamptz) + make_interval(secs => {_START_OFFSET}),
       {_ZONES},
       'Viewing with Ivan Petrov #' || n,
       'Phone +7 900 000-00-00, bring the keys to flat ' || n,
       'Tverskaya ' || (n % 300) || ', apt ' || (n % 97),
       CAST(:base AS timestamptz) - interval '40 days',
       CAST(:base AS timestamptz) - interval '40 days'
  FROM generate_series(CAST(:lo AS int), CAST(:hi AS int)) AS n
"""

# Two reminders per event (offsets 60 and 15). ``status_expr`` decides each row's status from
# its due time (``due``) and row number; Sent rows get a sent_at (CHECK constraint).
INSERT_REMINDERS = """
INSERT INTO event_reminders (id, calendar_event_id, offset_minutes, due_at, status, sent_at,
                             created_at, updated_at)
SELECT md5('reminder' || n || '/' || o)::uuid, md5('event' || n)::uuid, o, due, st,
       CASE WHEN st = 'Sent' THEN due + interval '2 seconds' END,
       CAST(:base AS timestamptz) - interval '40 days',
       CAST(:base AS timestamptz) - interval '40 days'
  FROM generate_series(CAST(:lo AS int), CAST(:hi AS int)) AS n
  CROSS JOIN LATERAL (VALUES (60), (15)) AS offs(o)
  CROSS JOIN LATERAL (
      SELECT CAST(:base AS timestamptz) + make_interval(secs => {start}) - make_interval(mins => o) AS due
  ) AS d
  CROSS JOIN LATERAL (SELECT {status} AS st) AS s
"""


def _bind(sql_text: str, params: dict) -> tuple[str, dict]:
    """``:name`` placeholders to psycopg's ``%(name)s``."""
    out = sql_text.replace("%", "%%")
    for key in sorted(params, key=len, reverse=True):
        out = out.replace(f":{key}", f"%({key})s")
    return out, params


def seed_backlog(dsn: str, reminders: int, base, on_progress: Callable[[str], None]) -> float:
    """``reminders`` due Pending rows (two per event), all due within the 2 days before ``base``.

    Event statuses are mixed (live, cancelled, completed), so a drain both sends and skips.
    Returns the seconds spent.
    """
    events = max(reminders // 2, 1)
    started = time.perf_counter()
    # Start times spread over the 2 days before base - 1 h 2 min: both offsets (60, 15) are due.
    span = 2 * 86400
    params = {"base": base, "lo": 1, "hi": events}
    status = "'Pending'"
    start = _START_OFFSET.replace(":span", str(span)).replace(":back", str(span + 3700))
    with psycopg.connect(dsn) as conn:
        ev = INSERT_EVENTS.replace(_START_OFFSET, start)
        conn.execute(*_bind(ev, params))
        rem = INSERT_REMINDERS.format(start=start, status=status)
        conn.execute(*_bind(rem, params))
        conn.commit()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("VACUUM (ANALYZE) calendar_events")
        conn.execute("VACUUM (ANALYZE) event_reminders")
    elapsed = time.perf_counter() - started
    on_progress(f"seeded {events * 2:,} due reminders ({events:,} events) in {elapsed:.1f}s")
    return elapsed


def _schema_objects(conn: psycopg.Connection, tables: tuple[str, ...]) -> tuple[list, list, list]:
    """(drop statements, recreate statements in order, foreign keys) for the tables' keys and indexes."""
    cons = conn.execute(
        """SELECT c.conrelid::regclass::text, c.conname, c.contype, pg_get_constraintdef(c.oid)
             FROM pg_constraint c
            WHERE c.conrelid = ANY(CAST(%s AS regclass[])) AND c.contype IN ('p', 'u', 'f')""",
        (list(tables),),
    ).fetchall()
    idx = conn.execute(
        """SELECT i.indexrelid::regclass::text, pg_get_indexdef(i.indexrelid)
             FROM pg_index i
            WHERE i.indrelid = ANY(CAST(%s AS regclass[]))
              AND NOT EXISTS (SELECT 1 FROM pg_constraint c WHERE c.conindid = i.indexrelid)""",
        (list(tables),),
    ).fetchall()
    drops, creates, fks = [], [], []
    for table, name, kind, definition in cons:
        if kind == "f":
            drops.insert(0, f'ALTER TABLE {table} DROP CONSTRAINT "{name}"')
            fks.append(f'ALTER TABLE {table} ADD CONSTRAINT "{name}" {definition}')
    for table, name, kind, definition in cons:
        if kind != "f":
            drops.append(f'ALTER TABLE {table} DROP CONSTRAINT "{name}"')
            creates.append(f'ALTER TABLE {table} ADD CONSTRAINT "{name}" {definition}')
    for name, definition in idx:
        drops.append(f"DROP INDEX {name}")
        creates.append(definition)
    return drops, creates, fks


def seed_history(
    dsn: str,
    reminders: int,
    due_pending: int,
    base,
    on_progress: Callable[[str], None],
    chunk: int = 1_000_000,
) -> dict:
    """A big ``event_reminders`` (the due-query figure): about ``due_pending`` rows due and Pending.

    Events start within 30 days either side of ``base``. Reminders already due are history (Sent
    for live events, Skipped otherwise) except one in ``k`` rows, left Pending, so about
    ``due_pending`` rows are due; reminders in the future are Pending. The keys and indexes are
    dropped during the load and rebuilt from their own definitions afterwards (faster than
    maintaining them row by row), then everything is VACUUM ANALYZEd.
    """
    events = max(reminders // 2, 1)
    span = 60 * 86400
    start = _START_OFFSET.replace(":span", str(span)).replace(":back", str(span // 2))
    past = reminders / 2  # about half the rows are due at base
    k = max(int(past // max(due_pending, 1)), 1)
    status = f"""CASE WHEN due >= CAST(:base AS timestamptz) THEN 'Pending'
                     WHEN (n + o) % {k} = 0 THEN 'Pending'
                     WHEN {_EVENT_STATUS} IN ('Planned', 'InProgress') THEN 'Sent'
                     ELSE 'Skipped' END"""
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SET maintenance_work_mem = '512MB'")
        conn.execute("SET synchronous_commit = off")
        drops, creates, fks = _schema_objects(conn, ("calendar_events", "event_reminders"))
        for statement in drops:
            conn.execute(statement)
        ev_sql = INSERT_EVENTS.replace(_START_OFFSET, start)
        rem_sql = INSERT_REMINDERS.format(start=start, status=status)
        done = 0
        step = max(chunk // 2, 1)  # events per chunk (two reminders each)
        for lo in range(1, events + 1, step):
            hi = min(lo + step - 1, events)
            params = {"base": base, "lo": lo, "hi": hi}
            with conn.transaction():
                conn.execute(*_bind(ev_sql, params))
                conn.execute(*_bind(rem_sql, params))
            done = hi * 2
            rate = done / (time.perf_counter() - t0)
            on_progress(
                f"due-query data: {done:,}/{events * 2:,} reminders {fmt_rate(rate)} rows/s"
            )
        timings["load_s"] = time.perf_counter() - t0
        t1 = time.perf_counter()
        for statement in creates + fks:
            on_progress(f"due-query data: {statement[:90]}")
            conn.execute(statement)
        timings["index_s"] = time.perf_counter() - t1
        t2 = time.perf_counter()
        on_progress("due-query data: VACUUM ANALYZE")
        conn.execute("VACUUM (ANALYZE) calendar_events")
        conn.execute("VACUUM (ANALYZE) event_reminders")
        timings["vacuum_s"] = time.perf_counter() - t2
        row = conn.execute(
            "SELECT count(*) FROM event_reminders WHERE status = 'Pending' AND due_at < %s", (base,)
        ).fetchone()
        timings["due_pending"] = int(row[0])
        timings["rows"] = int(conn.execute("SELECT count(*) FROM event_reminders").fetchone()[0])
        timings["size_mb"] = int(
            conn.execute("SELECT pg_database_size(current_database())").fetchone()[0] / 2**20
        )
    timings["total_s"] = time.perf_counter() - t0
    return timings
