"""Every SQL statement of the dispatcher, named. Bind parameters only; no string formatting of values.

The hot statements are written for the plans measured in ``shared/POSTGRES-NOTES.md``: the due
query walks the partial index ``ix_event_reminders_status_due_at`` in ``due_at`` order and stops
after ``LIMIT`` locked rows; batches of ids are passed as arrays (``= ANY``/``unnest``) so the
planner keeps primary-key index scans instead of hash joins.
"""

from __future__ import annotations

from sqlalchemy import text

# Columns of a due row plus the payload fields of its event. Title, description and location
# are deliberately absent: the dispatcher never reads PII. Ids come back as their canonical text
# (what the payload, the logs and the outbox need): a uuid.UUID per id, made by the driver and
# turned back into text for the message, was ~1 ms of every 200-row due query and ~10 ms of
# every 1,000-row catch-up batch (benchmarks/README.md). Out-of-range timestamps (far
# past/future values that Python's datetime cannot hold) come back NULL, so one odd row
# becomes a poison row instead of failing the whole batch on fetch.
_DUE_COLUMNS = """
    CAST(r.id AS text)                AS reminder_id,
    CAST(r.calendar_event_id AS text) AS event_id,
    CAST(e.tenant_id AS text)         AS tenant_id,
    CAST(e.owner_user_id AS text)     AS owner_user_id,
    CAST(e.client_user_id AS text)    AS client_user_id,
    CAST(e.appointment_id AS text)    AS appointment_id,
    e.kind,
    e.status            AS event_status,
    CASE WHEN e.start_at >= TIMESTAMPTZ '0001-01-02 00:00Z'
          AND e.start_at <  TIMESTAMPTZ '9999-12-30 00:00Z' THEN e.start_at END AS start_at,
    e.time_zone,
    r.offset_minutes,
    GREATEST(r.due_at, TIMESTAMPTZ '0001-01-02 00:00Z') AS due_at,
    r.attempts
"""

# Step 1 of the seed: Pending, DueAt < AsOf, not backing off after a failure, oldest first,
# at most :batch_size rows, each locked FOR UPDATE; rows locked by another instance (or by an
# event's cancel/reschedule cascade in flight) are skipped without waiting.
SELECT_DUE_FOR_UPDATE_SKIP_LOCKED = text(
    f"""
    SELECT {_DUE_COLUMNS}
      FROM event_reminders r
      JOIN calendar_events e ON e.id = r.calendar_event_id
     WHERE r.status = 'Pending'
       AND r.due_at < :as_of
       AND (r.next_attempt_at IS NULL OR r.next_attempt_at <= :as_of)
     ORDER BY r.due_at
     LIMIT :batch_size
       FOR UPDATE OF r SKIP LOCKED
    """
)

# The writing step's re-read: the candidates again, locked in *this* transaction, still
# Pending and still due. Its result, not the selection's, decides send or skip, so a cancel
# that committed after the selection wins (the seed's "conflict resolved by re-reading").
LOCK_CANDIDATES_SKIP_LOCKED = text(
    f"""
    SELECT {_DUE_COLUMNS}
      FROM event_reminders r
      JOIN calendar_events e ON e.id = r.calendar_event_id
     WHERE r.id = ANY(CAST(:ids AS uuid[]))
       AND r.status = 'Pending'
       AND r.due_at < :as_of
     ORDER BY r.due_at
       FOR UPDATE OF r SKIP LOCKED
    """
)

# Of the given ids, those still Pending that we could not lock: another instance holds them.
COUNT_STILL_PENDING = text(
    """
    SELECT count(*) FROM event_reminders
     WHERE id = ANY(CAST(:ids AS uuid[])) AND status = 'Pending'
    """
)

# Due Pending rows up to the batch's last due_at (the range a selection covers), ours included:
# ours are locked by this transaction and still Pending, so count - len(ours) are the rows another
# instance holds right now (skipped_locked). Counting without an "id <> ALL(ours)" filter keeps it
# linear in the range instead of range x batch comparisons.
COUNT_DUE_UP_TO = text(
    """
    SELECT count(*) FROM event_reminders
     WHERE status = 'Pending'
       AND due_at < :as_of
       AND due_at <= :upper
       AND (next_attempt_at IS NULL OR next_attempt_at <= :as_of)
    """
)

# Step 4 of the seed in one statement: every decided row moves Pending -> Sent/Skipped, and
# each row that became Sent gets exactly one outbox row (its id and stored payload come back, so
# a drain's relay can publish it without reading it again). The batch arrives as one jsonb array
# (one orjson dump per batch; five text[] parameters cost a regex escape per payload quote). The
# outbox insert is fed from the UPDATE's RETURNING, so a row that was no longer Pending produces
# no message, and the unique index on outbox.reminder_id makes a second message for a reminder
# impossible (INV-REM-2).
APPLY_TRANSITIONS = text(
    """
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
               next_attempt_at = NULL,
               reserved_by = NULL,
               reserved_until = NULL
          FROM decided d
         WHERE r.id = d.id AND r.status = 'Pending'
        RETURNING r.id, r.status, r.sent_at, r.due_at
    ),
    published AS (
        INSERT INTO outbox (topic, message_key, payload, headers, reminder_id, due_at)
        SELECT :topic, d.message_key, d.payload, d.headers, m.id, m.due_at
          FROM moved m JOIN decided d ON d.id = m.id
         WHERE m.status = 'Sent'
         ORDER BY m.due_at
        RETURNING id, reminder_id, CAST(payload AS text) AS payload
    )
    SELECT CAST(m.id AS text) AS id, m.status,
           CAST(EXTRACT(EPOCH FROM (m.sent_at - m.due_at)) AS float8) AS lateness_seconds,
           p.id AS outbox_id, p.payload
      FROM moved m
      LEFT JOIN published p ON p.reminder_id = m.id
    """
)

