"""Every SQL statement of the dispatcher, named. Bind parameters only, no values formatted in.

The hot statements are written for the plans measured in ``benchmarks/README.md``: the due query
walks the partial index ``ix_event_reminders_status_due_at`` in ``(due_at, id)`` order and stops
after ``LIMIT`` locked rows (an EXPLAIN test keeps it so); batches of ids are passed as arrays
(``= ANY``/``jsonb``) so the planner keeps primary-key index scans instead of hash joins.
"""

from __future__ import annotations

from sqlalchemy import bindparam, text
from sqlalchemy.dialects.postgresql import JSONB

# Columns of a due row plus the payload fields of its event. Title, description and location
# are deliberately absent: the dispatcher never reads PII. Ids come back as their canonical text
# (what the payload, the logs and the outbox need), not as a uuid.UUID per id that the payload
# would turn back into text (its cost: benchmarks/README.md). Out-of-range timestamps (far
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

# The rows the due query may take: Pending, due before AsOf, not backing off after a failure.
_DUE = """
       {r}.status = 'Pending'
   AND {r}.due_at < :as_of
   AND ({r}.next_attempt_at IS NULL OR {r}.next_attempt_at <= :as_of)
"""

# ... and not reserved by another Dagster run (a reservation ends with the run's write, or when
# ``reserved_until`` passes: a run that died releases its rows by itself).
_FREE = "(r.reserved_until IS NULL OR r.reserved_until <= now())"

# skipped_locked: the due rows the scan passed over because another transaction held them (or
# another run had reserved them). The scan walks (due_at, id) in order, so those are exactly the
# due rows up to the last one taken that were not taken; when the batch came back short, every
# due row not taken (the bound is then past any row). Counted in the same statement, so on the
# same snapshot as the scan: a row another instance held and committed meanwhile still counts.
# Rows cut off by LIMIT (DueAt ties included) are never counted, so a lone dispatcher always
# reports 0. The bound is a row of two scalars, so the count walks the due index only up to it
# (an OR of the two cases read every due row: a sequential scan of a catch-up's whole backlog,
# ~25 ms of each 1,000-row batch, benchmarks/README.md).
_PASSED_OVER = f"""
    SELECT count(*) - (SELECT count(*) FROM picked) AS skipped_locked
      FROM event_reminders c
     WHERE {_DUE.format(r="c")}
       AND (c.due_at, c.id) <= (
               coalesce((SELECT row_due_at FROM last_taken), TIMESTAMPTZ 'infinity'),
               coalesce((SELECT row_id FROM last_taken),
                        UUID 'ffffffff-ffff-ffff-ffff-ffffffffffff'))
"""

# The last row a full batch took (none when the batch came back short): _PASSED_OVER's bound.
_LAST_TAKEN = """
    last_taken AS (
        SELECT row_due_at, row_id FROM picked
         WHERE (SELECT count(*) FROM picked) >= :batch_size
         ORDER BY row_due_at DESC, row_id DESC
         LIMIT 1
    )"""

# The names of _DUE_COLUMNS, taken from table {t} (the raw due_at that orders rows may be out of
# Python's range, so it is not handed back).
_DUE_NAMES = ", ".join(
    "{t}." + name
    for name in (
        "reminder_id",
        "event_id",
        "tenant_id",
        "owner_user_id",
        "client_user_id",
        "appointment_id",
        "kind",
        "event_status",
        "start_at",
        "time_zone",
        "offset_minutes",
        "due_at",
        "attempts",
    )
)

