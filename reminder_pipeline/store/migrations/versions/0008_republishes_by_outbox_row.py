"""An index for the purge of re-publish records: ``outbox_republishes`` by ``outbox_id``.

The outbox purge deletes the re-publish records of the rows it purges in the same statement
(``PURGE_PUBLISHED_OUTBOX``: the copies of a message the outbox no longer holds go with it).
Without an index that delete reads the whole of ``outbox_republishes`` for every purge batch,
and a re-published day adds a record per message.

Built in the migration's transaction; on a very large table build it first by hand with
``CREATE INDEX CONCURRENTLY ix_outbox_republishes_outbox_id ON outbox_republishes
(outbox_id)``: this migration then finds it and only records the revision.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-03
"""

from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

INDEX = "ix_outbox_republishes_outbox_id"


def upgrade() -> None:
    """Create the index (unless an operator built it concurrently beforehand)."""
    op.create_index(INDEX, "outbox_republishes", ["outbox_id"], if_not_exists=True)


def downgrade() -> None:
    """Drop it."""
    op.drop_index(INDEX, table_name="outbox_republishes")
