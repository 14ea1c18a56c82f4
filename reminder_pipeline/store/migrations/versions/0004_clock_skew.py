"""The dispatching host's clock skew in the metrics ledger.

* ``dispatch_cycles.clock_skew_seconds``: how far the host that started the cycle was ahead of
  the database server's clock (seconds; negative = behind). A cycle reads its times from the
  database; the skew is recorded so a host with a wrong clock is seen (a gauge and a warning
  check), never trusted. NULL for cycles recorded before.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Add the column (nullable: no table rewrite)."""
    op.add_column("dispatch_cycles", sa.Column("clock_skew_seconds", sa.Double, nullable=True))


def downgrade() -> None:
    """Drop it."""
    op.drop_column("dispatch_cycles", "clock_skew_seconds")
