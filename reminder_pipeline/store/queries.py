"""Every SQL statement of a dispatch cycle, named and whole (paste any into psql as it stands;
the EXPLAIN tests run these texts): the due rows' selection and reservation, the one write of a
batch, the poison rows' back-off, the scan's floor, the backlog. Bind parameters only, no values
formatted in. Why each is shaped as it is: docs/design.md ("One route for a batch", "A database it
shares: where a scan starts"); the plans they keep: benchmarks/README.md. The outbox's statements
are in :mod:`.outbox_queries`.

A due row is read with the fields of its event the message needs, never the event's title,
description or location (PII), each column named after its field of
:class:`~reminder_pipeline.domain.model.DueReminder`: ids as their canonical text, a ``start_at``
out of Python's range as NULL (the row is then poison, not a failed fetch), ``due_at`` clamped
into it (the raw one orders the rows).
"""

from __future__ import annotations

from sqlalchemy import text

#: Lock and read a batch: poison rows due again behind the scan's start (the poison index), then
#: the due rows from its start on, oldest first, at most :batch_size, skipping rows held elsewhere
#: (counted), with where the next batch starts.
SELECT_DUE_FOR_UPDATE_SKIP_LOCKED = text(
    """
    WITH retried AS (
        SELECT r.id, r.calendar_event_id, r.offset_minutes, r.due_at, r.attempts
          FROM event_reminders r
         WHERE r.status = 'Pending' AND r.attempts > 0
           AND r.due_at < :as_of
           AND (r.next_attempt_at IS NULL OR r.next_attempt_at <= :as_of)
           AND (r.due_at, r.id) < (CAST(:from_due_at AS timestamptz), CAST(:from_id AS uuid))
           AND (r.reserved_until IS NULL OR r.reserved_until <= now())
         ORDER BY r.due_at, r.id
         LIMIT :batch_size
           FOR UPDATE OF r SKIP LOCKED
    ),
    ahead AS (
        SELECT r.id, r.calendar_event_id, r.offset_minutes, r.due_at, r.attempts
          FROM event_reminders r
         WHERE r.status = 'Pending'
           AND r.due_at < :as_of
           AND (r.next_attempt_at IS NULL OR r.next_attempt_at <= :as_of)
           AND (r.due_at, r.id) >= (CAST(:from_due_at AS timestamptz), CAST(:from_id AS uuid))
           AND (r.reserved_until IS NULL OR r.reserved_until <= now())
         ORDER BY r.due_at, r.id
         LIMIT :batch_size - (SELECT count(*) FROM retried)
           FOR UPDATE OF r SKIP LOCKED
    ),
    picked AS (
        SELECT * FROM retried
        UNION ALL
        SELECT * FROM ahead
    ),
    -- the last row of a full batch: rows passed over are counted up to it (all of them when short)
    last_taken AS (
        SELECT due_at, id FROM picked
         WHERE (SELECT count(*) FROM picked) >= :batch_size
         ORDER BY due_at DESC, id DESC
         LIMIT 1
    ),
    bound AS (
        SELECT coalesce((SELECT due_at FROM last_taken), TIMESTAMPTZ 'infinity') AS due_at,
               coalesce((SELECT id FROM last_taken),
                        UUID 'ffffffff-ffff-ffff-ffff-ffffffffffff') AS id
    ),
    -- where the next batch starts: the furthest row taken from the start on
    furthest AS (
        SELECT due_at, id FROM ahead ORDER BY due_at DESC, id DESC LIMIT 1
    ),
    passed AS (
        SELECT (SELECT count(*)
                  FROM event_reminders c
                 WHERE c.status = 'Pending'
                   AND c.due_at < :as_of
                   AND (c.next_attempt_at IS NULL OR c.next_attempt_at <= :as_of)
                   AND (c.due_at, c.id) >= (CAST(:from_due_at AS timestamptz),
                                            CAST(:from_id AS uuid))
                   AND (c.due_at, c.id) <= ((SELECT due_at FROM bound), (SELECT id FROM bound)))
             + (SELECT count(*)
                  FROM event_reminders c
                 WHERE c.status = 'Pending' AND c.attempts > 0
                   AND c.due_at < :as_of
                   AND (c.next_attempt_at IS NULL OR c.next_attempt_at <= :as_of)
                   AND (c.due_at, c.id) < (CAST(:from_due_at AS timestamptz),
                                           CAST(:from_id AS uuid))
                   AND (c.due_at, c.id) <= ((SELECT due_at FROM bound), (SELECT id FROM bound)))
             - (SELECT count(*) FROM picked) AS skipped_locked,
               (SELECT CAST(due_at AS text) FROM furthest) AS next_due_at,
               (SELECT CAST(id AS text) FROM furthest) AS next_id
    )
    SELECT CAST(p.id AS text)                AS reminder_id,
           CAST(p.calendar_event_id AS text) AS event_id,
           CAST(e.tenant_id AS text)         AS tenant_id,
           CAST(e.owner_user_id AS text)     AS owner_user_id,
           CAST(e.client_user_id AS text)    AS client_user_id,
           CAST(e.appointment_id AS text)    AS appointment_id,
           e.kind,
           e.status                          AS event_status,
           CASE WHEN e.start_at >= TIMESTAMPTZ '0001-01-02 00:00Z'
                 AND e.start_at <  TIMESTAMPTZ '9999-12-30 00:00Z' THEN e.start_at END AS start_at,
           e.time_zone,
           p.offset_minutes,
           GREATEST(p.due_at, TIMESTAMPTZ '0001-01-02 00:00Z') AS due_at,
           p.attempts,
           passed.skipped_locked, passed.next_due_at, passed.next_id
      FROM passed
      LEFT JOIN (picked p
                 JOIN calendar_events e
                   ON e.id = p.calendar_event_id
                  AND e.id = ANY (ARRAY(SELECT calendar_event_id FROM picked))) ON true
     ORDER BY p.due_at, p.id
    """
)

