"""Every SQL statement of the operators' use cases, named: poison rows and the trace of a reminder.

None runs in a cycle's hot path: each reads or writes a handful of rows by primary key, by
``ix_event_reminders_calendar_event_id``, ``uq_outbox_reminder_id`` or
``ix_outbox_republishes_reminder_id``. No statement reads an event's title, description or
location (PII).
"""

from __future__ import annotations

from sqlalchemy import text

#: Poison rows (Pending after a failed attempt), oldest due first, on their own index.
LIST_POISON = text(
    """
    SELECT id, calendar_event_id, attempts, last_error, next_attempt_at, due_at
      FROM event_reminders
     WHERE status = 'Pending' AND attempts > 0
     ORDER BY due_at
     LIMIT :limit
    """
)

#: An operator's retry of one row: its back-off ends now (a poison row, or any Pending row with
#: :force).
RETRY_POISON_NOW = text(
    """
    UPDATE event_reminders SET next_attempt_at = NULL, updated_at = now()
     WHERE id = :id AND status = 'Pending' AND (attempts > 0 OR :force)
    RETURNING id
    """
)

#: An operator's skip of one row, recording its writer (:moved_by) and run (a poison row, or any
#: Pending row with :force).
SKIP_POISON = text(
    """
    UPDATE event_reminders
       SET status = 'Skipped', updated_at = now(), moved_by = :moved_by,
           moved_in_run = CAST(:moved_in_run AS text)
     WHERE id = :id AND status = 'Pending' AND (attempts > 0 OR :force)
    RETURNING id
    """
)

#: Why a retry or skip changed nothing: the row's status and attempts.
REMINDER_OPERATOR_STATE = text(
    """
    SELECT status, attempts FROM event_reminders WHERE id = :id
    """
)

#: The poison rows a bulk action's filter takes (each condition applies when given; none: every
#: poison row), oldest due first: what a dry run lists.
SELECT_POISON_BY_FILTER = text(
    """
    SELECT r.id, r.calendar_event_id, r.attempts, r.last_failed_at, r.next_attempt_at, r.due_at
      FROM event_reminders r
      JOIN calendar_events e ON e.id = r.calendar_event_id
     WHERE r.status = 'Pending' AND r.attempts > 0
       AND (CAST(:event_id AS uuid) IS NULL OR r.calendar_event_id = CAST(:event_id AS uuid))
       AND (CAST(:kind AS text) IS NULL OR e.kind = CAST(:kind AS text))
       AND (CAST(:failed_since AS timestamptz) IS NULL
            OR r.last_failed_at >= CAST(:failed_since AS timestamptz))
     ORDER BY r.due_at, r.id
    """
)

#: A bulk retry: the filter's poison rows, re-checked under their row locks, back off no more.
RETRY_POISON_BY_FILTER = text(
    """
    UPDATE event_reminders t SET next_attempt_at = NULL, updated_at = now()
     WHERE t.id IN (
            SELECT r.id
              FROM event_reminders r
              JOIN calendar_events e ON e.id = r.calendar_event_id
             WHERE r.status = 'Pending' AND r.attempts > 0
               AND (CAST(:event_id AS uuid) IS NULL
                    OR r.calendar_event_id = CAST(:event_id AS uuid))
               AND (CAST(:kind AS text) IS NULL OR e.kind = CAST(:kind AS text))
               AND (CAST(:failed_since AS timestamptz) IS NULL
                    OR r.last_failed_at >= CAST(:failed_since AS timestamptz)))
       AND t.status = 'Pending' AND t.attempts > 0
    RETURNING t.id
    """
)

#: A bulk skip: the filter's poison rows, re-checked under their row locks, Skipped with their
#: writer and run.
SKIP_POISON_BY_FILTER = text(
    """
    UPDATE event_reminders t
       SET status = 'Skipped', updated_at = now(), moved_by = :moved_by,
           moved_in_run = CAST(:moved_in_run AS text)
     WHERE t.id IN (
            SELECT r.id
              FROM event_reminders r
              JOIN calendar_events e ON e.id = r.calendar_event_id
             WHERE r.status = 'Pending' AND r.attempts > 0
               AND (CAST(:event_id AS uuid) IS NULL
                    OR r.calendar_event_id = CAST(:event_id AS uuid))
               AND (CAST(:kind AS text) IS NULL OR e.kind = CAST(:kind AS text))
               AND (CAST(:failed_since AS timestamptz) IS NULL
                    OR r.last_failed_at >= CAST(:failed_since AS timestamptz)))
       AND t.status = 'Pending' AND t.attempts > 0
    RETURNING t.id
    """
)

