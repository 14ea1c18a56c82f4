"""Reservations for parallel Dagster runs, a total order for the due query, the outbox's DueAt.

* ``event_reminders.reserved_by`` / ``reserved_until``: the rows a Dagster run's
  ``select_due_batch`` took stay reserved for that run until its write commits or the
  reservation expires, so concurrent runs take disjoint batches (docs/design.md).
* ``ix_event_reminders_status_due_at`` becomes ``(due_at, id)``: the due query orders by both,
  so the rows a batch passed over (locked elsewhere) are exactly countable whatever the ties.
* ``outbox.due_at`` (+ index): the re-publish back-fill finds a day's messages by DueAt.
* ``time_zone_fallbacks`` in the metrics ledger: reminders sent with the fallback zone.

The index is rebuilt in the migration's transaction (writes on ``event_reminders`` wait for
it). On a very large table, build it first by hand with ``CREATE INDEX CONCURRENTLY
ix_event_reminders_status_due_at_id ON event_reminders (due_at, id) WHERE status = 'Pending'``:
this migration then only swaps the names.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

DUE_INDEX = "ix_event_reminders_status_due_at"
PENDING = sa.text("status = 'Pending'")


def upgrade() -> None:
    op.add_column("event_reminders", sa.Column("reserved_by", sa.Text(), nullable=True))
    op.add_column(
        "event_reminders", sa.Column("reserved_until", sa.DateTime(timezone=True), nullable=True)
    )
    op.execute(
        f"CREATE INDEX IF NOT EXISTS {DUE_INDEX}_id ON event_reminders (due_at, id) "
        "WHERE status = 'Pending'"
    )
    op.drop_index(DUE_INDEX, table_name="event_reminders", postgresql_where=PENDING)
    op.execute(f"ALTER INDEX {DUE_INDEX}_id RENAME TO {DUE_INDEX}")

    op.add_column("outbox", sa.Column("due_at", sa.DateTime(timezone=True), nullable=True))
    op.execute(
        "UPDATE outbox o SET due_at = r.due_at FROM event_reminders r "
        "WHERE r.id = o.reminder_id AND o.due_at IS NULL"
    )
    op.create_index("ix_outbox_due_at", "outbox", ["due_at"])

    op.add_column(
        "dispatch_cycles",
        sa.Column("time_zone_fallbacks", sa.Integer(), server_default="0", nullable=False),
    )
    op.add_column(
        "dispatch_metric_totals",
        sa.Column("time_zone_fallbacks", sa.BigInteger(), server_default="0", nullable=False),
    )


def downgrade() -> None:
    op.drop_column("dispatch_metric_totals", "time_zone_fallbacks")
    op.drop_column("dispatch_cycles", "time_zone_fallbacks")
    op.drop_index("ix_outbox_due_at", table_name="outbox")
    op.drop_column("outbox", "due_at")
    op.drop_index(DUE_INDEX, table_name="event_reminders", postgresql_where=PENDING)
    op.create_index(DUE_INDEX, "event_reminders", ["due_at"], postgresql_where=PENDING)
    op.drop_column("event_reminders", "reserved_until")
    op.drop_column("event_reminders", "reserved_by")