#: Step 1 as a Dagster op runs it, in a short transaction of its own: the same rows, reserved for
#: the run (:run_id) for :seconds or until its write commits; ids only, oldest first.
RESERVE_DUE = text(
    """
    WITH retried AS (
        SELECT r.id, r.due_at
          FROM event_reminders r
         WHERE r.status = 'Pending' AND r.attempts > 0
           AND r.due_at < :as_of
           AND (r.next_attempt_at IS NULL OR r.next_attempt_at <= :as_of)
           AND (r.due_at, r.id) < (CAST(:from_due_at AS timestamptz), CAST(:from_id AS uuid))
           AND (r.reserved_until IS NULL OR r.reserved_until <= now())
         ORDER BY r.due_at, r.id
         LIMIT :batch_size
           FOR UPDATE OF r SKIP LOCKED
    ),
    ahead AS (
        SELECT r.id, r.due_at
          FROM event_reminders r
         WHERE r.status = 'Pending'
           AND r.due_at < :as_of
           AND (r.next_attempt_at IS NULL OR r.next_attempt_at <= :as_of)
           AND (r.due_at, r.id) >= (CAST(:from_due_at AS timestamptz), CAST(:from_id AS uuid))
           AND (r.reserved_until IS NULL OR r.reserved_until <= now())
         ORDER BY r.due_at, r.id
         LIMIT :batch_size - (SELECT count(*) FROM retried)
           FOR UPDATE OF r SKIP LOCKED
    ),
    picked AS (
        SELECT * FROM retried
        UNION ALL
        SELECT * FROM ahead
    ),
    reserved AS (
        UPDATE event_reminders r
           SET reserved_by = :run_id,
               reserved_until = now() + make_interval(secs => :seconds)
         WHERE r.id = ANY (ARRAY(SELECT id FROM picked))
        RETURNING r.id
    ),
    last_taken AS (
        SELECT due_at, id FROM picked
         WHERE (SELECT count(*) FROM picked) >= :batch_size
         ORDER BY due_at DESC, id DESC
         LIMIT 1
    ),
    bound AS (
        SELECT coalesce((SELECT due_at FROM last_taken), TIMESTAMPTZ 'infinity') AS due_at,
               coalesce((SELECT id FROM last_taken),
                        UUID 'ffffffff-ffff-ffff-ffff-ffffffffffff') AS id
    ),
    furthest AS (
        SELECT due_at, id FROM ahead ORDER BY due_at DESC, id DESC LIMIT 1
    )
    SELECT (SELECT coalesce(array_agg(CAST(id AS text) ORDER BY due_at, id), ARRAY[]::text[])
              FROM picked) AS ids,
           (SELECT count(*) FROM reserved) AS reserved,
           (SELECT count(*)
              FROM event_reminders c
             WHERE c.status = 'Pending'
               AND c.due_at < :as_of
               AND (c.next_attempt_at IS NULL OR c.next_attempt_at <= :as_of)
               AND (c.due_at, c.id) >= (CAST(:from_due_at AS timestamptz), CAST(:from_id AS uuid))
               AND (c.due_at, c.id) <= ((SELECT due_at FROM bound), (SELECT id FROM bound)))
         + (SELECT count(*)
              FROM event_reminders c
             WHERE c.status = 'Pending' AND c.attempts > 0
               AND c.due_at < :as_of
               AND (c.next_attempt_at IS NULL OR c.next_attempt_at <= :as_of)
               AND (c.due_at, c.id) < (CAST(:from_due_at AS timestamptz), CAST(:from_id AS uuid))
               AND (c.due_at, c.id) <= ((SELECT due_at FROM bound), (SELECT id FROM bound)))
         - (SELECT count(*) FROM picked) AS skipped_locked,
           (SELECT CAST(due_at AS text) FROM furthest) AS next_due_at,
           (SELECT CAST(id AS text) FROM furthest) AS next_id
    """
)

