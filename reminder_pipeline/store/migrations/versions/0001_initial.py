"""Initial schema: calendar_events, event_reminders, outbox.

Revision ID: 0001
Revises:
Create Date: 2026-11-30
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB, UUID

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

NOW = sa.text("now()")

# Queue tables churn: vacuum them after 2% of rows change instead of the default 20%, so dead
# index entries of dispatched rows do not pile up in front of the due query.
QUEUE_AUTOVACUUM = (
    "autovacuum_vacuum_scale_factor = 0.02, autovacuum_analyze_scale_factor = 0.02, "
    "autovacuum_vacuum_insert_scale_factor = 0.05"
)


def upgrade() -> None:
    op.create_table(
        "calendar_events",
        sa.Column("id", UUID(as_uuid=True), nullable=False),
        sa.Column("tenant_id", UUID(as_uuid=True), nullable=False),
        sa.Column("owner_user_id", UUID(as_uuid=True), nullable=False),
        sa.Column("client_user_id", UUID(as_uuid=True), nullable=True),
        sa.Column("kind", sa.Text(), nullable=False),
        sa.Column("status", sa.Text(), server_default="Planned", nullable=False),
        sa.Column("origin", sa.Text(), server_default="Manual", nullable=False),
        sa.Column("appointment_id", UUID(as_uuid=True), nullable=True),
        sa.Column("start_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("time_zone", sa.Text(), nullable=False),
        sa.Column("title", sa.Text(), nullable=True),
        sa.Column("description", sa.Text(), nullable=True),
        sa.Column("location", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=NOW, nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=NOW, nullable=False),
        sa.CheckConstraint(
            "status IN ('Planned', 'InProgress', 'Completed', 'Cancelled')",
            name="ck_calendar_events_status",
        ),
        sa.CheckConstraint("origin IN ('Manual', 'Appointment')", name="ck_calendar_events_origin"),
        sa.PrimaryKeyConstraint("id", name="pk_calendar_events"),
    )
    op.create_table(
        "event_reminders",
        sa.Column("id", UUID(as_uuid=True), nullable=False),
        sa.Column("calendar_event_id", UUID(as_uuid=True), nullable=False),
        sa.Column("offset_minutes", sa.Integer(), nullable=False),
        sa.Column("due_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("status", sa.Text(), server_default="Pending", nullable=False),
        sa.Column("sent_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=NOW, nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=NOW, nullable=False),
        sa.Column("attempts", sa.Integer(), server_default="0", nullable=False),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("next_attempt_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint(
            "status IN ('Pending', 'Sent', 'Skipped')", name="ck_event_reminders_status"
        ),
        sa.CheckConstraint(
            "status <> 'Sent' OR sent_at IS NOT NULL", name="ck_event_reminders_sent_has_sent_at"
        ),
        sa.CheckConstraint("offset_minutes >= 0", name="ck_event_reminders_offset_non_negative"),
        sa.ForeignKeyConstraint(
            ["calendar_event_id"],
            ["calendar_events.id"],
            name="fk_event_reminders_calendar_event_id_calendar_events",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name="pk_event_reminders"),
    )
    op.create_index(
        "ix_event_reminders_status_due_at",
        "event_reminders",
        ["due_at"],
        postgresql_where=sa.text("status = 'Pending'"),
    )
    op.create_index(
        "ix_event_reminders_calendar_event_id", "event_reminders", ["calendar_event_id"]
    )
    op.create_table(
        "outbox",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=False), nullable=False),
        sa.Column("topic", sa.Text(), nullable=False),
        sa.Column("message_key", sa.Text(), nullable=False),
        sa.Column("payload", JSONB(), nullable=False),
        sa.Column("headers", JSONB(), server_default=sa.text("'{}'::jsonb"), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=NOW, nullable=False),
        sa.Column("published_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("reminder_id", UUID(as_uuid=True), nullable=True),
        sa.Column("publish_attempts", sa.Integer(), server_default="0", nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_outbox"),
        sa.UniqueConstraint("reminder_id", name="uq_outbox_reminder_id"),
    )
    op.create_index(
        "ix_outbox_unpublished", "outbox", ["id"], postgresql_where=sa.text("published_at IS NULL")
    )
    op.execute(f"ALTER TABLE event_reminders SET ({QUEUE_AUTOVACUUM})")
    op.execute(f"ALTER TABLE outbox SET ({QUEUE_AUTOVACUUM})")


def downgrade() -> None:
    op.drop_table("outbox")
    op.drop_table("event_reminders")
    op.drop_table("calendar_events")