# A poison row stays Pending (the seed) but backs off exponentially, so a head of poison rows
# can never starve the healthy rows behind it: 30 s, 60 s, 120 s, ... capped at :cap_seconds.
RECORD_POISON = text(
    """
    UPDATE event_reminders r
       SET attempts = r.attempts + 1,
           last_error = p.error,
           next_attempt_at = CAST(:now AS timestamptz)
               + make_interval(secs => LEAST(:cap_seconds, :base_seconds * power(2, LEAST(r.attempts, 20)))),
           reserved_by = NULL,
           reserved_until = NULL,
           updated_at = now()
      FROM unnest(CAST(:ids AS uuid[]), CAST(:errors AS text[])) AS p(id, error)
     WHERE r.id = p.id AND r.status = 'Pending'
    """
)

# Backlog: due Pending rows not yet processed, and the age of the oldest one.
BACKLOG = text(
    """
    SELECT count(*) AS backlog,
           EXTRACT(EPOCH FROM (:as_of - min(due_at))) AS oldest_due_age_seconds
      FROM event_reminders
     WHERE status = 'Pending' AND due_at < :as_of
    """
)

# Poison rows an operator looks at: still Pending after at least one failed attempt.
LIST_POISON = text(
    """
    SELECT id, calendar_event_id, attempts, last_error, next_attempt_at, due_at
      FROM event_reminders
     WHERE status = 'Pending' AND attempts > 0
     ORDER BY due_at
     LIMIT :limit
    """
)

# An operator's retry / skip changes a row only while it is Pending and has failed at least once
# (a poison row), unless forced: a mistyped id can never skip a healthy reminder before it is sent.
RETRY_POISON_NOW = text(
    """
    UPDATE event_reminders SET next_attempt_at = NULL, updated_at = now()
     WHERE id = :id AND status = 'Pending' AND (attempts > 0 OR :force)
    RETURNING id
    """
)

SKIP_POISON = text(
    """
    UPDATE event_reminders SET status = 'Skipped', updated_at = now()
     WHERE id = :id AND status = 'Pending' AND (attempts > 0 OR :force)
    RETURNING id
    """
)

# Why a retry / skip changed nothing: the row's status and attempts (no event fields, no PII).
REMINDER_OPERATOR_STATE = text(
    """
    SELECT status, attempts FROM event_reminders WHERE id = :id
    """
)

# The relay, run by one publisher at a time per database (session advisory lock): per-key
# order on the topic needs a single writer, and the lock is held on a connection with no open
# transaction, so a slow broker never keeps a snapshot open (which would stall vacuum).
RELAY_LOCK_KEY = 7263002
TRY_RELAY_LOCK = text("SELECT pg_try_advisory_lock(:key)")
RELAY_LOCK = text("SELECT pg_advisory_lock(:key)")
RELAY_UNLOCK = text("SELECT pg_advisory_unlock(:key)")

# The oldest unpublished rows, in id order. A read, not a write: the relay's advisory lock makes
# it the only publisher, and an UPDATE here would write every outbox row once more per hand-over.
SELECT_UNPUBLISHED = text(
    """
    SELECT id, topic, message_key, CAST(payload AS text) AS payload, headers
      FROM outbox
     WHERE published_at IS NULL
     ORDER BY id
     LIMIT :limit
    """
)

MARK_PUBLISHED = text(
    """
    UPDATE outbox SET published_at = now()
     WHERE id = ANY(CAST(:ids AS bigint[])) AND published_at IS NULL
    """
)

# Is any row older than :id still unpublished? (A drain's relay then reads from the outbox
# instead of publishing its handed-over rows first: id order on the topic.)
HAS_UNPUBLISHED_BEFORE = text(
    """
    SELECT EXISTS (SELECT 1 FROM outbox WHERE published_at IS NULL AND id < :id)
    """
)

# Rows handed to the producer that were not acknowledged (failed, timed out, or held back behind
# a failed row of their key): one more failed attempt each, for operators and the outbox alert.
RECORD_PUBLISH_FAILURES = text(
    """
    UPDATE outbox SET publish_attempts = publish_attempts + 1
     WHERE id = ANY(CAST(:ids AS bigint[])) AND published_at IS NULL
    """
)

OUTBOX_LAG = text(
    """
    SELECT count(*) AS unpublished,
           EXTRACT(EPOCH FROM (now() - min(created_at))) AS oldest_unpublished_age_seconds
      FROM outbox
     WHERE published_at IS NULL
    """
)

# Retention: published rows older than the retention, a small batch per transaction so the
# purge never holds many locks or a long snapshot. Oldest ids first: they are the published ones.
PURGE_PUBLISHED_OUTBOX = text(
    """
    DELETE FROM outbox
     WHERE id IN (
        SELECT id FROM outbox
         WHERE published_at IS NOT NULL AND published_at < now() - make_interval(secs => :retention_seconds)
         ORDER BY id
         LIMIT :limit
           FOR UPDATE SKIP LOCKED
     )
    """
)
