"""PLACEHOLDER (replaced by the online migration of branch i41-migrations): scan positions and
the poison index.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-07
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import UUID

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Create them."""
    op.create_index(
        "ix_event_reminders_poison",
        "event_reminders",
        ["due_at", "id"],
        postgresql_where=sa.text("status = 'Pending' AND attempts > 0"),
    )
    op.create_table(
        "due_scan_position",
        sa.Column("id", sa.SmallInteger, primary_key=True, autoincrement=False),
        sa.Column("due_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("reminder_id", UUID(as_uuid=True), nullable=False),
        sa.Column("next_xid", sa.BigInteger, nullable=False),
        sa.Column("swept_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column(
            "updated_at",
            sa.DateTime(timezone=True),
            nullable=False,
            server_default=sa.text("now()"),
        ),
        sa.CheckConstraint("id = 1", name="ck_due_scan_position_singleton"),
    )
    op.create_table(
        "outbox_relay_position",
        sa.Column("id", sa.SmallInteger, primary_key=True, autoincrement=False),
        sa.Column("low_water", sa.BigInteger, nullable=False),
        sa.Column(
            "updated_at",
            sa.DateTime(timezone=True),
            nullable=False,
            server_default=sa.text("now()"),
        ),
        sa.CheckConstraint("id = 1", name="ck_outbox_relay_position_singleton"),
    )


def downgrade() -> None:
    """Drop them."""
    op.drop_table("outbox_relay_position")
    op.drop_table("due_scan_position")
    op.drop_index("ix_event_reminders_poison", table_name="event_reminders")
