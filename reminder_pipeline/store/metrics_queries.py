"""Every SQL statement of the metrics ledger, named: writes, roll-up, scrape and checks.

The ledger is small (a row per cycle, ~1,440 a day per dispatcher) and never touched by the
dispatch transaction. Reads are bounded: the detail table keeps only recent rows (older ones are
rolled up into the single ``dispatch_metric_totals`` row), and the time-window reads walk
``ix_dispatch_cycles_finished_at``.
"""

from __future__ import annotations

from sqlalchemy import text

from ..domain.model import LEDGER_COUNTERS, TOTALED_COUNTERS

# One roll-up at a time per database; a writer finding it taken skips it (the next one does it).
ROLL_UP_LOCK_KEY = 7263003
TRY_ROLL_UP_LOCK = text("SELECT pg_try_advisory_xact_lock(:key)")

# Ledger writes and scrapes are side channels: bounded, so they never hold up a cycle or a person.
SET_LOCAL_TIMEOUTS = text(
    "SELECT set_config('statement_timeout', :statement_ms, true), "
    "set_config('lock_timeout', :lock_ms, true)"
)

# The cycle's counters are listed once (domain.model.CycleCounts); the statements below name
# their columns from that list: the ledger's per cycle, the totals row's summed.
_LEDGER = ", ".join(LEDGER_COUNTERS)
_LEDGER_PARAMS = ", ".join(f":{name}" for name in LEDGER_COUNTERS)

# One cycle's row, stamped with the database's clock read once here: ``finished_at`` is now and
# ``started_at`` that less the duration the host measured. A host's clock never gives the ledger
# a moment, so liveness, the windows of the checks and the roll-up all read one clock.
INSERT_CYCLE = text(
    f"""
    INSERT INTO dispatch_cycles (
        run_id, started_at, finished_at, as_of, succeeded, {_LEDGER},
        duration_seconds, duration_buckets, lateness_sum, lateness_count, lateness_buckets,
        error_kind, clock_skew_seconds
    )
    SELECT :run_id, clock.now - make_interval(secs => CAST(:duration_seconds AS float8)),
           clock.now, :as_of, :succeeded, {_LEDGER_PARAMS},
           :duration_seconds, CAST(:duration_buckets AS bigint[]), :lateness_sum, :lateness_count,
           CAST(:lateness_buckets AS bigint[]), :error_kind, :clock_skew_seconds
      FROM (SELECT clock_timestamp() AS now) AS clock
    RETURNING finished_at
    """
)

# Roll-up, step 1: take the oldest detail rows out (bounded per call); their sums go to the
# totals row in the same transaction, so a scrape sees them either here or there, never both.
# The cutoff is the database's clock (the transaction's start) less the retention, never a
# host's: a host whose clock runs ahead would otherwise fold rows newer than the window.
DELETE_ROLL_UP_CANDIDATES = text(
    f"""
    DELETE FROM dispatch_cycles c
     WHERE c.id = ANY(ARRAY(
            SELECT id FROM dispatch_cycles
             WHERE finished_at < now() - make_interval(secs => CAST(:retention_seconds AS float8))
             ORDER BY finished_at
             LIMIT :limit))
    RETURNING c.finished_at, c.succeeded, {", ".join(f"c.{n}" for n in TOTALED_COUNTERS)},
              c.duration_seconds, c.duration_buckets,
              c.lateness_sum, c.lateness_count, c.lateness_buckets
    """
)

# Roll-up, step 2 (and the scrape): the single totals row.
SELECT_TOTALS_FOR_UPDATE = text("SELECT * FROM dispatch_metric_totals WHERE id = 1 FOR UPDATE")
SELECT_TOTALS = text("SELECT * FROM dispatch_metric_totals WHERE id = 1")

