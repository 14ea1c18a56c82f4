"""Every SQL statement of the dispatcher, named. Bind parameters only, no values formatted in.

The hot statements are written for the plans measured in ``benchmarks/README.md``: the due query
walks the partial index ``ix_event_reminders_status_due_at`` in ``(due_at, id)`` order and stops
after ``LIMIT`` locked rows (an EXPLAIN test keeps it so); batches of ids are passed as arrays
(``= ANY``/``jsonb``) so the planner keeps primary-key index scans instead of hash joins.
"""

from __future__ import annotations

from sqlalchemy import text

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

# Where a scan starts, in the due index's order (docs/design.md, "Where a scan starts"): the
# position the batch before it reached, or the cycle's start (the floor a cycle leaves behind, or
# the index's oldest end for a full sweep). Text in, so a DueAt out of Python's range (infinity,
# BC) is a position like any other.
_FROM = "(CAST(:from_due_at AS timestamptz), CAST(:from_id AS uuid))"

# The rows of a batch, in the due index's order: poison rows whose back-off ended behind the
# start (``retried``, on the small ix_event_reminders_poison: the scan itself never walks back),
# then the due rows from the start on (``ahead``, on ix_event_reminders_status_due_at, from the
# start, so the entries of every row dispatched before it are never read again, however long a
# snapshot keeps them), at most :batch_size in all, each locked FOR UPDATE SKIP LOCKED. {cols}: the
# columns each CTE reads, {join}: what it joins.
_RETRIED_AND_AHEAD = """
    retried AS (
        SELECT {cols}
          FROM event_reminders r{join}
         WHERE r.status = 'Pending' AND r.attempts > 0
           AND r.due_at < :as_of
           AND (r.next_attempt_at IS NULL OR r.next_attempt_at <= :as_of)
           AND (r.due_at, r.id) < {from_}
           AND {free}
         ORDER BY r.due_at, r.id
         LIMIT :batch_size
           FOR UPDATE OF r SKIP LOCKED
    ),
    ahead AS (
        SELECT {cols}
          FROM event_reminders r{join}
         WHERE {due}
           AND (r.due_at, r.id) >= {from_}
           AND {free}
         ORDER BY r.due_at, r.id
         LIMIT :batch_size - (SELECT count(*) FROM retried)
           FOR UPDATE OF r SKIP LOCKED
    ),
    picked AS (
        SELECT * FROM retried
        UNION ALL
        SELECT * FROM ahead
    ),"""

# skipped_locked: the due rows the scan passed over because another transaction held them (or
# another run had reserved them). The scan walks (due_at, id) in order from its start, so those
# are exactly the due rows from the start up to the last one taken that were not taken (and the
# poison rows due again behind the start, up to it); when the batch came back short, every such
# row not taken (the bound is then past any row). Counted in the same statement, so on the same
# snapshot as the scan: a row another instance held and committed meanwhile still counts. Rows
# cut off by LIMIT (DueAt ties included) are never counted, so a lone dispatcher always reports
# 0; rows behind the start are not counted again (docs/design.md says what that changes). Both
# ranges are bounded by a row of two scalars, so each count walks its index only over the range
# the scan read (an OR of the cases read every due row: a sequential scan of a catch-up's whole
# backlog, ~25 ms of each 1,000-row batch, benchmarks/README.md).
_PASSED_OVER = f"""
    SELECT (SELECT count(*)
              FROM event_reminders c
             WHERE {_DUE.format(r="c")}
               AND (c.due_at, c.id) >= {_FROM}
               AND (c.due_at, c.id) <= (
                       coalesce((SELECT row_due_at FROM last_taken), TIMESTAMPTZ 'infinity'),
                       coalesce((SELECT row_id FROM last_taken),
                                UUID 'ffffffff-ffff-ffff-ffff-ffffffffffff')))
         + (SELECT count(*)
              FROM event_reminders c
             WHERE {_DUE.format(r="c")}
               AND c.attempts > 0
               AND (c.due_at, c.id) < {_FROM}
               AND (c.due_at, c.id) <= (
                       coalesce((SELECT row_due_at FROM last_taken), TIMESTAMPTZ 'infinity'),
                       coalesce((SELECT row_id FROM last_taken),
                                UUID 'ffffffff-ffff-ffff-ffff-ffffffffffff')))
         - (SELECT count(*) FROM picked) AS skipped_locked,
           (SELECT CAST(row_due_at AS text) FROM furthest) AS next_due_at,
           (SELECT CAST(row_id AS text) FROM furthest) AS next_id
"""

