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

Runs on a live calendar (``online_ddl``): the columns are nullable (no table rewrite), added in
one statement under a short lock_timeout with retries; the indexes are built CONCURRENTLY, so
the calendar's writes never wait for a build. Run again after a failure half-way, it finishes
the job (an index a failed build left invalid is built again; a valid one of the same name, as
one built by hand beforehand, is kept).

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-03
"""

from reminder_pipeline.store.migrations.online_ddl import create_index, drop_index, run_ddl

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

CLIENT = "client_user_id IS NOT NULL"
SETTLED = "status <> 'Pending'"


def upgrade() -> None:
    """Add the columns, then build the indexes concurrently."""
    run_ddl(
        "ALTER TABLE event_reminders ADD COLUMN IF NOT EXISTS moved_by text, "
        "ADD COLUMN IF NOT EXISTS moved_in_run text",
        table="event_reminders",
    )
    create_index(
        "ix_event_reminders_settled_due_at", "event_reminders", "due_at, id", where=SETTLED
    )
    create_index("ix_calendar_events_owner_user_id", "calendar_events", "owner_user_id")
    create_index(
        "ix_calendar_events_client_user_id", "calendar_events", "client_user_id", where=CLIENT
    )
    create_index("ix_calendar_events_tenant_id", "calendar_events", "tenant_id")


def downgrade() -> None:
    """Drop the indexes concurrently, then the columns."""
    drop_index("ix_calendar_events_tenant_id")
    drop_index("ix_calendar_events_client_user_id")
    drop_index("ix_calendar_events_owner_user_id")
    drop_index("ix_event_reminders_settled_due_at")
    run_ddl(
        "ALTER TABLE event_reminders DROP COLUMN IF EXISTS moved_in_run, "
        "DROP COLUMN IF EXISTS moved_by",
        table="event_reminders",
    )