#: The writing step's lock and read: the run's reserved candidates still Pending, due and not
#: another run's (:reserved_by, the run that selected them), oldest first, each with its event.
LOCK_CANDIDATES_SKIP_LOCKED = text(
    """
    WITH picked AS (
        SELECT r.id, r.calendar_event_id, r.offset_minutes, r.due_at, r.attempts
          FROM event_reminders r
         WHERE r.id = ANY(CAST(:ids AS uuid[]))
           AND r.status = 'Pending'
           AND r.due_at < :as_of
           AND (r.reserved_by = :reserved_by
                OR r.reserved_until IS NULL OR r.reserved_until <= now())
         ORDER BY r.due_at, r.id
           FOR UPDATE OF r SKIP LOCKED
    )
    SELECT CAST(p.id AS text)                AS reminder_id,
           CAST(p.calendar_event_id AS text) AS event_id,
           CAST(e.tenant_id AS text)         AS tenant_id,
           CAST(e.owner_user_id AS text)     AS owner_user_id,
           CAST(e.client_user_id AS text)    AS client_user_id,
           CAST(e.appointment_id AS text)    AS appointment_id,
           e.kind,
           e.status                          AS event_status,
           CASE WHEN e.start_at >= TIMESTAMPTZ '0001-01-02 00:00Z'
                 AND e.start_at <  TIMESTAMPTZ '9999-12-30 00:00Z' THEN e.start_at END AS start_at,
           e.time_zone,
           p.offset_minutes,
           GREATEST(p.due_at, TIMESTAMPTZ '0001-01-02 00:00Z') AS due_at,
           p.attempts
      FROM picked p
      JOIN calendar_events e
        ON e.id = p.calendar_event_id
       AND e.id = ANY (ARRAY(SELECT calendar_event_id FROM picked))
     ORDER BY p.due_at, p.id
    """
)

#: Step 2 as a Dagster op runs it: each selected row's event status, read without a lock (a
#: preview: the writing step decides again on what it reads under its lock).
PREVIEW_EVENT_STATUSES = text(
    """
    SELECT CAST(r.id AS text) AS reminder_id, e.status AS event_status
      FROM event_reminders r
      JOIN calendar_events e ON e.id = r.calendar_event_id
     WHERE r.id = ANY(CAST(:ids AS uuid[]))
    """
)