# The last row a full batch took (none when the batch came back short): _PASSED_OVER's bound; and
# the furthest row the scan took from its start on: where the next batch starts (at that row: it
# is no longer Pending once the batch commits, so the next scan reads one entry again, not more).
_LAST_TAKEN = """
    last_taken AS (
        SELECT row_due_at, row_id FROM picked
         WHERE (SELECT count(*) FROM picked) >= :batch_size
         ORDER BY row_due_at DESC, row_id DESC
         LIMIT 1
    ),
    furthest AS (
        SELECT row_due_at, row_id FROM ahead
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

# A batch's selection (docs/design.md, "One route for a batch"): due rows, oldest first from the
# scan's start (:from_due_at, :from_id), at most :batch_size, each locked FOR UPDATE and read
# once with its event's payload fields and the payload built from them; rows locked by another
# instance (or by an event's cancel/reschedule cascade in flight) are skipped without waiting,
# and counted. One row per taken reminder (the DueReminder columns, its payload, the count, where
# the next batch starts); when nothing was taken, one row of NULLs carrying the count.
_DUE_PICKED = _RETRIED_AND_AHEAD.format(
    cols=_DUE_COLUMNS + ", r.due_at AS row_due_at, r.id AS row_id",
    join="\n          JOIN calendar_events e ON e.id = r.calendar_event_id",
    due=_DUE.format(r="r"),
    free=_FREE,
    from_=_FROM,
)
SELECT_DUE_FOR_UPDATE_SKIP_LOCKED = text(
    f"""
    WITH {_DUE_PICKED}{_LAST_TAKEN}
    SELECT {_DUE_NAMES.format(t="picked")}, {_PAYLOAD.format(p="picked")},
           passed.skipped_locked, passed.next_due_at, passed.next_id
      FROM ({_PASSED_OVER}) AS passed
      LEFT JOIN picked ON true
     ORDER BY picked.row_due_at, picked.row_id
    """
)

# Step 1 as a Dagster op runs it (its own short transaction, then the write in another): the
# same rows, reserved for the run until its write commits or :seconds pass, so concurrent runs
# and deployments take disjoint batches. Ids only: the writing step reads them under its lock.
_RESERVED_PICKED = _RETRIED_AND_AHEAD.format(
    cols="r.id AS row_id, r.due_at AS row_due_at",
    join="",
    due=_DUE.format(r="r"),
    free=_FREE,
    from_=_FROM,
)
RESERVE_DUE = text(
    f"""
    WITH {_RESERVED_PICKED}
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
           passed.skipped_locked, passed.next_due_at, passed.next_id
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

# Where the due scan starts (docs/design.md, "Where a scan starts"): the floor the last cycle left
# (every Pending row due before it that is no poison row was taken), how many transactions began
# since it was written, and how long ago a cycle last swept the due index from its oldest end.
# No row yet: no floor (the next cycle sweeps).
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

# The floor a cycle leaves for the next (one row, the last writer's: each writer's floor is safe,
# docs/design.md), with the next transaction id now (a snapshot older than that may still see the
# rows dispatched behind the floor) and, after a full sweep, when it swept.
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

# The first Pending row, not backing off, due before :as_of, at or after a cycle's start: where
# the next cycle starts when this one passed rows over (held by another transaction, reserved by
# another run) or stopped with rows still due. It walks the range the cycle itself read, once.
FIRST_PENDING_FROM = text(
    f"""
    SELECT CAST(r.due_at AS text) AS due_at, CAST(r.id AS text) AS reminder_id
      FROM event_reminders r
     WHERE {_DUE.format(r="r")}
       AND (r.due_at, r.id) >= {_FROM}
     ORDER BY r.due_at, r.id
     LIMIT 1
    """
)

# Backlog: Pending rows due before :due_before not yet processed, and the age of the oldest one at
# :as_of (the cycle's backlog: both AsOf; the overdue check's: due before now less 5 minutes, aged
# at now). Counted from the due scan's floor (every row behind it was taken, but poison rows,
# counted from their own index), so its cost does not grow with the rows dispatched behind the
# floor however long a snapshot keeps their entries; with no floor yet, from the oldest end.
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
