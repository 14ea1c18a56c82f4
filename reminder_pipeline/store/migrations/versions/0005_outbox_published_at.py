"""An index for the outbox purge: published rows by ``published_at``.

* ``ix_outbox_published_at`` on ``outbox (published_at) WHERE published_at IS NOT NULL``: the
  purge (``PURGE_PUBLISHED_OUTBOX``) takes the rows published before its cutoff, oldest first,
  a batch per transaction. Without an index its last call, the one that finds nothing old
  enough, walked the whole outbox (199 ms and 40,711 buffers at 185,000 rows); on the index it
  reads a few pages whatever the outbox holds. Unpublished rows (the relay's) have no entry.

The index is built in the migration's transaction (writes on ``outbox`` wait for it). On a very
large outbox, build it first by hand with ``CREATE INDEX CONCURRENTLY ix_outbox_published_at ON
outbox (published_at) WHERE published_at IS NOT NULL``: this migration then finds it and only
records the revision.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-02
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

INDEX = "ix_outbox_published_at"
PUBLISHED = sa.text("published_at IS NOT NULL")


def upgrade() -> None:
    """Create the partial index (unless an operator built it concurrently beforehand)."""
    op.create_index(
        INDEX, "outbox", ["published_at"], postgresql_where=PUBLISHED, if_not_exists=True
    )


def downgrade() -> None:
    """Drop it."""
    op.drop_index(INDEX, table_name="outbox", postgresql_where=PUBLISHED)
