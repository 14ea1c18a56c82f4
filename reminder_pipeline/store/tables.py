"""SQLAlchemy Core metadata of the tables: Alembic's target, checked against the migrations."""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import JSONB, UUID

from ..domain.model import LEDGER_COUNTERS, TOTALED_COUNTERS

metadata = sa.MetaData(
    naming_convention={
        "ix": "ix_%(table_name)s_%(column_0_N_name)s",
        "uq": "uq_%(table_name)s_%(column_0_N_name)s",
        "ck": "ck_%(table_name)s_%(constraint_name)s",
        "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
        "pk": "pk_%(table_name)s",
    }
)

NOW = sa.text("now()")

#: Autovacuum of the two queue tables, ``event_reminders`` and ``outbox`` (set by migrations 0001
#: and 0009; the tests compare it with ``pg_class.reloptions``: ``support.schema_differences``).
#: Vacuumed after 1 % of the rows plus 5,000 changed, not the default 20 %: every dispatched row
#: leaves a dead entry in the due index and in ``ix_outbox_unpublished``; at 1000/s this vacuums
#: each table once a dispatch cycle up to ~5 M rows, and both indexes stay flat (measured:
#: docs/scaling.md, "Vacuum").
QUEUE_AUTOVACUUM = {
    "autovacuum_vacuum_scale_factor": 0.01,
    "autovacuum_vacuum_threshold": 5000,
    "autovacuum_analyze_scale_factor": 0.02,
    "autovacuum_vacuum_insert_scale_factor": 0.05,
}

calendar_events = sa.Table(
    "calendar_events",
    metadata,
    sa.Column("id", UUID(as_uuid=True), primary_key=True),
    sa.Column("tenant_id", UUID(as_uuid=True), nullable=False),
    sa.Column("owner_user_id", UUID(as_uuid=True), nullable=False),
    sa.Column("client_user_id", UUID(as_uuid=True), nullable=True),
    # Kind is additive in the contract: new values may appear, so no CHECK on it.
    sa.Column("kind", sa.Text, nullable=False),
    sa.Column("status", sa.Text, nullable=False, server_default="Planned"),
    sa.Column("origin", sa.Text, nullable=False, server_default="Manual"),
    sa.Column("appointment_id", UUID(as_uuid=True), nullable=True),
    sa.Column("start_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("time_zone", sa.Text, nullable=False),
    # PII: never selected by the dispatcher, never in a message or a log line.
    sa.Column("title", sa.Text, nullable=True),
    sa.Column("description", sa.Text, nullable=True),
    sa.Column("location", sa.Text, nullable=True),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=NOW),
    sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False, server_default=NOW),
    sa.CheckConstraint(
        "status IN ('Planned', 'InProgress', 'Completed', 'Cancelled')", name="status"
    ),
    sa.CheckConstraint("origin IN ('Manual', 'Appointment')", name="origin"),
    # Support's finder (``reminders --owner/--client/--tenant``, migration 0007).
    sa.Index("ix_calendar_events_owner_user_id", "owner_user_id"),
    sa.Index(
        "ix_calendar_events_client_user_id",
        "client_user_id",
        postgresql_where=sa.text("client_user_id IS NOT NULL"),
    ),
    sa.Index("ix_calendar_events_tenant_id", "tenant_id"),
)

event_reminders = sa.Table(
    "event_reminders",
    metadata,
    sa.Column("id", UUID(as_uuid=True), primary_key=True),
    sa.Column(
        "calendar_event_id",
        UUID(as_uuid=True),
        sa.ForeignKey("calendar_events.id", ondelete="CASCADE"),
        nullable=False,
    ),
    sa.Column("offset_minutes", sa.Integer, nullable=False),
    sa.Column("due_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("status", sa.Text, nullable=False, server_default="Pending"),
    sa.Column("sent_at", sa.DateTime(timezone=True), nullable=True),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=NOW),
    sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False, server_default=NOW),
    # Poison-row bookkeeping: failed attempts, the last error (identifiers only) and back-off.
    sa.Column("attempts", sa.Integer, nullable=False, server_default="0"),
    sa.Column("last_error", sa.Text, nullable=True),
    sa.Column("next_attempt_at", sa.DateTime(timezone=True), nullable=True),
    # When the last failed attempt was (the bulk poison actions' --failed-since).
    sa.Column("last_failed_at", sa.DateTime(timezone=True), nullable=True),
    # A Dagster run's reservation of the rows its select_due_batch took (docs/design.md): other
    # selections skip them until the run's write commits or ``reserved_until`` passes.
    sa.Column("reserved_by", sa.Text, nullable=True),
    sa.Column("reserved_until", sa.DateTime(timezone=True), nullable=True),
    # What moved the row out of Pending and in which run (migration 0007; the trace's reason):
    # "dagster", "cli:<command>" or "operator:<action>"; NULL when the calendar moved it.
    sa.Column("moved_by", sa.Text, nullable=True),
    sa.Column("moved_in_run", sa.Text, nullable=True),
    sa.CheckConstraint("status IN ('Pending', 'Sent', 'Skipped')", name="status"),
    sa.CheckConstraint("status <> 'Sent' OR sent_at IS NOT NULL", name="sent_has_sent_at"),
    sa.CheckConstraint("offset_minutes >= 0", name="offset_non_negative"),
    # The due query's index. Partial: a row leaving Pending leaves the index, so it stays small
    # however many Sent/Skipped rows accumulate (smaller and faster to drain than a full index).
    # (due_at, id): the due query's total order, so the rows a batch passed over are countable.
    sa.Index(
        "ix_event_reminders_status_due_at",
        "due_at",
        "id",
        postgresql_where=sa.text("status = 'Pending'"),
    ),
    sa.Index("ix_event_reminders_calendar_event_id", "calendar_event_id"),
    # Support's finder: the settled rows newest due first with keyset paging, a due range
    # (Pending rows: the index above). Partial, so the due query can never take it.
    sa.Index(
        "ix_event_reminders_settled_due_at",
        "due_at",
        "id",
        postgresql_where=sa.text("status <> 'Pending'"),
    ),
    # Poison rows (Pending after a failed attempt), oldest due first (migration 0009): the cycle
    # takes those whose back-off ended from here, not by walking the due index from its oldest
    # end; the operators' list and the errors check read them here too. A handful of rows.
    sa.Index(
        "ix_event_reminders_poison",
        "due_at",
        "id",
        postgresql_where=sa.text("status = 'Pending' AND attempts > 0"),
    ),
    postgresql_with=QUEUE_AUTOVACUUM,
)

