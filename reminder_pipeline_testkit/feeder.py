"""Reminders falling due within a minute, inserted set-based ahead of it: ``n`` events with one
reminder each (:data:`INSERT_DUE`), due on the whole seconds of the minute or of its first
``spread`` seconds; and while they are pending, a share disturbed (:data:`DISTURB`): 5 % of their
events cancelled (the dispatcher skips them), 5 % of the reminders moved 30 minutes later (no
longer due then). :func:`feed` runs both; a caller that needs both in one transaction (so no tick
sees half of them) runs the two statements itself.

The bursts of ``benchmarks.peak`` and ``benchmarks.shared_db``'s minutes, and the failover test's
burst (``faults/test_failover.py``).
"""

from __future__ import annotations

from datetime import datetime

import psycopg

#: ``n`` events with one reminder each, due on the whole seconds of ``spread`` seconds from ``due``
#: (60: every second of the minute).
INSERT_DUE = """
WITH ev AS (
    INSERT INTO calendar_events (id, tenant_id, owner_user_id, kind, start_at, time_zone)
    SELECT gen_random_uuid(), gen_random_uuid(), gen_random_uuid(), 'Meeting',
           %(due)s + interval '15 minutes' + (g %% %(spread)s) * interval '1 second',
           (ARRAY['Europe/Moscow','Asia/Vladivostok','Europe/Kaliningrad',
                  'Asia/Yekaterinburg','Asia/Novosibirsk'])[1 + g %% 5]
      FROM generate_series(1, %(n)s) AS g
    RETURNING id, start_at
)
INSERT INTO event_reminders (id, calendar_event_id, offset_minutes, due_at, created_at)
SELECT gen_random_uuid(), id, 15, start_at - interval '15 minutes', now() - interval '2 days'
  FROM ev
"""

#: While pending: a share of the rows just inserted have their event cancelled (the dispatcher
#: skips them), another share rescheduled 30 minutes later (their reminder no longer due now).
DISTURB = """
WITH picked AS (
    SELECT r.id AS rid, e.id AS eid, row_number() OVER (ORDER BY r.id) AS k
      FROM event_reminders r JOIN calendar_events e ON e.id = r.calendar_event_id
     WHERE r.status = 'Pending' AND r.due_at >= %(due)s AND r.due_at < %(due)s + interval '1 minute'
),
cancelled AS (
    UPDATE calendar_events e SET status = 'Cancelled'
      FROM picked p WHERE e.id = p.eid AND p.k %% 20 = 0 RETURNING e.id
),
moved AS (
    UPDATE event_reminders r SET due_at = r.due_at + interval '30 minutes'
      FROM picked p WHERE r.id = p.rid AND p.k %% 20 = 1 RETURNING r.id
)
SELECT (SELECT count(*) FROM cancelled), (SELECT count(*) FROM moved)
"""


def feed(dsn: str, due: datetime, n: int, disturb: bool, spread_s: int = 60) -> tuple[int, int]:
    """``n`` reminders due within the minute from ``due`` (spread over its whole seconds, or over
    the first ``spread_s``); optionally cancel/reschedule 5 % each."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(INSERT_DUE, {"due": due, "n": n, "spread": spread_s})
        if not disturb:
            return 0, 0
        row = conn.execute(DISTURB, {"due": due}).fetchone()
        return (int(row[0]), int(row[1])) if row else (0, 0)
