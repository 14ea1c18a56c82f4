"""Reservations for parallel Dagster runs, a total order for the due query, the outbox's DueAt.

* ``event_reminders.reserved_by`` / ``reserved_until``: the rows a Dagster run's
  ``select_due_batch`` took stay reserved for that run until its write commits or the
  reservation expires, so concurrent runs take disjoint batches (docs/design.md).
* ``ix_event_reminders_status_due_at`` becomes ``(due_at, id)``: the due query orders by both,
  so the rows a batch passed over (locked elsewhere) are exactly countable whatever the ties.
* ``outbox.due_at`` (+ index): the re-publish back-fill finds a day's messages by DueAt.
* ``time_zone_fallbacks`` in the metrics ledger: reminders sent with the fallback zone.

Runs on a live calendar (``online_ddl``): the columns are nullable or have a constant default
(no table rewrite), added under a short lock_timeout with retries, a statement per table; the
new due index is built CONCURRENTLY beside the old one, which is then dropped concurrently and
the new one renamed (the due query has an index all along); ``outbox.due_at`` is back-filled
once the column's lock is gone. Run again after a failure half-way, it finishes the job.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30
"""

from alembic import op

from reminder_pipeline.store.migrations.online_ddl import (
    SHARE_UPDATE_EXCLUSIVE,
    create_index,
    drop_index,
    run_ddl,
)

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

DUE_INDEX = "ix_event_reminders_status_due_at"
PENDING = "status = 'Pending'"


def upgrade() -> None:
    """Add the columns, rebuild the due index on (due_at, id), index the outbox's DueAt."""
    run_ddl(
        "ALTER TABLE event_reminders ADD COLUMN IF NOT EXISTS reserved_by text, "
        "ADD COLUMN IF NOT EXISTS reserved_until timestamptz",
        table="event_reminders",
    )
    # The name this migration's docstring once gave for building it by hand: such an index is used.
    _replace_due_index(["due_at", "id"], beside=f"{DUE_INDEX}_id")

    run_ddl("ALTER TABLE outbox ADD COLUMN IF NOT EXISTS due_at timestamptz", table="outbox")
    op.execute(
        "UPDATE outbox o SET due_at = r.due_at FROM event_reminders r "
        "WHERE r.id = o.reminder_id AND o.due_at IS NULL"
    )
    create_index("ix_outbox_due_at", "outbox", "due_at")

    for table, kind in (("dispatch_cycles", "integer"), ("dispatch_metric_totals", "bigint")):
        run_ddl(
            f"ALTER TABLE {table} ADD COLUMN IF NOT EXISTS time_zone_fallbacks {kind} "
            "NOT NULL DEFAULT 0",
            table=table,
        )


def downgrade() -> None:
    """Drop them, and the due index back on (due_at) alone."""
    for table in ("dispatch_metric_totals", "dispatch_cycles"):
        run_ddl(f"ALTER TABLE {table} DROP COLUMN IF EXISTS time_zone_fallbacks", table=table)
    drop_index("ix_outbox_due_at")
    run_ddl("ALTER TABLE outbox DROP COLUMN IF EXISTS due_at", table="outbox")
    _replace_due_index(["due_at"], beside=f"{DUE_INDEX}_due_at")
    run_ddl(
        "ALTER TABLE event_reminders DROP COLUMN IF EXISTS reserved_until, "
        "DROP COLUMN IF EXISTS reserved_by",
        table="event_reminders",
    )


def _replace_due_index(columns: list[str], beside: str) -> None:
    """The due index on ``columns``: built as ``beside`` next to the one there, that one dropped,
    ``beside`` renamed; nothing when the index already has them."""
    current = (
        op.get_bind()
        .exec_driver_sql(
            "SELECT array_agg(a.attname ORDER BY k.n) FROM pg_index i "
            "CROSS JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, n) "
            "JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum "
            f"WHERE i.indexrelid = to_regclass('{DUE_INDEX}')"
        )
        .scalar()
    )
    if current == columns:
        return
    create_index(beside, "event_reminders", ", ".join(columns), where=PENDING)
    drop_index(DUE_INDEX)
    run_ddl(
        f"ALTER INDEX {beside} RENAME TO {DUE_INDEX}", table=beside, lock=SHARE_UPDATE_EXCLUSIVE
    )