#: Of the given ids, how many are still Pending (those the writing step could not lock: another
#: instance holds them).
COUNT_STILL_PENDING = text(
    """
    SELECT count(*) FROM event_reminders
     WHERE id = ANY(CAST(:ids AS uuid[])) AND status = 'Pending'
    """
)

#: A batch's one write: the verdicts (:verdicts, reminder id -> its message, or null for a skip)
#: moved Pending -> Sent/Skipped with one outbox row per Sent row, each row's writer recorded;
#: one row back per reminder moved (a Sent row's outbox id and lateness).
WRITE_VERDICTS = text(
    """
    WITH verdict AS (
        SELECT CAST(v.key AS uuid) AS id, jsonb_typeof(v.value) = 'object' AS send,
               v.value AS payload
          FROM jsonb_each(CAST(:verdicts AS jsonb)) AS v
    ),
    -- SentAt: the database's clock (:now pins it in tests), never before AsOf, one per batch
    clock AS (
        SELECT GREATEST(COALESCE(CAST(:now AS timestamptz), now()),
                        CAST(:as_of AS timestamptz)) AS sent_at
    ),
    moved AS (
        UPDATE event_reminders r
           SET status = CASE WHEN v.send THEN 'Sent' ELSE 'Skipped' END,
               sent_at = CASE WHEN v.send THEN (SELECT sent_at FROM clock) END,
               updated_at = now(),
               last_error = NULL,
               next_attempt_at = NULL,
               reserved_by = NULL,
               reserved_until = NULL,
               moved_by = :moved_by,
               moved_in_run = :moved_in_run
          FROM verdict v
         WHERE r.id = ANY(ARRAY(SELECT id FROM verdict))
           AND v.id = r.id
           AND r.status = 'Pending'
        RETURNING r.id, r.status, r.due_at, v.payload
    ),
    -- fed from the UPDATE's RETURNING: a row no longer Pending gets no message
    published AS (
        INSERT INTO outbox (topic, message_key, payload, headers, reminder_id, due_at)
        SELECT :topic, m.payload ->> 'EventId', m.payload,
               jsonb_set(CAST(:headers AS jsonb), '{reminder-id}',
                         to_jsonb(CAST(m.id AS text))),
               m.id, m.due_at
          FROM moved m
         WHERE m.status = 'Sent'
         ORDER BY m.due_at, m.id
        RETURNING id, reminder_id, due_at
    )
    SELECT CAST(o.reminder_id AS text) AS reminder_id, 'Sent' AS status, o.id AS outbox_id,
           CASE WHEN isfinite(o.due_at)
                THEN CAST(EXTRACT(EPOCH FROM ((SELECT sent_at FROM clock) - o.due_at)) AS float8)
           END AS lateness_seconds
      FROM published o
    UNION ALL
    SELECT CAST(m.id AS text), m.status, NULL, NULL
      FROM moved m
     WHERE m.status <> 'Sent'
    """
)

#: The savepoint a batch's write runs in (a refusal for a row's data goes back to it; the
#: transaction's COMMIT ends it).
SET_BATCH_SAVEPOINT = "SAVEPOINT batch_write"
#: Back to that savepoint after a refused write.
ROLL_BACK_TO_BATCH_SAVEPOINT = "ROLLBACK TO SAVEPOINT batch_write"

#: A failed attempt on each poison row: kept Pending, its error recorded, backed off 30 s, 60 s,
#: 120 s, ... up to :cap_seconds from the database's clock (:now pins it in tests).
RECORD_POISON = text(
    """
    UPDATE event_reminders r
       SET attempts = r.attempts + 1,
           last_error = p.error,
           next_attempt_at = COALESCE(CAST(:now AS timestamptz), now())
               + make_interval(secs => LEAST(:cap_seconds,
                                             :base_seconds * power(2, LEAST(r.attempts, 20)))),
           last_failed_at = COALESCE(CAST(:now AS timestamptz), now()),
           reserved_by = NULL,
           reserved_until = NULL,
           updated_at = now()
      FROM unnest(CAST(:ids AS uuid[]), CAST(:errors AS text[])) AS p(id, error)
     WHERE r.id = p.id AND r.status = 'Pending'
    """
)

