"""Every SQL statement of the outbox, named: the relay and its lock, the outbox's lag, its
retention and the re-publish back-fill (the due path's statements are in :mod:`.queries`).

Bind parameters only, no values formatted in. The relay reads the partial index of unpublished
ids from its low-water mark, never from the index's oldest end (docs/design.md, "A database it
shares: where a scan starts").
"""

from __future__ import annotations

from sqlalchemy import bindparam, text
from sqlalchemy.dialects.postgresql import JSONB

#: The relay's session advisory lock: one publisher per database (each key in outbox order).
RELAY_LOCK_KEY = 7263002
#: Take the relay's lock if it is free.
TRY_RELAY_LOCK = text("SELECT pg_try_advisory_lock(:key)")
#: Wait for the relay's lock (under the caller's lock_timeout).
RELAY_LOCK = text("SELECT pg_advisory_lock(:key)")
#: Let go of the relay's lock.
RELAY_UNLOCK = text("SELECT pg_advisory_unlock(:key)")

#: Bound the relay's lock session (the server ends it after :idle without a statement) and name it
#: after the run holding it (docs/design.md, "The relay's lock").
RELAY_SESSION_BOUND = text(
    """
    SELECT set_config('idle_session_timeout', :idle, false),
           set_config('application_name',
                      left(current_setting('application_name') || ' relay ' || :who, 63), false)
    """
)
#: Put the lock session's settings back before the connection returns to the pool.
RELAY_SESSION_RESET = ("RESET idle_session_timeout", "RESET application_name")
#: The keep-alive a waiting relay runs on its lock session (on the driver's connection).
RELAY_KEEPALIVE = "SELECT 1"

#: Who holds the relay lock (none or one session), what it does and how long it has been silent
#: (idle, or waiting on its client; 0 while it works).
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

#: How many outbox rows in the given id spans (a run's own rows) are still unpublished.
COUNT_UNPUBLISHED_IN_SPANS = text(
    """
    SELECT count(*)
      FROM unnest(CAST(:firsts AS bigint[]), CAST(:lasts AS bigint[])) AS s(first_id, last_id)
      JOIN outbox o ON o.id BETWEEN s.first_id AND s.last_id
     WHERE o.published_at IS NULL
    """
)

#: The oldest unpublished rows from the relay's low-water mark (:low) on, up to :up_to if given,
#: in id order, each with the statement's snapshot and the newest id it saw (one row of NULLs
#: carries those when nothing is unpublished).
SELECT_UNPUBLISHED = text(
    """
    SELECT o.id, o.topic, o.message_key, o.payload, o.headers, s.snapshot_xmin, s.snapshot_xmax,
           s.newest_id
      FROM (SELECT CAST(CAST(pg_snapshot_xmin(pg_current_snapshot()) AS text) AS bigint)
                       AS snapshot_xmin,
                   CAST(CAST(pg_snapshot_xmax(pg_current_snapshot()) AS text) AS bigint)
                       AS snapshot_xmax,
                   (SELECT max(id) FROM outbox) AS newest_id) AS s
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

#: The newest outbox row's id (NULL when the outbox is empty).
LAST_OUTBOX_ID = text("SELECT max(id) FROM outbox")

#: Mark the acknowledged rows published, with where each landed (:landed, id -> [partition,
#: offset]).
MARK_PUBLISHED = text(
    """
    UPDATE outbox
       SET published_at = now(),
           kafka_partition = CAST(:landed -> CAST(id AS text) ->> 0 AS int),
           kafka_offset = CAST(:landed -> CAST(id AS text) ->> 1 AS bigint)
     WHERE id = ANY(CAST(:ids AS bigint[])) AND published_at IS NULL
    """
).bindparams(bindparam("landed", type_=JSONB))

#: The first unpublished row from the relay's low-water mark (:low) up to :id (excluded), NULL when
#: none, with the statement's snapshot.
FIRST_UNPUBLISHED_BEFORE = text(
    """
    SELECT (SELECT min(id) FROM outbox
             WHERE published_at IS NULL AND id >= :low AND id < :id) AS first_id,
           CAST(CAST(pg_snapshot_xmin(pg_current_snapshot()) AS text) AS bigint) AS snapshot_xmin,
           CAST(CAST(pg_snapshot_xmax(pg_current_snapshot()) AS text) AS bigint) AS snapshot_xmax
    """
)

#: The relay's low-water mark (0 before the first relay wrote one).
RELAY_LOW_WATER = text("SELECT coalesce(max(low_water), 0) AS low_water FROM outbox_relay_position")

#: Move the relay's low-water mark up (the lock holder, at the end of its pass; never down).
SET_RELAY_LOW_WATER = text(
    """
    INSERT INTO outbox_relay_position AS p (id, low_water, updated_at)
    VALUES (1, :low_water, now())
    ON CONFLICT (id) DO UPDATE
       SET low_water = greatest(p.low_water, EXCLUDED.low_water), updated_at = now()
    """
)

#: One more failed publish attempt on each row the broker did not acknowledge.
RECORD_PUBLISH_FAILURES = text(
    """
    UPDATE outbox SET publish_attempts = publish_attempts + 1
     WHERE id = ANY(CAST(:ids AS bigint[])) AND published_at IS NULL
    """
)

#: The relay's lag: unpublished rows from the relay's low-water mark on, and the oldest's age.
OUTBOX_LAG = text(
    """
    SELECT count(*) AS unpublished,
           EXTRACT(EPOCH FROM (now() - min(created_at))) AS oldest_unpublished_age_seconds
      FROM outbox
     WHERE published_at IS NULL
       AND id >= (SELECT coalesce(max(low_water), 0) FROM outbox_relay_position)
    """
)

#: Delete up to :limit rows published more than :retention_seconds ago, oldest first, and their
#: re-publish records.
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
        -- their re-publish records go with them
        DELETE FROM outbox_republishes c USING purged p WHERE c.outbox_id = p.id
        RETURNING c.id
    )
    SELECT (SELECT count(*) FROM purged) AS purged, (SELECT count(*) FROM copies) AS copies
    """
)

#: The published id range and counts of the outbox rows due in [:day_start, :day_end).
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

#: The next :limit published rows due in the day after :after_id (up to :last_id), in id order,
#: each with why it no longer holds (NULL when it does: still Sent, its event on at its StartAt).
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

#: How many reminders due in [:day_start, :day_end) are Sent (one outbox row each).
COUNT_SENT_OF_DAY = text(
    """
    SELECT count(*) FROM event_reminders
     WHERE status = 'Sent' AND due_at >= :day_start AND due_at < :day_end
    """
)
