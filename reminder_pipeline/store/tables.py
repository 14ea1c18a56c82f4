"""SQLAlchemy Core metadata of the dispatcher's tables: Alembic's target, checked against the migrations."""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import JSONB, UUID

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
    sa.CheckConstraint("status IN ('Pending', 'Sent', 'Skipped')", name="status"),
    sa.CheckConstraint("status <> 'Sent' OR sent_at IS NOT NULL", name="sent_has_sent_at"),
    sa.CheckConstraint("offset_minutes >= 0", name="offset_non_negative"),
    # The due query's index. Partial: a row leaving Pending leaves the index, so it stays small
    # however many Sent/Skipped rows accumulate (measured ~5x smaller, ~12% faster draining).
    sa.Index(
        "ix_event_reminders_status_due_at",
        "due_at",
        postgresql_where=sa.text("status = 'Pending'"),
    ),
    sa.Index("ix_event_reminders_calendar_event_id", "calendar_event_id"),
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
    # How many times the relay handed the row to the producer: > 1 means a possible duplicate
    # on the topic from the ack window (at-least-once), which consumers de-duplicate.
    sa.Column("publish_attempts", sa.Integer, nullable=False, server_default="0"),
    sa.UniqueConstraint("reminder_id", name="uq_outbox_reminder_id"),
    sa.Index("ix_outbox_unpublished", "id", postgresql_where=sa.text("published_at IS NULL")),
)
