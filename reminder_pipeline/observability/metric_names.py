"""The names of the metrics the exporter serves, each written once (the dashboard, the alert rules
and the tests use these; docs/observability.md lists them)."""

from __future__ import annotations

DISPATCH_PREFIX = "calendar_reminder_dispatch_"
CYCLE_DURATION = DISPATCH_PREFIX + "cycle_duration_seconds"
CYCLES = DISPATCH_PREFIX + "cycles_total"
ITEMS = DISPATCH_PREFIX + "items_total"
SKIP_LOCKED = DISPATCH_PREFIX + "skip_locked_total"
ERRORS = DISPATCH_PREFIX + "errors_total"
PUBLISHED = DISPATCH_PREFIX + "published_total"
LATENESS = DISPATCH_PREFIX + "lateness_seconds"
BACKLOG_GAUGE = DISPATCH_PREFIX + "backlog"
BACKLOG_OLDEST_AGE = DISPATCH_PREFIX + "backlog_oldest_age_seconds"
OUTBOX_UNPUBLISHED = DISPATCH_PREFIX + "outbox_unpublished"
OUTBOX_LAG_GAUGE = DISPATCH_PREFIX + "outbox_lag_seconds"
RELAY_LOCK_SILENT = DISPATCH_PREFIX + "relay_lock_holder_silent_seconds"
LAST_SUCCESS = DISPATCH_PREFIX + "last_success_timestamp_seconds"
POISON_ROWS_GAUGE = DISPATCH_PREFIX + "poison_rows"
POISON_OLDEST_AGE = DISPATCH_PREFIX + "poison_oldest_age_seconds"
TIME_ZONE_FALLBACKS_COUNTER = DISPATCH_PREFIX + "time_zone_fallbacks_total"
CLOCK_SKEW = DISPATCH_PREFIX + "clock_skew_seconds"
CLOCK_SKEWED_CYCLES = DISPATCH_PREFIX + "clock_skewed_cycles"
FORECAST_PEAK_DUE = DISPATCH_PREFIX + "forecast_peak_due"
FORECAST_PEAK_TIME = DISPATCH_PREFIX + "forecast_peak_timestamp_seconds"
FORECAST_CAPACITY = DISPATCH_PREFIX + "forecast_capacity_per_run"
DAEMON_HEARTBEAT_AGE = DISPATCH_PREFIX + "daemon_heartbeat_age_seconds"
# Who holds back vacuum and what it costs the dispatcher (docs/runbooks/reminder-dispatch.md,
# "An old snapshot holds back vacuum"; the vacuum_horizon check).
OLDEST_SNAPSHOT_AGE = DISPATCH_PREFIX + "oldest_snapshot_age_seconds"
OLDEST_SNAPSHOT_XMIN_AGE = DISPATCH_PREFIX + "oldest_snapshot_xmin_age"
OLDEST_SNAPSHOT_HOLDER = DISPATCH_PREFIX + "oldest_snapshot_holder_info"
INDEX_SCANS = DISPATCH_PREFIX + "index_scans_total"
INDEX_ENTRIES_READ = DISPATCH_PREFIX + "index_entries_read_total"
INDEX_ENTRIES_FETCHED = DISPATCH_PREFIX + "index_entries_fetched_total"
INDEX_SIZE = DISPATCH_PREFIX + "index_size_bytes"
TABLE_LIVE_ROWS = DISPATCH_PREFIX + "table_live_rows"
TABLE_DEAD_ROWS_GAUGE = DISPATCH_PREFIX + "table_dead_rows"
TABLE_LAST_VACUUM = DISPATCH_PREFIX + "table_last_vacuum_timestamp_seconds"
UP = DISPATCH_PREFIX + "up"
RECONNECTS = DISPATCH_PREFIX + "database_reconnects_total"
SCRAPE_DURATION = DISPATCH_PREFIX + "scrape_duration_seconds"

#: Every metric family the endpoint serves (the dashboard and the alert rules use only these).
DISPATCH_METRIC_NAMES: tuple[str, ...] = (
    CYCLE_DURATION,
    CYCLES,
    ITEMS,
    SKIP_LOCKED,
    ERRORS,
    PUBLISHED,
    LATENESS,
    BACKLOG_GAUGE,
    BACKLOG_OLDEST_AGE,
    OUTBOX_UNPUBLISHED,
    OUTBOX_LAG_GAUGE,
    RELAY_LOCK_SILENT,
    LAST_SUCCESS,
    UP,
    RECONNECTS,
    SCRAPE_DURATION,
    POISON_ROWS_GAUGE,
    POISON_OLDEST_AGE,
    TIME_ZONE_FALLBACKS_COUNTER,
    CLOCK_SKEW,
    CLOCK_SKEWED_CYCLES,
    FORECAST_PEAK_DUE,
    FORECAST_PEAK_TIME,
    FORECAST_CAPACITY,
    OLDEST_SNAPSHOT_AGE,
    OLDEST_SNAPSHOT_XMIN_AGE,
    OLDEST_SNAPSHOT_HOLDER,
    INDEX_SCANS,
    INDEX_ENTRIES_READ,
    INDEX_ENTRIES_FETCHED,
    INDEX_SIZE,
    TABLE_LIVE_ROWS,
    TABLE_DEAD_ROWS_GAUGE,
    TABLE_LAST_VACUUM,
)
#: Served only while something holds back the database's xmin horizon (one series: the oldest).
WHILE_HELD_METRIC_NAMES: tuple[str, ...] = (OLDEST_SNAPSHOT_HOLDER,)
#: Served besides those when the exporter is given Dagster's daemon heartbeats (DaemonHeartbeats).
HEARTBEAT_METRIC_NAMES: tuple[str, ...] = (DAEMON_HEARTBEAT_AGE,)
