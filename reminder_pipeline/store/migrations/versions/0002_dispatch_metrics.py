"""Dispatch metrics ledger: dispatch_cycles (a row per cycle), dispatch_metric_totals (rolled up).

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

NOW = sa.text("now()")
EMPTY_COUNTS = sa.text("'{}'::bigint[]")


def upgrade() -> None:
    op.create_table(
        "dispatch_cycles",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=False), nullable=False),
        sa.Column("run_id", sa.Text(), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), server_default=NOW, nullable=False),
        sa.Column("as_of", sa.DateTime(timezone=True), nullable=True),
        sa.Column("succeeded", sa.Boolean(), nullable=False),
        sa.Column("sent", sa.Integer(), server_default="0", nullable=False),
        sa.Column("skipped", sa.Integer(), server_default="0", nullable=False),
        sa.Column("skipped_locked", sa.Integer(), server_default="0", nullable=False),
        sa.Column("failed", sa.Integer(), server_default="0", nullable=False),
        sa.Column("published", sa.Integer(), server_default="0", nullable=False),
        sa.Column("publish_failed", sa.Integer(), server_default="0", nullable=False),
        sa.Column("batches", sa.Integer(), server_default="0", nullable=False),
        sa.Column("duration_seconds", sa.Double(), nullable=False),
        sa.Column("duration_buckets", sa.ARRAY(sa.BigInteger()), nullable=False),
        sa.Column("lateness_sum", sa.Double(), server_default="0", nullable=False),
        sa.Column("lateness_count", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("lateness_buckets", sa.ARRAY(sa.BigInteger()), nullable=False),
        sa.Column("error_kind", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_dispatch_cycles"),
    )
    op.create_index("ix_dispatch_cycles_finished_at", "dispatch_cycles", ["finished_at"])
    op.create_table(
        "dispatch_metric_totals",
        sa.Column("id", sa.SmallInteger(), autoincrement=False, nullable=False),
        sa.Column("cycles", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("cycles_failed", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("sent", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("skipped", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("skipped_locked", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("failed", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("published", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("publish_failed", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("duration_sum", sa.Double(), server_default="0", nullable=False),
        sa.Column(
            "duration_buckets",
            sa.ARRAY(sa.BigInteger()),
            server_default=EMPTY_COUNTS,
            nullable=False,
        ),
        sa.Column("lateness_sum", sa.Double(), server_default="0", nullable=False),
        sa.Column("lateness_count", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column(
            "lateness_buckets",
            sa.ARRAY(sa.BigInteger()),
            server_default=EMPTY_COUNTS,
            nullable=False,
        ),
        sa.Column("last_success_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("rolled_up_until", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint("id = 1", name="ck_dispatch_metric_totals_singleton"),
        sa.PrimaryKeyConstraint("id", name="pk_dispatch_metric_totals"),
    )
    # The one totals row exists from the start, so writers only ever UPDATE it.
    op.execute("INSERT INTO dispatch_metric_totals (id) VALUES (1)")


def downgrade() -> None:
    op.drop_table("dispatch_metric_totals")
    op.drop_index("ix_dispatch_cycles_finished_at", table_name="dispatch_cycles")
    op.drop_table("dispatch_cycles")