# The payload of contract v1 built from a locked due row {p} (the _DUE_COLUMNS names): the one
# implementation of the message (the tests' oracle, reminder_pipeline_tests/oracle.py, describes
# it in Python and a property test holds the two equal). Ids as canonical text, StartAt in UTC
# with a Z and microseconds only when present (NULL when out of Python's range: the row is
# poison), OffsetMinutes a number, TimeZone the event's as stored: the cycle decides, from this
# payload, whether it is sent as is, with the fallback zone, or is poison (docs/design.md).
_PAYLOAD = """
    CASE WHEN {p}.reminder_id IS NOT NULL THEN CAST(jsonb_build_object(
        'ReminderId', {p}.reminder_id, 'EventId', {p}.event_id, 'TenantId', {p}.tenant_id,
        'OwnerUserId', {p}.owner_user_id, 'ClientUserId', {p}.client_user_id, 'Kind', {p}.kind,
        'StartAt', to_char({p}.start_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS')
                   || CASE WHEN date_trunc('second', {p}.start_at) = {p}.start_at THEN ''
                           ELSE to_char({p}.start_at AT TIME ZONE 'UTC', '.US') END
                   || 'Z',
        'TimeZone', {p}.time_zone,
        'OffsetMinutes', {p}.offset_minutes,
        'AppointmentId', {p}.appointment_id) AS text) END AS payload
"""

# The due rows a batch takes, with their event's payload fields, each locked (picked), and the
# last of a full batch (last_taken).
_PICKED = f"""
    picked AS (
        SELECT {_DUE_COLUMNS}, r.due_at AS row_due_at, r.id AS row_id
          FROM event_reminders r
          JOIN calendar_events e ON e.id = r.calendar_event_id
         WHERE {_DUE.format(r="r")}
           AND {_FREE}
         ORDER BY r.due_at, r.id
         LIMIT :batch_size
           FOR UPDATE OF r SKIP LOCKED
    ),{_LAST_TAKEN}"""

# A batch's selection (docs/design.md, "One route for a batch"): due rows, oldest first, at most
# :batch_size, each locked FOR UPDATE and read once, with the payload built from it; rows locked
# by another instance (or by an event's cancel/reschedule cascade in flight) are skipped without
# waiting, and counted. One row per taken reminder (the DueReminder columns, its payload, the
# count); when nothing was taken, one row of NULLs carrying the count.
SELECT_DUE_FOR_UPDATE_SKIP_LOCKED = text(
    f"""
    WITH {_PICKED}
    SELECT {_DUE_NAMES.format(t="picked")}, {_PAYLOAD.format(p="picked")},
           passed.skipped_locked
      FROM ({_PASSED_OVER}) AS passed
      LEFT JOIN picked ON true
     ORDER BY picked.row_due_at, picked.row_id
    """
)

# Step 1 as a Dagster op runs it (its own short transaction, then the write in another): the
# same rows, reserved for the run until its write commits or :seconds pass, so concurrent runs
# and deployments take disjoint batches. Ids only: the writing step reads them under its lock.
RESERVE_DUE = text(
    f"""
    WITH picked AS (
        SELECT r.id AS row_id, r.due_at AS row_due_at
          FROM event_reminders r
         WHERE {_DUE.format(r="r")}
           AND {_FREE}
         ORDER BY r.due_at, r.id
         LIMIT :batch_size
           FOR UPDATE OF r SKIP LOCKED
    ),
    reserved AS (
        UPDATE event_reminders r
           SET reserved_by = :run_id,
               reserved_until = now() + make_interval(secs => :seconds)
         WHERE r.id = ANY (ARRAY(SELECT row_id FROM picked))
        RETURNING r.id
    ),{_LAST_TAKEN}
    SELECT (SELECT coalesce(array_agg(CAST(row_id AS text) ORDER BY row_due_at, row_id),
                            ARRAY[]::text[])
              FROM picked) AS ids,
           (SELECT count(*) FROM reserved) AS reserved,
           passed.skipped_locked
      FROM ({_PASSED_OVER}) AS passed
    """
)

