"""Every SQL statement of the outbox, named: the relay and its lock, the outbox's lag, its
retention and the re-publish back-fill (the due path's statements are in :mod:`.queries`).

Bind parameters only, no values formatted in. The relay reads the partial index of unpublished
ids from its low-water mark, never from the index's oldest end (docs/design.md, "A database it
shares: where a scan starts").
"""

from __future__ import annotations

from sqlalchemy import bindparam, text
from sqlalchemy.dialects.postgresql import JSONB

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

# The snapshot a relay statement read on, as two transaction ids (xid8 as bigint): its xmin (every
# transaction older than it had ended) and its xmax (every transaction from it on was still to
# begin). The relay's low-water mark moves on what they prove (messaging/low_water.py).
_SNAPSHOT = """
    CAST(CAST(pg_snapshot_xmin(pg_current_snapshot()) AS text) AS bigint) AS snapshot_xmin,
    CAST(CAST(pg_snapshot_xmax(pg_current_snapshot()) AS text) AS bigint) AS snapshot_xmax
"""

# The oldest unpublished rows from the relay's low-water mark (:low) on, up to :up_to (a drain's
# relay publishes what was there when it started from the outbox, and the drain's own rows as they
# are handed over; NULL: no bound), in id order. The partial index of unpublished ids is read from
# :low, never from its oldest end, where a long snapshot keeps the entries of every row published
# since it began. A read, not a write: the relay's advisory lock makes it the only publisher, and
# an UPDATE here would write every outbox row once more per hand-over. Each row carries the
# statement's snapshot and the newest id it could see; when nothing is unpublished, one row of
# NULLs carries them.
SELECT_UNPUBLISHED = text(
    f"""
    SELECT o.id, o.topic, o.message_key, o.payload, o.headers, s.snapshot_xmin, s.snapshot_xmax,
           s.newest_id
      FROM (SELECT {_SNAPSHOT}, (SELECT max(id) FROM outbox) AS newest_id) AS s
      LEFT JOIN LATERAL (
            SELECT id, topic, message_key, CAST(payload AS text) AS payload, headers
              FROM outbox
             WHERE published_at IS NULL
               AND id >= :low
               AND (CAST(:up_to AS bigint) IS NULL OR id <= CAST(:up_to AS bigint))
             ORDER BY id
             LIMIT :limit
      ) AS o ON true
     ORDER BY o.id
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

# The first row from the relay's low-water mark (:low) up to :id (excluded) still unpublished, NULL
# when there is none (a drain's relay then publishes its handed-over rows; otherwise it reads the
# older ones from the outbox first: id order on the topic), with the statement's snapshot.
FIRST_UNPUBLISHED_BEFORE = text(
    f"""
    SELECT (SELECT min(id) FROM outbox
             WHERE published_at IS NULL AND id >= :low AND id < :id) AS first_id,
           {_SNAPSHOT}
    """
)

# The relay's low-water mark: every outbox row with a smaller id is published or was never
# committed (0 before the first relay wrote one).
RELAY_LOW_WATER = text("SELECT coalesce(max(low_water), 0) AS low_water FROM outbox_relay_position")

# Written by the relay holding the lock, at the end of its pass (one writer at a time).
SET_RELAY_LOW_WATER = text(
    """
    INSERT INTO outbox_relay_position AS p (id, low_water, updated_at)
    VALUES (1, :low_water, now())
    ON CONFLICT (id) DO UPDATE
       SET low_water = greatest(p.low_water, EXCLUDED.low_water), updated_at = now()
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

# The relay's lag: unpublished rows and the age of the oldest, read from the relay's low-water
# mark (every row below it is published), so a long snapshot's dead entries below it are not read.
OUTBOX_LAG = text(
    """
    SELECT count(*) AS unpublished,
           EXTRACT(EPOCH FROM (now() - min(created_at))) AS oldest_unpublished_age_seconds
      FROM outbox
     WHERE published_at IS NULL
       AND id >= (SELECT coalesce(max(low_water), 0) FROM outbox_relay_position)
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