# Where the due scan starts (migration 0009; docs/design.md, "Where a scan starts"): one row, the
# floor of the due index written at the end of each cycle. Every Pending row due before it that is
# not a poison row was taken, so the next cycle's scan starts there instead of at the oldest end
# of the index, where a long snapshot keeps every row dispatched since it began.
due_scan_position = sa.Table(
    "due_scan_position",
    metadata,
    sa.Column("id", sa.SmallInteger, primary_key=True, autoincrement=False),
    # The floor, in the due index's order (due_at, id).
    sa.Column("due_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("reminder_id", UUID(as_uuid=True), nullable=False),
    # The next transaction id when the floor was written: a snapshot older than it may still see
    # the rows dispatched before the floor (their index entries cannot be cleaned up yet).
    sa.Column("next_xid", sa.BigInteger, nullable=False),
    # When a cycle last scanned the due index from its oldest end (the full sweep).
    sa.Column("swept_at", sa.DateTime(timezone=True), nullable=True),
    sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False, server_default=NOW),
    sa.CheckConstraint("id = 1", name="singleton"),
)

# Where the relay's reads start (migration 0009): one row, the outbox's low-water mark. Every
# outbox row with a smaller id is published (or was never committed), so the relay reads the
# unpublished index from here, not from its oldest end.
outbox_relay_position = sa.Table(
    "outbox_relay_position",
    metadata,
    sa.Column("id", sa.SmallInteger, primary_key=True, autoincrement=False),
    sa.Column("low_water", sa.BigInteger, nullable=False),
    sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False, server_default=NOW),
    sa.CheckConstraint("id = 1", name="singleton"),
)

outbox = sa.Table(
    "outbox",
    metadata,
    sa.Column("id", sa.BigInteger, sa.Identity(always=False), primary_key=True),
    sa.Column("topic", sa.Text, nullable=False),
    sa.Column("message_key", sa.Text, nullable=False),
    sa.Column("payload", JSONB, nullable=False),
    sa.Column("headers", JSONB, nullable=False, server_default=sa.text("'{}'::jsonb")),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=NOW),
    sa.Column("published_at", sa.DateTime(timezone=True), nullable=True),
    # INV-REM-2 in the database itself: at most one outbox row per reminder.
    sa.Column("reminder_id", UUID(as_uuid=True), nullable=True),
    # Failed publish attempts: handed to the producer and not acknowledged (broker error,
    # timeout, held back behind a failed row of its key). > 0 on a published row means a
    # possible duplicate on the topic (at-least-once), which consumers de-duplicate.
    sa.Column("publish_attempts", sa.Integer, nullable=False, server_default="0"),
    # The reminder's DueAt: the re-publish back-fill selects a day's messages by it.
    sa.Column("due_at", sa.DateTime(timezone=True), nullable=True),
    # Where the message landed: the broker's delivery report, recorded when the row is marked
    # published (reminder-pipeline trace). NULL before migration 0005 and while unpublished.
    sa.Column("kafka_partition", sa.Integer, nullable=True),
    sa.Column("kafka_offset", sa.BigInteger, nullable=True),
    sa.UniqueConstraint("reminder_id", name="uq_outbox_reminder_id"),
    sa.Index("ix_outbox_unpublished", "id", postgresql_where=sa.text("published_at IS NULL")),
    sa.Index("ix_outbox_due_at", "due_at"),
    # The purge: published rows by age (migration 0005); unpublished rows have no entry.
    sa.Index(
        "ix_outbox_published_at",
        "published_at",
        postgresql_where=sa.text("published_at IS NOT NULL"),
    ),
    # Churns like event_reminders: a row per Sent reminder, marked published, purged.
    postgresql_with=QUEUE_AUTOVACUUM,
)

