"""An index for the purge of re-publish records: ``outbox_republishes`` by ``outbox_id``.

The outbox purge deletes the re-publish records of the rows it purges in the same statement
(``PURGE_PUBLISHED_OUTBOX``: the copies of a message the outbox no longer holds go with it).
Without an index that delete reads the whole of ``outbox_republishes`` for every purge batch,
and a re-published day adds a record per message.

Built CONCURRENTLY (``online_ddl``): the purge and the back-fill's records never wait for it; run
again after a failed build, it builds the index anew.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-03
"""

from reminder_pipeline.store.migrations.online_ddl import create_index, drop_index

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

INDEX = "ix_outbox_republishes_outbox_id"


def upgrade() -> None:
    """Build the index concurrently."""
    create_index(INDEX, "outbox_republishes", "outbox_id")


def downgrade() -> None:
    """Drop it concurrently."""
    drop_index(INDEX)