# The writing step's lock and read: the candidates, locked in *this* transaction, still
# Pending, still due, and not reserved by another run (:reserved_by is the run that selected
# them; its own reservation does not hold it back), each with its payload. Its result, not the
# selection's, decides send or skip, so a cancel that committed after the selection wins (the
# design's "conflict resolved by re-reading").
LOCK_CANDIDATES_SKIP_LOCKED = text(
    f"""
    WITH picked AS (
        SELECT {_DUE_COLUMNS}, r.due_at AS row_due_at, r.id AS row_id
          FROM event_reminders r
          JOIN calendar_events e ON e.id = r.calendar_event_id
         WHERE r.id = ANY(CAST(:ids AS uuid[]))
           AND r.status = 'Pending'
           AND r.due_at < :as_of
           AND (r.reserved_by = :reserved_by OR {_FREE})
         ORDER BY r.due_at, r.id
           FOR UPDATE OF r SKIP LOCKED
    )
    SELECT {_DUE_NAMES.format(t="picked")}, {_PAYLOAD.format(p="picked")}
      FROM picked
     ORDER BY picked.row_due_at, picked.row_id
    """
)

# Step 2 as a Dagster op runs it: each selected row's event status, read without a lock (the
# cycle decides send or skip on it; a preview: the writing step decides again on what it reads
# under its lock).
PREVIEW_EVENT_STATUSES = text(
    """
    SELECT CAST(r.id AS text) AS reminder_id, e.status AS event_status
      FROM event_reminders r
      JOIN calendar_events e ON e.id = r.calendar_event_id
     WHERE r.id = ANY(CAST(:ids AS uuid[]))
    """
)

# Of the given ids, those still Pending that we could not lock: another instance holds them.
COUNT_STILL_PENDING = text(
    """
    SELECT count(*) FROM event_reminders
     WHERE id = ANY(CAST(:ids AS uuid[])) AND status = 'Pending'
    """
)

# A batch's one write (docs/design.md, "One route for a batch"): the verdicts the cycle gave the
# rows this transaction locked and read (:verdicts, one JSON object: reminder id -> the message of
# a Sent row as checked, or null for a Skipped one; one document the server parses, where an
# array of 1,000 payload texts cost psycopg a regex escape per payload), written as given:
# Pending -> Sent/Skipped, one outbox row per Sent row with that payload, its key the payload's
# EventId, its headers :headers with the row's reminder-id; each moved row records its writer,
# :moved_by and :moved_in_run, for the trace. Nothing is read from the event again: the decision
# was made on what the lock read.
# SentAt is the database's clock (now(): this transaction's start; :now only pins it in tests),
# never before AsOf, so lateness is never negative; one value for the whole batch (``clock``).
# The outbox insert is fed from the UPDATE's RETURNING, so a row that was no longer Pending
# produces no message, and the unique index on outbox.reminder_id makes a second message for a
# reminder impossible (INV-REM-2). It returns one row per reminder that moved, named: a Sent
# row's outbox id and lateness (SentAt - DueAt, the outbox row's DueAt being the reminder's;
# NULL for an infinite DueAt), a Skipped row's status alone. The stored text of a payload comes
# back only for the rows in :restated (the ones the cycle changed, a fallback zone's): every
# other payload is stored as the read returned it, and the text of a jsonb is the same on the
# way back (the cycle hands the relay the text it read; the property test holds the two equal).
# Two row sets, not a join of the two CTEs, whose row estimates of 1 made the planner pick a
# nested loop of 1,000 x 1,000.
WRITE_VERDICTS = text(
    """
    WITH verdict AS (
        SELECT CAST(v.key AS uuid) AS id, jsonb_typeof(v.value) = 'object' AS send,
               v.value AS payload
          FROM jsonb_each(CAST(:verdicts AS jsonb)) AS v
    ),
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
    published AS (
        INSERT INTO outbox (topic, message_key, payload, headers, reminder_id, due_at)
        SELECT :topic, m.payload ->> 'EventId', m.payload,
               jsonb_set(CAST(:headers AS jsonb), '{reminder-id}',
                         to_jsonb(CAST(m.id AS text))),
               m.id, m.due_at
          FROM moved m
         WHERE m.status = 'Sent'
         ORDER BY m.due_at, m.id
        RETURNING id, reminder_id, due_at,
                  CASE WHEN reminder_id = ANY(CAST(:restated AS uuid[]))
                       THEN CAST(payload AS text) END AS payload
    )
    SELECT CAST(o.reminder_id AS text) AS reminder_id, 'Sent' AS status, o.id AS outbox_id,
           CASE WHEN isfinite(o.due_at)
                THEN CAST(EXTRACT(EPOCH FROM ((SELECT sent_at FROM clock) - o.due_at)) AS float8)
           END AS lateness_seconds,
           o.payload
      FROM published o
    UNION ALL
    SELECT CAST(m.id AS text), m.status, NULL, NULL, NULL
      FROM moved m
     WHERE m.status <> 'Sent'
    """
)

