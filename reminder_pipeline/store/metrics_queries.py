"""Every SQL statement of the metrics ledger, named: writes, roll-up, scrape and checks.

The ledger is small (a row per cycle, ~1,440 a day per dispatcher) and never touched by the
dispatch transaction. Reads are bounded: the detail table keeps only recent rows (older ones are
rolled up into the single ``dispatch_metric_totals`` row), and the time-window reads walk
``ix_dispatch_cycles_finished_at``.
"""

from __future__ import annotations

from sqlalchemy import text

#: One roll-up at a time per database (a writer that finds it taken leaves it to the next).
ROLL_UP_LOCK_KEY = 7263003
#: Take the roll-up's lock for this transaction if it is free.
TRY_ROLL_UP_LOCK = text("SELECT pg_try_advisory_xact_lock(:key)")

#: Bound this transaction's statements and lock waits (the ledger is a side channel).
SET_LOCAL_TIMEOUTS = text(
    "SELECT set_config('statement_timeout', :statement_ms, true), "
    "set_config('lock_timeout', :lock_ms, true)"
)

#: One cycle's row, stamped with the database's clock: finished now, started the host's
#: measured duration before.
INSERT_CYCLE = text(
    """
    INSERT INTO dispatch_cycles (
        run_id, started_at, finished_at, as_of, succeeded,
        sent, skipped, skipped_locked, failed, published, publish_failed, batches,
        time_zone_fallbacks,
        duration_seconds, duration_buckets, lateness_sum, lateness_count, lateness_buckets,
        error_kind, clock_skew_seconds
    )
    SELECT :run_id, clock.now - make_interval(secs => CAST(:duration_seconds AS float8)),
           clock.now, :as_of, :succeeded,
           :sent, :skipped, :skipped_locked, :failed, :published, :publish_failed, :batches,
           :time_zone_fallbacks,
           :duration_seconds, CAST(:duration_buckets AS bigint[]), :lateness_sum, :lateness_count,
           CAST(:lateness_buckets AS bigint[]), :error_kind, :clock_skew_seconds
      FROM (SELECT clock_timestamp() AS now) AS clock
    RETURNING finished_at
    """
)

#: Take up to :limit detail rows finished over :retention_seconds ago (the database's clock)
#: out, returning what the totals row sums (in the same transaction).
DELETE_ROLL_UP_CANDIDATES = text(
    """
    DELETE FROM dispatch_cycles c
     WHERE c.id = ANY(ARRAY(
            SELECT id FROM dispatch_cycles
             WHERE finished_at < now() - make_interval(secs => CAST(:retention_seconds AS float8))
             ORDER BY finished_at
             LIMIT :limit))
    RETURNING c.finished_at, c.succeeded,
              c.sent, c.skipped, c.skipped_locked, c.failed, c.published, c.publish_failed,
              c.time_zone_fallbacks,
              c.duration_seconds, c.duration_buckets,
              c.lateness_sum, c.lateness_count, c.lateness_buckets
    """
)

#: The totals row, locked for the roll-up.
SELECT_TOTALS_FOR_UPDATE = text("SELECT * FROM dispatch_metric_totals WHERE id = 1 FOR UPDATE")
#: The totals row (the scrape).
SELECT_TOTALS = text("SELECT * FROM dispatch_metric_totals WHERE id = 1")

#: Write the totals row's sums.
UPDATE_TOTALS = text(
    """
    UPDATE dispatch_metric_totals
       SET cycles = :cycles,
           cycles_failed = :cycles_failed,
           sent = :sent, skipped = :skipped, skipped_locked = :skipped_locked, failed = :failed,
           published = :published, publish_failed = :publish_failed,
           time_zone_fallbacks = :time_zone_fallbacks,
           duration_sum = :duration_sum,
           duration_buckets = CAST(:duration_buckets AS bigint[]),
           lateness_sum = :lateness_sum,
           lateness_count = :lateness_count,
           lateness_buckets = CAST(:lateness_buckets AS bigint[]),
           last_success_at = :last_success_at,
           rolled_up_until = :rolled_up_until
     WHERE id = 1
    """
)

