"""Support's finder and the writer of each move: indexes to find reminders by person and day, and
which writer moved a reminder out of Pending.

* ``event_reminders.moved_by``: what moved the row out of Pending: ``dagster`` (a Dagster run),
  ``cli:<command>`` (``cli:dispatch``, ``cli:up``: a cycle run from the command line, with no
  Dagster run behind it) or ``operator:<action>`` (a poison row skipped by hand). NULL for rows
  the calendar moved (skipped at creation, by a cancel or a completion) and for rows moved
  before this migration.
* ``event_reminders.moved_in_run``: the run id (a Dagster run's) or the CLI cycle's correlation
  id that moved it; NULL when ``moved_by`` is.
* ``ix_event_reminders_settled_due_at`` on ``(due_at, id) WHERE status <> 'Pending'``:
  ``reminders``' order (newest due first), keyset paging and ``--due-from``/``--due-to`` over
  the Sent and Skipped rows (the Pending ones have ``ix_event_reminders_status_due_at``).
  Partial on purpose: a full index on ``(due_at, id)`` was a plan the dispatcher's due query
  could take, counting its passed-over rows over every settled row due before AsOf.
* ``ix_calendar_events_owner_user_id``, ``ix_calendar_events_client_user_id`` (partial: events
  with a client) and ``ix_calendar_events_tenant_id``: ``--owner``, ``--client``, ``--tenant``.

Both columns nullable: no table rewrite. The indexes are built in the migration's transaction
(writes on the two tables wait for them). On a large calendar, build them first by hand with
``CREATE INDEX CONCURRENTLY`` and the same names and columns: this migration then finds them
and only adds the columns.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-03
"""

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

CLIENT = sa.text("client_user_id IS NOT NULL")
SETTLED = sa.text("status <> 'Pending'")


def upgrade() -> None:
    """Add the columns and the indexes (unless built concurrently beforehand)."""
    op.add_column("event_reminders", sa.Column("moved_by", sa.Text(), nullable=True))
    op.add_column("event_reminders", sa.Column("moved_in_run", sa.Text(), nullable=True))
    op.create_index(
        "ix_event_reminders_settled_due_at",
        "event_reminders",
        ["due_at", "id"],
        postgresql_where=SETTLED,
        if_not_exists=True,
    )
    op.create_index(
        "ix_calendar_events_owner_user_id",
        "calendar_events",
        ["owner_user_id"],
        if_not_exists=True,
    )
    op.create_index(
        "ix_calendar_events_client_user_id",
        "calendar_events",
        ["client_user_id"],
        postgresql_where=CLIENT,
        if_not_exists=True,
    )
    op.create_index(
        "ix_calendar_events_tenant_id", "calendar_events", ["tenant_id"], if_not_exists=True
    )


def downgrade() -> None:
    """Drop them."""
    op.drop_index("ix_calendar_events_tenant_id", table_name="calendar_events")
    op.drop_index(
        "ix_calendar_events_client_user_id", table_name="calendar_events", postgresql_where=CLIENT
    )
    op.drop_index("ix_calendar_events_owner_user_id", table_name="calendar_events")
    op.drop_index(
        "ix_event_reminders_settled_due_at", table_name="event_reminders", postgresql_where=SETTLED
    )
    op.drop_column("event_reminders", "moved_in_run")
    op.drop_column("event_reminders", "moved_by")