# The savepoint a batch's write runs in: when the database refuses the write for a row's data,
# the transaction goes back to it and each row is tried alone (docs/design.md). Set and left set:
# the transaction's COMMIT ends it (one round trip a batch, not a SAVEPOINT and a RELEASE).
SET_BATCH_SAVEPOINT = "SAVEPOINT batch_write"
ROLL_BACK_TO_BATCH_SAVEPOINT = "ROLLBACK TO SAVEPOINT batch_write"

# A poison row stays Pending (docs/design.md) but backs off exponentially, so a head of poison rows
# can never starve the healthy rows behind it: 30 s, 60 s, 120 s, ... capped at :cap_seconds.
# Counted from the database's clock (:now NULL), like the AsOf the back-off is compared with.
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

# The database server's clock: the one clock a cycle reads (AsOf, the future check).
# clock_timestamp(), not now(): the moment of the call, whatever transaction it runs in.
DATABASE_CLOCK = text("SELECT clock_timestamp()")

# Backlog: due Pending rows not yet processed, and the age of the oldest one.
BACKLOG = text(
    """
    SELECT count(*) AS backlog,
           EXTRACT(EPOCH FROM (:as_of - min(due_at))) AS oldest_due_age_seconds
      FROM event_reminders
     WHERE status = 'Pending' AND due_at < :as_of
    """
)

# The relay, run by one publisher at a time per database (session advisory lock): per-key
# order on the topic needs a single writer, and the lock is held on a connection with no open
# transaction, so a slow broker never keeps a snapshot open (which would stall vacuum).
RELAY_LOCK_KEY = 7263002
TRY_RELAY_LOCK = text("SELECT pg_try_advisory_lock(:key)")
RELAY_LOCK = text("SELECT pg_advisory_lock(:key)")
RELAY_UNLOCK = text("SELECT pg_advisory_unlock(:key)")

# The relay's lock session, bounded by the server before it takes the lock: a session with no
# statement for :idle (idle_session_timeout, PostgreSQL >= 14) is ended by the server, and the
# session's advisory lock with it, whatever became of its client (docs/design.md, "The relay's
# lock"). Named after the run holding it, so pg_stat_activity says whose relay holds the lock.
# Session-level settings: RELAY_SESSION_RESET puts them back before the connection is pooled.
RELAY_SESSION_BOUND = text(
    """
    SELECT set_config('idle_session_timeout', :idle, false),
           set_config('application_name',
                      left(current_setting('application_name') || ' relay ' || :who, 63), false)
    """
)
RELAY_SESSION_RESET = ("RESET idle_session_timeout", "RESET application_name")
# What a relay that holds the lock and waits (on the broker, on the drain's next batch) runs on
# its lock session every few seconds: the session is not idle, so the server keeps it. Plain text:
# it runs on the driver's connection, from the relay's keep-alive thread.
RELAY_KEEPALIVE = "SELECT 1"