#: The detail rows' sums (the scrape adds them to the totals row's).
SUM_DETAIL = text(
    """
    SELECT count(*)                                        AS cycles,
           count(*) FILTER (WHERE NOT succeeded)           AS cycles_failed,
           coalesce(sum(sent), 0)                          AS sent,
           coalesce(sum(skipped), 0)                       AS skipped,
           coalesce(sum(skipped_locked), 0)                AS skipped_locked,
           coalesce(sum(failed), 0)                        AS failed,
           coalesce(sum(published), 0)                     AS published,
           coalesce(sum(publish_failed), 0)                AS publish_failed,
           coalesce(sum(time_zone_fallbacks), 0)           AS time_zone_fallbacks,
           coalesce(sum(duration_seconds), 0)              AS duration_sum,
           coalesce(sum(lateness_sum), 0)                  AS lateness_sum,
           coalesce(sum(lateness_count), 0)                AS lateness_count,
           max(finished_at) FILTER (WHERE succeeded)       AS last_success_at
      FROM dispatch_cycles
    """
)

#: The detail rows' histogram buckets summed element by element (1-based index ``i``).
SUM_DETAIL_BUCKETS = text(
    """
    SELECT 'duration' AS histogram, u.i, sum(u.n) AS n
      FROM dispatch_cycles c, unnest(c.duration_buckets) WITH ORDINALITY AS u(n, i)
     GROUP BY u.i
    UNION ALL
    SELECT 'lateness' AS histogram, u.i, sum(u.n) AS n
      FROM dispatch_cycles c, unnest(c.lateness_buckets) WITH ORDINALITY AS u(n, i)
     GROUP BY u.i
    """
)

#: The newest successful cycle, in the detail rows or already rolled up (liveness).
LAST_SUCCESS_AT = text(
    """
    SELECT greatest(
        (SELECT max(finished_at) FROM dispatch_cycles WHERE succeeded),
        (SELECT last_success_at FROM dispatch_metric_totals WHERE id = 1)
    ) AS last_success_at
    """
)

#: Cycles since :since: how many, failed, and with errors (failed, poison items, refused
#: deliveries).
CYCLES_SINCE = text(
    """
    SELECT count(*)                                                          AS cycles,
           count(*) FILTER (WHERE NOT succeeded)                             AS cycles_failed,
           count(*) FILTER (WHERE NOT succeeded OR failed > 0 OR publish_failed > 0)
                                                                             AS cycles_with_errors,
           coalesce(sum(failed), 0)                                          AS failed,
           coalesce(sum(publish_failed), 0)                                  AS publish_failed,
           coalesce(sum(sent), 0)                                            AS sent
      FROM dispatch_cycles
     WHERE finished_at >= :since
    """
)

#: The dispatching hosts' largest clock skew since :since either way, and the cycles started by
#: a host off by more than :threshold seconds.
CLOCK_SKEW_SINCE = text(
    """
    SELECT max(abs(clock_skew_seconds))                                   AS max_abs_skew,
           count(*) FILTER (WHERE abs(clock_skew_seconds) > :threshold)   AS skewed,
           count(clock_skew_seconds)                                      AS measured
      FROM dispatch_cycles
     WHERE finished_at >= :since
    """
)

#: The lateness histogram of the cycles since :since (the SLO check's p95).
LATENESS_BUCKETS_SINCE = text(
    """
    SELECT u.i, sum(u.n) AS n
      FROM dispatch_cycles c, unnest(c.lateness_buckets) WITH ORDINALITY AS u(n, i)
     WHERE c.finished_at >= :since
     GROUP BY u.i
     ORDER BY u.i
    """
)

#: When each cycle with errors since :since finished, newest first (how long errors have gone
#: on without a gap).
ERROR_CYCLE_TIMES_SINCE = text(
    """
    SELECT finished_at
      FROM dispatch_cycles
     WHERE finished_at >= :since AND (NOT succeeded OR failed > 0 OR publish_failed > 0)
     ORDER BY finished_at DESC
    """
)