UPDATE_TOTALS = text(
    f"""
    UPDATE dispatch_metric_totals
       SET cycles = :cycles,
           cycles_failed = :cycles_failed,
           {", ".join(f"{n} = :{n}" for n in TOTALED_COUNTERS)},
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

# The scrape: sums over the (recent) detail rows; added to the totals row by the caller.
SUM_DETAIL = text(
    f"""
    SELECT count(*)                                        AS cycles,
           count(*) FILTER (WHERE NOT succeeded)           AS cycles_failed,
           {", ".join(f"coalesce(sum({n}), 0) AS {n}" for n in TOTALED_COUNTERS)},
           coalesce(sum(duration_seconds), 0)              AS duration_sum,
           coalesce(sum(lateness_sum), 0)                  AS lateness_sum,
           coalesce(sum(lateness_count), 0)                AS lateness_count,
           max(finished_at) FILTER (WHERE succeeded)       AS last_success_at
      FROM dispatch_cycles
    """
)

# Element-wise sums of the bucket arrays of the detail rows (1-based bucket index ``i``).
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

# Liveness: the newest successful cycle, in the detail rows or already rolled up.
LAST_SUCCESS_AT = text(
    """
    SELECT greatest(
        (SELECT max(finished_at) FROM dispatch_cycles WHERE succeeded),
        (SELECT last_success_at FROM dispatch_metric_totals WHERE id = 1)
    ) AS last_success_at
    """
)

# Errors over a recent window: cycles that failed, poison items, rows the broker refused.
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

# The dispatching hosts' clock skew over a recent window: the largest difference either way, and
# how many cycles were started by a host off by more than :threshold seconds.
CLOCK_SKEW_SINCE = text(
    """
    SELECT max(abs(clock_skew_seconds))                                   AS max_abs_skew,
           count(*) FILTER (WHERE abs(clock_skew_seconds) > :threshold)   AS skewed,
           count(clock_skew_seconds)                                      AS measured
      FROM dispatch_cycles
     WHERE finished_at >= :since
    """
)

# The lateness histogram of a recent window (for the SLO check's p95).
LATENESS_BUCKETS_SINCE = text(
    """
    SELECT u.i, sum(u.n) AS n
      FROM dispatch_cycles c, unnest(c.lateness_buckets) WITH ORDINALITY AS u(n, i)
     WHERE c.finished_at >= :since
     GROUP BY u.i
     ORDER BY u.i
    """
)

# When the cycles with errors of a recent window finished, newest first: the errors check walks
# them back from now to see how long errors have gone on without a gap (the alert's rate window).
ERROR_CYCLE_TIMES_SINCE = text(
    """
    SELECT finished_at
      FROM dispatch_cycles
     WHERE finished_at >= :since AND (NOT succeeded OR failed > 0 OR publish_failed > 0)
     ORDER BY finished_at DESC
    """
)

# Rows held back by repeated failures (poison rows): Pending after :min_attempts or more failed
# attempts, read on the poison rows' own partial index (``attempts > 0``, a handful of rows),
# never the due index, whose oldest end a long snapshot fills with dead entries.
POISON_ROWS = text(
    """
    SELECT count(*) AS poison_rows,
           EXTRACT(EPOCH FROM (CAST(:now AS timestamptz) - min(due_at))) AS oldest_due_age_seconds
      FROM event_reminders
     WHERE status = 'Pending' AND attempts > 0 AND due_at < :now AND attempts >= :min_attempts
    """
)

# Who holds back this database's xmin horizon, oldest first: each session with a snapshot
# (``backend_xmin``) or a transaction id of its own (``backend_xid``), each walsender (a replica's
# ``hot_standby_feedback``), each prepared transaction and each replication slot with an xmin.
# While any of them is older than a dead row version, VACUUM can neither remove that version nor
# its index entries, and no index scan can mark them dead: a scan that starts behind them visits
# each one (docs/runbooks/reminder-dispatch.md, "An old snapshot holds back vacuum"). This
# session is left out, and so are autovacuum workers and the server's other processes (no user:
# a VACUUM's own snapshot holds back no other). ``xmin_age`` is in transactions (``age()``);
# ``age_seconds`` from the transaction's start to :now (the caller's database clock; NULL: the
# statement's), NULL where it is not known (a slot, a walsender) or hidden.
#
# Another role's session, without pg_read_all_stats, shows only its pid, user, database,
# application name and xids: its ``backend_type`` is NULL too, so it is told from the server's
# own processes by having a user (``usesysid``: client backends, walsenders and background
# workers have one), and a walsender by its pid in pg_stat_replication.
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

# When the horizon began at the latest, dated by the metrics ledger, whoever holds it: each
# ledger row is inserted by a transaction of its own and stamped ``finished_at`` by that
# statement, so a row whose transaction is younger than the horizon (``age(xmin) < :xmin_age``)
# was written after the horizon's xmin was assigned, and the oldest such row's ``finished_at``
# is a moment the horizon already held. With a cycle a minute that dates it to the minute where
# pg_stat_activity hides the holder's start (another role's session, a slot, a walsender). Reads
# the detail rows (a day's at most, as SUM_DETAIL does); NULL when no row is that young.
LEDGER_ROW_AFTER_XMIN = text(
    "SELECT min(finished_at) FROM dispatch_cycles WHERE age(xmin) < :xmin_age"
)

# What an old snapshot costs the due scan and the relay's reads, from PostgreSQL's cumulative
# statistics (read from memory: no table or index is scanned). Per watched index: the scans
# started on it, the entries they returned and the live rows fetched through them (an entry read
# and not fetched is, on these partial indexes, a dead one stepped over: a row dispatched or
# published while a snapshot kept its entry; or one an index-only scan needed no row for), and
# its size on disk.
INDEX_READS = text(
    """
    SELECT s.indexrelname AS index_name, s.relname AS table_name, s.idx_scan, s.idx_tup_read,
           s.idx_tup_fetch, pg_relation_size(s.indexrelid) AS size_bytes
      FROM pg_stat_user_indexes s
     WHERE s.schemaname = current_schema() AND s.indexrelname = ANY(:names)
     ORDER BY s.indexrelname
    """
)

# Per watched table: live and dead row versions as PostgreSQL counts them, and when VACUUM (by
# hand or autovacuum) last ran on it. Dead rows that stay while vacuum runs are ones a snapshot
# still needs ("dead but not yet removable" in autovacuum's log).
TABLE_DEAD_ROWS = text(
    """
    SELECT relname AS table_name, n_live_tup, n_dead_tup,
           GREATEST(last_vacuum, last_autovacuum) AS last_vacuum_at
      FROM pg_stat_user_tables
     WHERE schemaname = current_schema() AND relname = ANY(:names)
     ORDER BY relname
    """
)

# The cycle-duration histogram of a recent window (the vacuum_horizon check's "slowing": the
# median of the last minutes against a longer run's, as the alert compares the two rates).
DURATION_BUCKETS_SINCE = text(
    """
    SELECT u.i, sum(u.n) AS n
      FROM dispatch_cycles c, unnest(c.duration_buckets) WITH ORDINALITY AS u(n, i)
     WHERE c.finished_at >= :since
     GROUP BY u.i
     ORDER BY u.i
    """
)
