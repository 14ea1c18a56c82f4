"""Where each message landed, every re-publish of it, and when a poison row last failed.

* ``outbox.kafka_partition`` / ``kafka_offset``: the partition and offset of the broker's
  delivery report, recorded by the relay in the same statement that marks the row published
  (``reminder-pipeline trace``). NULL for rows published before, and for unpublished ones.
* ``outbox_republishes``: one row per message the re-publish back-fill delivered again: the
  reminder, the outbox row, the run that re-published it and where that copy landed.
* ``event_reminders.last_failed_at``: the time of the last failed attempt (the bulk poison
  actions' ``--failed-since``); back-filled from ``updated_at`` for rows that already failed.

All columns nullable: no table rewrite.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-02
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import UUID

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Add the columns and the table; back-fill ``last_failed_at`` of failed rows."""
    op.add_column("outbox", sa.Column("kafka_partition", sa.Integer(), nullable=True))
    op.add_column("outbox", sa.Column("kafka_offset", sa.BigInteger(), nullable=True))
    op.add_column(
        "event_reminders",
        sa.Column("last_failed_at", sa.DateTime(timezone=True), nullable=True),
    )
    op.execute(
        "UPDATE event_reminders SET last_failed_at = updated_at "
        "WHERE attempts > 0 AND last_failed_at IS NULL"
    )
    op.create_table(
        "outbox_republishes",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=False), nullable=False),
        sa.Column("reminder_id", UUID(as_uuid=True), nullable=True),
        sa.Column("outbox_id", sa.BigInteger(), nullable=False),
        sa.Column("run_id", sa.Text(), nullable=False),
        sa.Column(
            "republished_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("kafka_partition", sa.Integer(), nullable=True),
        sa.Column("kafka_offset", sa.BigInteger(), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_outbox_republishes"),
    )
    op.create_index("ix_outbox_republishes_reminder_id", "outbox_republishes", ["reminder_id"])


def downgrade() -> None:
    """Drop them (the table's index goes with it)."""
    op.drop_table("outbox_republishes")
    op.drop_column("event_reminders", "last_failed_at")
    op.drop_column("outbox", "kafka_offset")
    op.drop_column("outbox", "kafka_partition")
