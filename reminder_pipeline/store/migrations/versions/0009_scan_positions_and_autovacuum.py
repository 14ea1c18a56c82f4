"""Where the scans start, the poison rows' own index, and autovacuum tuned to the queue tables.

* ``ix_event_reminders_poison`` on ``(due_at, id) WHERE status = 'Pending' AND attempts > 0``:
  the poison rows (a handful), oldest due first. The cycle takes those whose back-off ended
  from here instead of walking the due index from its oldest end; the operators' list and the
  errors check read them here too.
* ``due_scan_position``: one row (``id = 1``), the floor of the due index each cycle writes at its
  end, where the next cycle's scan starts (docs/design.md, "Where a scan starts").
* ``outbox_relay_position``: one row (``id = 1``), the outbox's low-water mark, where the relay's
  reads start. Both tables start empty: their first writer inserts the row.
* Autovacuum per table (:data:`EVENT_REMINDERS_AUTOVACUUM`, :data:`OUTBOX_AUTOVACUUM`): after 1 %
  of the rows plus 5,000 changed instead of 0001's 2 %, so a 2-million-row calendar is vacuumed
  every ~25,000 changes, not ~40,000, and dead index entries of dispatched rows go sooner. The
  settings 0001 made and this one does not name stay (``tables.py`` declares the whole set).

Runs on a live calendar (``online_ddl``): the index is built CONCURRENTLY, the storage parameters
are set under a short lock_timeout with retries (``SET (…)`` takes SHARE UPDATE EXCLUSIVE: it
waits for an autovacuum or another DDL, never for writes, but writes queue behind it while it
waits). Run again after a failure half-way, it finishes the job.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-07
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import UUID

from reminder_pipeline.store.migrations.online_ddl import (
    SHARE_UPDATE_EXCLUSIVE,
    create_index,
    drop_index,
    run_ddl,
    storage_parameters,
)

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

#: event_reminders' autovacuum (tune here, and in tables.py's declaration).
EVENT_REMINDERS_AUTOVACUUM = {
    "autovacuum_vacuum_scale_factor": 0.01,
    "autovacuum_vacuum_threshold": 5000,
    "autovacuum_analyze_scale_factor": 0.02,
}
#: outbox's autovacuum (tune here, and in tables.py's declaration).
OUTBOX_AUTOVACUUM = {
    "autovacuum_vacuum_scale_factor": 0.01,
    "autovacuum_vacuum_threshold": 5000,
    "autovacuum_vacuum_insert_scale_factor": 0.05,
}
#: What both tables had before (0001's QUEUE_AUTOVACUUM): the downgrade puts it back.
BEFORE = {
    "autovacuum_vacuum_scale_factor": 0.02,
    "autovacuum_analyze_scale_factor": 0.02,
    "autovacuum_vacuum_insert_scale_factor": 0.05,
}
AUTOVACUUM = {"event_reminders": EVENT_REMINDERS_AUTOVACUUM, "outbox": OUTBOX_AUTOVACUUM}

POISON_INDEX = "ix_event_reminders_poison"
NOW = sa.text("now()")


def upgrade() -> None:
    """Build the index concurrently, create the two tables, set the storage parameters."""
    create_index(
        POISON_INDEX, "event_reminders", "due_at, id", where="status = 'Pending' AND attempts > 0"
    )
    op.create_table(
        "due_scan_position",
        sa.Column("id", sa.SmallInteger(), autoincrement=False, nullable=False),
        sa.Column("due_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("reminder_id", UUID(as_uuid=True), nullable=False),
        sa.Column("next_xid", sa.BigInteger(), nullable=False),
        sa.Column("swept_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=NOW, nullable=False),
        sa.CheckConstraint("id = 1", name="ck_due_scan_position_singleton"),
        sa.PrimaryKeyConstraint("id", name="pk_due_scan_position"),
        if_not_exists=True,
    )
    op.create_table(
        "outbox_relay_position",
        sa.Column("id", sa.SmallInteger(), autoincrement=False, nullable=False),
        sa.Column("low_water", sa.BigInteger(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=NOW, nullable=False),
        sa.CheckConstraint("id = 1", name="ck_outbox_relay_position_singleton"),
        sa.PrimaryKeyConstraint("id", name="pk_outbox_relay_position"),
        if_not_exists=True,
    )
    for table, parameters in AUTOVACUUM.items():
        run_ddl(
            f"ALTER TABLE {table} SET ({storage_parameters(parameters)})",
            table=table,
            lock=SHARE_UPDATE_EXCLUSIVE,
        )


def downgrade() -> None:
    """Put the storage parameters back as they were, drop the tables and the index."""
    for table, parameters in AUTOVACUUM.items():
        added = ", ".join(name for name in parameters if name not in BEFORE)
        run_ddl(
            f"ALTER TABLE {table} RESET ({added}), SET ({storage_parameters(BEFORE)})",
            table=table,
            lock=SHARE_UPDATE_EXCLUSIVE,
        )
    op.drop_table("outbox_relay_position", if_exists=True)
    op.drop_table("due_scan_position", if_exists=True)
    drop_index(POISON_INDEX)