#: Due poison rows with at least :min_attempts failed attempts, and the oldest one's age, on the
#: poison rows' own index.
POISON_ROWS = text(
    """
    SELECT count(*) AS poison_rows,
           EXTRACT(EPOCH FROM (CAST(:now AS timestamptz) - min(due_at))) AS oldest_due_age_seconds
      FROM event_reminders
     WHERE status = 'Pending' AND attempts > 0 AND due_at < :now AND attempts >= :min_attempts
    """
)

#: Who holds back this database's xmin horizon, oldest first (sessions, walsenders, prepared
#: transactions, replication slots): docs/observability.md says what each role sees.
SNAPSHOT_HOLDERS = text(
    """
    WITH clock AS (SELECT coalesce(CAST(:now AS timestamptz), clock_timestamp()) AS now)
    SELECT h.kind, h.pid, h.application_name, h.client_addr, h.state, h.xact_start,
           h.query_start, h.xmin_age, h.age_seconds
      FROM (
        SELECT CASE WHEN r.pid IS NOT NULL THEN 'walsender' ELSE 'session' END AS kind,
               a.pid, a.application_name, host(a.client_addr) AS client_addr, a.state,
               a.xact_start, a.query_start,
               GREATEST(age(a.backend_xmin), age(a.backend_xid)) AS xmin_age,
               EXTRACT(EPOCH FROM (clock.now - a.xact_start)) AS age_seconds
          FROM clock, pg_stat_activity a
          LEFT JOIN pg_stat_replication r ON r.pid = a.pid
         WHERE (a.backend_xmin IS NOT NULL OR a.backend_xid IS NOT NULL)
           AND a.pid <> pg_backend_pid()
           AND a.usesysid IS NOT NULL
           AND (a.datname = current_database() OR r.pid IS NOT NULL)
        UNION ALL
        SELECT 'prepared transaction', NULL, p.gid, NULL, NULL, p.prepared, NULL,
               age(p.transaction), EXTRACT(EPOCH FROM (clock.now - p.prepared))
          FROM clock, pg_prepared_xacts p
         WHERE p.database = current_database()
        UNION ALL
        SELECT 'replication slot', s.active_pid, s.slot_name, NULL,
               CASE WHEN s.active THEN 'active' ELSE 'inactive' END, NULL, NULL, age(s.xmin), NULL
          FROM pg_replication_slots s
         WHERE s.xmin IS NOT NULL
      ) AS h
     ORDER BY h.xmin_age DESC NULLS LAST, h.age_seconds DESC NULLS LAST
     LIMIT :limit
    """
)

#: The oldest ledger row written after the horizon's xmin was assigned: when the horizon held at
#: the latest, whoever holds it (docs/observability.md).
LEDGER_ROW_AFTER_XMIN = text(
    "SELECT min(finished_at) FROM dispatch_cycles WHERE age(xmin) < :xmin_age"
)

#: The watched indexes' scans, entries read and live rows fetched (cumulative statistics: nothing
#: scanned), and sizes.
INDEX_READS = text(
    """
    SELECT s.indexrelname AS index_name, s.relname AS table_name, s.idx_scan, s.idx_tup_read,
           s.idx_tup_fetch, pg_relation_size(s.indexrelid) AS size_bytes
      FROM pg_stat_user_indexes s
     WHERE s.schemaname = current_schema() AND s.indexrelname = ANY(:names)
     ORDER BY s.indexrelname
    """
)

#: The watched tables' live and dead row versions and when VACUUM last ran on each.
TABLE_DEAD_ROWS = text(
    """
    SELECT relname AS table_name, n_live_tup, n_dead_tup,
           GREATEST(last_vacuum, last_autovacuum) AS last_vacuum_at
      FROM pg_stat_user_tables
     WHERE schemaname = current_schema() AND relname = ANY(:names)
     ORDER BY relname
    """
)

#: The cycle-duration histogram of the cycles since :since (the vacuum_horizon check's slowing).
DURATION_BUCKETS_SINCE = text(
    """
    SELECT u.i, sum(u.n) AS n
      FROM dispatch_cycles c, unnest(c.duration_buckets) WITH ORDINALITY AS u(n, i)
     WHERE c.finished_at >= :since
     GROUP BY u.i
     ORDER BY u.i
    """
)