# Every message the re-publish back-fill delivered again: which reminder and outbox row, the run
# that re-published it, and where that copy landed (reminder-pipeline trace). No payload: the
# outbox row has it. Deleted with the outbox row by the purge (no foreign key: the same statement).
outbox_republishes = sa.Table(
    "outbox_republishes",
    metadata,
    sa.Column("id", sa.BigInteger, sa.Identity(always=False), primary_key=True),
    sa.Column("reminder_id", UUID(as_uuid=True), nullable=True),
    sa.Column("outbox_id", sa.BigInteger, nullable=False),
    sa.Column("run_id", sa.Text, nullable=False),
    sa.Column("republished_at", sa.DateTime(timezone=True), nullable=False, server_default=NOW),
    sa.Column("kafka_partition", sa.Integer, nullable=True),
    sa.Column("kafka_offset", sa.BigInteger, nullable=True),
    sa.Index("ix_outbox_republishes_reminder_id", "reminder_id"),
    # The outbox purge deletes a purged row's records with it (migration 0008).
    sa.Index("ix_outbox_republishes_outbox_id", "outbox_id"),
)

# --- dispatch metrics ledger (observability) ----------------------------------------------
# One row per dispatch cycle, written in its own short transaction after the cycle (never inside
# the dispatch transaction). The metrics exporter turns SUM()s over it into Prometheus counters
# and histograms, so they survive the short-lived Dagster run processes and exporter restarts.
# Histogram bucket bounds are fixed in code (observability/ledger.py); the arrays hold
# per-bucket (non-cumulative) counts, the last element being the +Inf overflow bucket.

dispatch_cycles = sa.Table(
    "dispatch_cycles",
    metadata,
    sa.Column("id", sa.BigInteger, sa.Identity(always=False), primary_key=True),
    # The cycle's run id (a Dagster run's, or the one the CLI gives its cycle). Not unique: the
    # caller records a cycle once; the id is for joining with logs and traces.
    sa.Column("run_id", sa.Text, nullable=False),
    sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("finished_at", sa.DateTime(timezone=True), nullable=False, server_default=NOW),
    sa.Column("as_of", sa.DateTime(timezone=True), nullable=True),
    sa.Column("succeeded", sa.Boolean, nullable=False),
    # The cycle's counters (domain.model.CycleCounts, those kept in the ledger): a column each.
    *(sa.Column(name, sa.Integer, nullable=False, server_default="0") for name in LEDGER_COUNTERS),
    sa.Column("duration_seconds", sa.Double, nullable=False),
    sa.Column("duration_buckets", sa.ARRAY(sa.BigInteger), nullable=False),
    sa.Column("lateness_sum", sa.Double, nullable=False, server_default="0"),
    sa.Column("lateness_count", sa.BigInteger, nullable=False, server_default="0"),
    sa.Column("lateness_buckets", sa.ARRAY(sa.BigInteger), nullable=False),
    # The exception's class name only: a message could carry data, a class name cannot.
    sa.Column("error_kind", sa.Text, nullable=True),
    # How far the host that started the cycle was ahead of the database's clock (seconds).
    sa.Column("clock_skew_seconds", sa.Double, nullable=True),
    # Time-window reads (health checks) and the roll-up of old rows walk this index.
    sa.Index("ix_dispatch_cycles_finished_at", "finished_at"),
)

# The ledger's rolled-up past: one row holding the sums of every cycle row already deleted from
# ``dispatch_cycles``. Counters = totals + SUM(detail), read in one snapshot, so a roll-up never
# makes a counter step back. Keeps each scrape's work bounded by the detail retention.
dispatch_metric_totals = sa.Table(
    "dispatch_metric_totals",
    metadata,
    sa.Column("id", sa.SmallInteger, primary_key=True, autoincrement=False),
    sa.Column("cycles", sa.BigInteger, nullable=False, server_default="0"),
    sa.Column("cycles_failed", sa.BigInteger, nullable=False, server_default="0"),
    *(
        sa.Column(name, sa.BigInteger, nullable=False, server_default="0")
        for name in TOTALED_COUNTERS
    ),
    sa.Column("duration_sum", sa.Double, nullable=False, server_default="0"),
    sa.Column(
        "duration_buckets",
        sa.ARRAY(sa.BigInteger),
        nullable=False,
        server_default=sa.text("'{}'::bigint[]"),
    ),
    sa.Column("lateness_sum", sa.Double, nullable=False, server_default="0"),
    sa.Column("lateness_count", sa.BigInteger, nullable=False, server_default="0"),
    sa.Column(
        "lateness_buckets",
        sa.ARRAY(sa.BigInteger),
        nullable=False,
        server_default=sa.text("'{}'::bigint[]"),
    ),
    sa.Column("last_success_at", sa.DateTime(timezone=True), nullable=True),
    sa.Column("rolled_up_until", sa.DateTime(timezone=True), nullable=True),
    sa.CheckConstraint("id = 1", name="singleton"),
)
