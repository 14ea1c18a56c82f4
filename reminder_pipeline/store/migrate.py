"""Applying the Alembic migrations programmatically (``reminder-pipeline db upgrade``)."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.script.revision import RevisionError
from alembic.util.exc import CommandError
from sqlalchemy.engine import Connection, Engine

from .engine import migration_bounds

MIGRATIONS = Path(__file__).parent / "migrations"


def alembic_config(connection: Connection) -> Config:
    """An Alembic config bound to ``connection`` (no alembic.ini needed)."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.attributes["connection"] = connection
    return config


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Migrate the database forward to ``revision``; a no-op when already there."""
    with engine.begin() as connection, migration_bounds(connection):
        # Serialise concurrent upgrades (several processes starting at once).
        connection.exec_driver_sql("SELECT pg_advisory_xact_lock(7263001)")
        command.upgrade(alembic_config(connection), revision)


class BadRevision(ValueError):
    """A revision Alembic cannot resolve to a downgrade target; the message is one line."""


def downgrade(engine: Engine, revision: str) -> None:
    """Migrate the database back to ``revision``; a bad one raises :class:`BadRevision`.

    Alembic resolves the target before it runs a step, and the whole downgrade is one
    transaction: a refused revision changed nothing.
    """
    try:
        with engine.begin() as connection, migration_bounds(connection):
            command.downgrade(alembic_config(connection), revision)
    except (CommandError, RevisionError) as error:
        raise BadRevision(" ".join(str(error).split()) or type(error).__name__) from None


def current_revision(engine: Engine) -> str | None:
    """The revision the database is at, or None for an empty database."""
    with engine.connect() as connection:
        return MigrationContext.configure(connection).get_current_revision()


def head_revision() -> str | None:
    """The newest revision shipped in the package."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    return ScriptDirectory.from_config(config).get_current_head()


def pending_upgrade(engine: Engine) -> tuple[str | None, str | None] | None:
    """(current, head) when the database is behind this code's head revision, else None.

    A revision this code does not know is a newer schema (the deploy order is: migrate, then
    roll out the code), so only a schema older than this code is refused.
    """
    current, head = current_revision(engine), head_revision()
    if current == head:
        return None
    if current is None:
        return current, head
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    known = {script.revision for script in ScriptDirectory.from_config(config).walk_revisions()}
    return (current, head) if current in known else None
