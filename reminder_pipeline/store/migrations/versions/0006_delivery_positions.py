"""Where each message landed, every re-publish of it, and when a poison row last failed.

* ``outbox.kafka_partition`` / ``kafka_offset``: the partition and offset of the broker's
  delivery report, recorded by the relay in the same statement that marks the row published
  (``reminder-pipeline trace``). NULL for rows published before, and for unpublished ones.
* ``outbox_republishes``: one row per message the re-publish back-fill delivered again: the
  reminder, the outbox row, the run that re-published it and where that copy landed.
* ``event_reminders.last_failed_at``: the time of the last failed attempt (the bulk poison
  actions' ``--failed-since``); back-filled from ``updated_at`` for rows that already failed.

Runs on a live calendar (``online_ddl``): the columns are nullable (no table rewrite), added
under a short lock_timeout with retries, a statement per table; the back-fill touches the failed
rows only, after the columns' locks are gone. Run again after a failure half-way, it finishes
the job.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-02
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import UUID

from reminder_pipeline.store.migrations.online_ddl import run_ddl

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Add the columns and the table; back-fill ``last_failed_at`` of failed rows."""
    run_ddl(
        "ALTER TABLE outbox ADD COLUMN IF NOT EXISTS kafka_partition integer, "
        "ADD COLUMN IF NOT EXISTS kafka_offset bigint",
        table="outbox",
    )
    run_ddl(
        "ALTER TABLE event_reminders ADD COLUMN IF NOT EXISTS last_failed_at timestamptz",
        table="event_reminders",
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
        if_not_exists=True,
    )
    # A new table, in the migration's transaction with it: nothing else can use it yet.
    op.create_index(
        "ix_outbox_republishes_reminder_id",
        "outbox_republishes",
        ["reminder_id"],
        if_not_exists=True,
    )


def downgrade() -> None:
    """Drop them (the table's index goes with it)."""
    op.drop_table("outbox_republishes", if_exists=True)
    run_ddl(
        "ALTER TABLE event_reminders DROP COLUMN IF EXISTS last_failed_at", table="event_reminders"
    )
    run_ddl(
        "ALTER TABLE outbox DROP COLUMN IF EXISTS kafka_offset, "
        "DROP COLUMN IF EXISTS kafka_partition",
        table="outbox",
    )
