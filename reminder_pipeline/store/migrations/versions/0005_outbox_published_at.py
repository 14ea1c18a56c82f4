"""An index for the outbox purge: published rows by ``published_at``.

* ``ix_outbox_published_at`` on ``outbox (published_at) WHERE published_at IS NOT NULL``: the
  purge (``PURGE_PUBLISHED_OUTBOX``) takes the rows published before its cutoff, oldest first,
  a batch per transaction. Without an index its last call, the one that finds nothing old
  enough, walked the whole outbox (199 ms and 40,711 buffers at 185,000 rows); on the index it
  reads a few pages whatever the outbox holds. Unpublished rows (the relay's) have no entry.

Built CONCURRENTLY (``online_ddl``): the dispatcher's outbox writes and the relay's marks never
wait for it; run again after a failed build, it builds the index anew (an index built by hand
beforehand with this name is found and kept).

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-02
"""

from reminder_pipeline.store.migrations.online_ddl import create_index, drop_index

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

INDEX = "ix_outbox_published_at"


def upgrade() -> None:
    """Build the partial index concurrently."""
    create_index(INDEX, "outbox", "published_at", where="published_at IS NOT NULL")


def downgrade() -> None:
    """Drop it concurrently."""
    drop_index(INDEX)