# Who holds the relay lock in this database (none, or one session): its backend and what it is
# doing. ``silent_seconds``: how long the session has sent nothing the server waits for, i.e. it
# is idle (in a transaction or not), or active but waiting on its client (ClientRead/ClientWrite,
# a peer that does not read); 0 while it works. Without pg_read_all_stats another role's session
# shows its pid only (pg_stat_activity hides the rest).
RELAY_LOCK_HOLDER = text(
    """
    SELECT l.pid, a.application_name, host(a.client_addr) AS client_addr, a.client_port,
           a.backend_start, a.state, a.state_change, a.wait_event_type, a.wait_event,
           a.query_start,
           CASE WHEN a.state LIKE 'idle%' OR a.wait_event_type = 'Client'
                THEN GREATEST(EXTRACT(EPOCH FROM (clock_timestamp() - a.state_change)), 0)
                ELSE 0 END AS silent_seconds,
           EXTRACT(EPOCH FROM (clock_timestamp() - a.state_change)) AS state_seconds
      FROM pg_locks l
      LEFT JOIN pg_stat_activity a ON a.pid = l.pid
     WHERE l.locktype = 'advisory' AND l.granted
       AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
       AND l.classid = CAST(:classid AS oid) AND l.objid = CAST(:objid AS oid) AND l.objsubid = 1
    """
)

# How many of the given outbox rows (id spans, first and last id of each) are still unpublished:
# a run's own rows after its relay, on the partial index of unpublished ids.
COUNT_UNPUBLISHED_IN_SPANS = text(
    """
    SELECT count(*)
      FROM unnest(CAST(:firsts AS bigint[]), CAST(:lasts AS bigint[])) AS s(first_id, last_id)
      JOIN outbox o ON o.id BETWEEN s.first_id AND s.last_id
     WHERE o.published_at IS NULL
    """
)

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

# ... only those up to :up_to (a drain's relay publishes what was there when it started from the
# outbox, and the drain's own rows as they are handed over).
SELECT_UNPUBLISHED_UP_TO = text(
    """
    SELECT id, topic, message_key, CAST(payload AS text) AS payload, headers
      FROM outbox
     WHERE published_at IS NULL AND id <= :up_to
     ORDER BY id
     LIMIT :limit
    """
)

# The newest outbox row's id (NULL when the outbox is empty).
LAST_OUTBOX_ID = text("SELECT max(id) FROM outbox")

# With where each message landed (its delivery report's partition and offset, a JSONB object
# id -> [partition, offset], looked up per row). The rows are found exactly as before, by one
# index scan of the batch's ids: joining the ids to unnest()ed arrays instead made the mark 10-20 %
# slower, and with stale statistics a generic plan joined them in a nested loop (1,000 x 1,000
# rows: 0.5 s a batch). Measured: the mark of 1,000 rows as fast as marking ids alone.
MARK_PUBLISHED = text(
    """
    UPDATE outbox
       SET published_at = now(),
           kafka_partition = CAST(:landed -> CAST(id AS text) ->> 0 AS int),
           kafka_offset = CAST(:landed -> CAST(id AS text) ->> 1 AS bigint)
     WHERE id = ANY(CAST(:ids AS bigint[])) AND published_at IS NULL
    """
).bindparams(bindparam("landed", type_=JSONB))

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
# purge never holds many locks or a long snapshot. Oldest published first, on the partial index
# ix_outbox_published_at: each call reads its batch's entries and stops, and the last call (the
# one that finds nothing old enough) reads a few pages instead of walking the whole outbox.
PURGE_PUBLISHED_OUTBOX = text(
    """
    WITH purged AS (
        DELETE FROM outbox
         WHERE id IN (
            SELECT id FROM outbox
             WHERE published_at IS NOT NULL
               AND published_at < now() - make_interval(secs => :retention_seconds)
             ORDER BY published_at
             LIMIT :limit
               FOR UPDATE SKIP LOCKED
         )
        RETURNING id
    ), copies AS (
        -- The re-publish records of those rows go with them: they describe copies of a
        -- message the outbox no longer holds (issue 35: they outlived their row).
        DELETE FROM outbox_republishes c USING purged p WHERE c.outbox_id = p.id
        RETURNING c.id
    )
    SELECT (SELECT count(*) FROM purged) AS purged, (SELECT count(*) FROM copies) AS copies
    """
)

