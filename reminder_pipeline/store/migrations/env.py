"""Alembic environment: runs on the connection that :mod:`reminder_pipeline.store.migrate` gives."""

from alembic import context

from reminder_pipeline.store.tables import metadata

connection = context.config.attributes["connection"]
context.configure(connection=connection, target_metadata=metadata, transaction_per_migration=True)
with context.begin_transaction():
    context.run_migrations()