#: The database server's clock now (clock_timestamp(): the moment of the call, in any
#: transaction): a cycle's one clock.
DATABASE_CLOCK = text("SELECT clock_timestamp()")

#: The due scan's floor (one row; none before the first cycle), the transactions begun since it was
#: written and the seconds since the last full sweep.
DUE_SCAN_POSITION = text(
    """
    SELECT CAST(p.due_at AS text) AS due_at, CAST(p.reminder_id AS text) AS reminder_id,
           CAST(CAST(pg_snapshot_xmax(pg_current_snapshot()) AS text) AS bigint) - p.next_xid
               AS xids_since,
           EXTRACT(EPOCH FROM (now() - p.swept_at)) AS seconds_since_sweep
      FROM due_scan_position p
     WHERE p.id = 1
    """
)

#: The floor a cycle leaves for the next, with the next transaction id now and, after a full
#: sweep (:swept), when it swept (the last writer's row).
SET_DUE_SCAN_POSITION = text(
    """
    INSERT INTO due_scan_position AS p (id, due_at, reminder_id, next_xid, swept_at, updated_at)
    VALUES (1, CAST(:due_at AS timestamptz), CAST(:reminder_id AS uuid),
            CAST(CAST(pg_snapshot_xmax(pg_current_snapshot()) AS text) AS bigint),
            CASE WHEN :swept THEN now() END, now())
    ON CONFLICT (id) DO UPDATE
       SET due_at = EXCLUDED.due_at, reminder_id = EXCLUDED.reminder_id,
           next_xid = EXCLUDED.next_xid, swept_at = coalesce(EXCLUDED.swept_at, p.swept_at),
           updated_at = EXCLUDED.updated_at
    """
)

#: The first Pending row, not backing off, due before :as_of, at or after a cycle's start (where
#: the next cycle starts when this one passed rows over or stopped with rows still due).
FIRST_PENDING_FROM = text(
    """
    SELECT CAST(r.due_at AS text) AS due_at, CAST(r.id AS text) AS reminder_id
      FROM event_reminders r
     WHERE r.status = 'Pending'
       AND r.due_at < :as_of
       AND (r.next_attempt_at IS NULL OR r.next_attempt_at <= :as_of)
       AND (r.due_at, r.id) >= (CAST(:from_due_at AS timestamptz), CAST(:from_id AS uuid))
     ORDER BY r.due_at, r.id
     LIMIT 1
    """
)

#: Pending rows due before :due_before not yet moved, and the oldest one's age at :as_of: from
#: the due scan's floor on, and the poison rows behind it from their own index.
BACKLOG = text(
    """
    WITH floor AS (
        SELECT coalesce(max(p.due_at), TIMESTAMPTZ '-infinity') AS due_at,
               coalesce(max(CAST(p.reminder_id AS text)),
                        '00000000-0000-0000-0000-000000000000') AS reminder_id
          FROM due_scan_position p
    ),
    due AS (
        SELECT r.due_at
          FROM event_reminders r
         WHERE r.status = 'Pending' AND r.due_at < :due_before
           AND (r.due_at, r.id) >= ((SELECT due_at FROM floor),
                                    (SELECT CAST(reminder_id AS uuid) FROM floor))
        UNION ALL
        SELECT r.due_at
          FROM event_reminders r
         WHERE r.status = 'Pending' AND r.attempts > 0 AND r.due_at < :due_before
           AND (r.due_at, r.id) < ((SELECT due_at FROM floor),
                                   (SELECT CAST(reminder_id AS uuid) FROM floor))
    )
    SELECT count(*) AS backlog,
           EXTRACT(EPOCH FROM (CAST(:as_of AS timestamptz) - min(due_at)))
               AS oldest_due_age_seconds
      FROM due
    """
)