# --- re-publish back-fill (reminder_pipeline/operator_jobs/republish.py) -----------------------
# A day's already published messages, selected by the reminder's DueAt (outbox.due_at, filled by
# the dispatcher; migration 0003 back-filled older rows). Read only: the back-fill never changes
# an outbox row, and unpublished rows (published_at IS NULL) are the relay's.

# The day's published id range and its unpublished rows, in one walk of ix_outbox_due_at.
REPUBLISH_DAY_BOUNDS = text(
    """
    SELECT min(id) FILTER (WHERE published_at IS NOT NULL) AS first_id,
           max(id) FILTER (WHERE published_at IS NOT NULL) AS last_id,
           count(*) FILTER (WHERE published_at IS NOT NULL) AS published,
           count(*) FILTER (WHERE published_at IS NULL) AS unpublished
      FROM outbox
     WHERE due_at >= :day_start AND due_at < :day_end
    """
)

# The next chunk of the day's published rows after :after_id, in id order (each key's order on
# the topic). Bounded by the day's last id from REPUBLISH_DAY_BOUNDS: the primary key is walked
# from :after_id and the walk stops at :last_id, so a day costs one pass over its id range
# (benchmarks/README.md). Without the bound the planner may pick a bitmap scan of the
# whole day plus a sort for every chunk, quadratic in the day's size.
#
# Each row comes with why it no longer holds (NULL when it does): a message goes out again only
# if its reminder is still Sent and its event still Planned/InProgress with the StartAt the
# message carries. A moved event keeps its Sent rows (only Pending ones are re-created), so a
# StartAt that differs is how a move shows; a deleted event counts as cancelled. Joined by
# primary key per row of the chunk (the outbox walk above stays the plan's driver).
SELECT_PUBLISHED_OF_DAY = text(
    """
    SELECT o.id, o.topic, o.message_key, CAST(o.payload AS text) AS payload, o.headers,
           CAST(o.reminder_id AS text) AS reminder_id, o.payload ->> 'EventId' AS event_id,
           CASE
               WHEN e.id IS NULL OR e.status = 'Cancelled' THEN 'cancelled'
               WHEN e.status = 'Completed' THEN 'completed'
               WHEN e.start_at IS DISTINCT FROM CAST(o.payload ->> 'StartAt' AS timestamptz)
                   THEN 'moved'
               WHEN r.status IS DISTINCT FROM 'Sent' THEN 'reminder_not_sent'
           END AS stale
      FROM outbox o
      LEFT JOIN event_reminders r ON r.id = o.reminder_id
      LEFT JOIN calendar_events e ON e.id = CAST(o.payload ->> 'EventId' AS uuid)
     WHERE o.id > :after_id AND o.id <= :last_id
       AND o.due_at >= :day_start AND o.due_at < :day_end
       AND o.published_at IS NOT NULL
     ORDER BY o.id
     LIMIT :limit
    """
)

# How many reminders due on the day are Sent: each has exactly one outbox row (INV-REM-2), so a
# day with fewer outbox rows lost some to the purge, whatever the retention setting says. No index
# serves it (the due index covers Pending rows only): one scan of event_reminders per day
# re-published, an operator's back-fill, never the cycle.
COUNT_SENT_OF_DAY = text(
    """
    SELECT count(*) FROM event_reminders
     WHERE status = 'Sent' AND due_at >= :day_start AND due_at < :day_end
    """
)