#: The trace of these reminders (:ids) and of every reminder of the event :event_id (NULL: none):
#: the row and who moved it, its event's kind, status and people, its outbox row and where it
#: landed, the run that wrote it, the database's clock; due order. Ids, times, statuses and counts
#: only.
TRACE_REMINDERS = text(
    """
    SELECT r.id AS reminder_id, r.calendar_event_id AS event_id, e.kind, e.owner_user_id,
           e.client_user_id, e.tenant_id, r.status, r.due_at,
           r.sent_at, r.created_at, r.updated_at, r.attempts, r.last_error, r.last_failed_at,
           r.next_attempt_at, r.reserved_by, r.reserved_until, r.moved_by, r.moved_in_run,
           e.status AS event_status,
           o.id AS outbox_id, o.created_at AS outbox_created_at, o.published_at,
           o.publish_attempts AS failed_publish_attempts, o.kafka_partition AS partition,
           o.kafka_offset AS offset, o.topic,
           COALESCE(o.headers ->> 'correlation-id', r.moved_in_run) AS run_id,
           clock_timestamp() AS checked_at
      FROM event_reminders r
      JOIN calendar_events e ON e.id = r.calendar_event_id
      LEFT JOIN outbox o ON o.reminder_id = r.id
     WHERE r.id = ANY(CAST(:ids AS uuid[])) OR r.calendar_event_id = CAST(:event_id AS uuid)
     ORDER BY r.due_at, r.id
    """
)

#: The outbox rows of these ReminderIds whose reminder row is gone (its message outlives it), with
#: its event's status if the event is still there; from the payload only its ids and kind.
TRACE_OUTBOX_ONLY = text(
    """
    SELECT o.reminder_id, o.payload ->> 'EventId' AS event_id, o.payload ->> 'Kind' AS kind,
           o.payload ->> 'OwnerUserId' AS owner_user_id,
           o.payload ->> 'ClientUserId' AS client_user_id,
           o.payload ->> 'TenantId' AS tenant_id, o.due_at, e.status AS event_status,
           o.id AS outbox_id,
           o.created_at AS outbox_created_at, o.published_at,
           o.publish_attempts AS failed_publish_attempts, o.kafka_partition AS partition,
           o.kafka_offset AS offset, o.topic, o.headers ->> 'correlation-id' AS run_id,
           clock_timestamp() AS checked_at
      FROM outbox o
      LEFT JOIN calendar_events e ON e.id = CAST(o.message_key AS uuid)
     WHERE o.reminder_id = ANY(CAST(:ids AS uuid[]))
       AND NOT EXISTS (SELECT 1 FROM event_reminders r WHERE r.id = o.reminder_id)
    """
)

#: Every re-publish of these reminders (the back-fill's records), oldest first.
REPUBLISHES_OF = text(
    """
    SELECT reminder_id, run_id, republished_at, kafka_partition AS partition,
           kafka_offset AS offset
      FROM outbox_republishes
     WHERE reminder_id = ANY(CAST(:ids AS uuid[]))
     ORDER BY id
    """
)

#: The re-publish back-fill's record of a chunk it delivered: one row per message.
RECORD_REPUBLISHES = text(
    """
    INSERT INTO outbox_republishes (reminder_id, outbox_id, run_id, kafka_partition, kafka_offset)
    SELECT o.reminder_id, d.outbox_id, :run_id, d.kafka_partition, d.kafka_offset
      FROM unnest(CAST(:outbox_ids AS bigint[]), CAST(:partitions AS int[]),
                  CAST(:offsets AS bigint[])) AS d(outbox_id, kafka_partition, kafka_offset)
      LEFT JOIN outbox o ON o.id = d.outbox_id
    """
)
