"""Applying the Alembic migrations programmatically (``reminder-pipeline db upgrade``)."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.script.revision import RevisionError
from alembic.util.exc import CommandError
from sqlalchemy import text
from sqlalchemy.engine import Connection, Engine

from ..logs import event
from .engine import MIGRATION_STATEMENT_TIMEOUT_MS, migration_bounds
from .migrations.online_ddl import LockNotGranted

log = logging.getLogger(__name__)

MIGRATIONS = Path(__file__).parent / "migrations"


def alembic_config(connection: Connection) -> Config:
    """An Alembic config bound to ``connection`` (no alembic.ini needed)."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.attributes["connection"] = connection
    return config


#: Serialises migration runs (several processes starting at once): a session-level advisory
#: lock, since an autocommit block commits the migration's transaction mid-way.
MIGRATION_LOCK_KEY = 7263001
#: What a DBA sees in pg_stat_activity.application_name while a migration runs.
APPLICATION_NAME = "reminder-pipeline migration"
#: How often a run waiting for another one tries the migration lock again, and for how long.
LOCK_POLL_SECONDS = 0.5
MIGRATION_LOCK_WAIT_SECONDS = MIGRATION_STATEMENT_TIMEOUT_MS / 1000

TRY_MIGRATION_LOCK = text("SELECT pg_try_advisory_lock(:key)")
# The session holding the migration lock: another migration run.
MIGRATION_LOCK_HOLDER = text(
    """
    SELECT l.pid, a.application_name
      FROM pg_locks l LEFT JOIN pg_stat_activity a ON a.pid = l.pid
     WHERE l.locktype = 'advisory' AND l.classid = 0 AND l.objid = :key AND l.granted
       AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
    """
)


@contextlib.contextmanager
def _migration_session(engine: Engine) -> Iterator[Connection]:
    """A session of its own for one migration run, named, bounded for long statements, holding
    the migration lock; the session (and the lock with it) ends on the way out.

    Each migration runs in its own transaction except its autocommit blocks
    (:mod:`.migrations.online_ddl`), so a failure half-way leaves ``alembic_version`` at the last
    completed revision and a second run finishes the job.
    """
    with engine.connect() as connection, migration_bounds(connection):
        connection.exec_driver_sql(f"SET application_name = '{APPLICATION_NAME}'")
        connection.commit()
        _take_migration_lock(connection)
        yield connection
        connection.commit()


def _take_migration_lock(connection: Connection) -> None:
    """Take the migration lock, trying again while another run holds it.

    Not ``pg_advisory_lock``: a session blocked in it holds a snapshot, which the other run's
    ``CREATE INDEX CONCURRENTLY`` waits for while that run holds the lock (a deadlock the server
    ends by failing one of them). Between tries this session is in no transaction.
    """
    deadline = time.monotonic() + MIGRATION_LOCK_WAIT_SECONDS
    holder = None
    while not connection.execute(TRY_MIGRATION_LOCK, {"key": MIGRATION_LOCK_KEY}).scalar():
        if holder is None:
            row = connection.execute(MIGRATION_LOCK_HOLDER, {"key": MIGRATION_LOCK_KEY}).first()
            holder = f"pid {row.pid} ({row.application_name})" if row else "a session now gone"
            event(log, logging.INFO, "waiting for another migration run", holder=holder)
        connection.commit()
        if time.monotonic() > deadline:
            raise LockNotGranted(
                f"the migration lock was held by another migration run ({holder}) for "
                f"{MIGRATION_LOCK_WAIT_SECONDS:.0f} s: nothing migrated; "
                "run it again once that one ended"
            )
        time.sleep(LOCK_POLL_SECONDS)
    connection.commit()


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Migrate the database forward to ``revision``; a no-op when already there."""
    with _migration_session(engine) as connection:
        command.upgrade(alembic_config(connection), revision)


class BadRevision(ValueError):
    """A revision Alembic cannot resolve to a downgrade target; the message is one line."""


def downgrade(engine: Engine, revision: str) -> None:
    """Migrate the database back to ``revision``; a bad one raises :class:`BadRevision`.

    Alembic resolves the target before it runs a step: a refused revision changed nothing.
    """
    try:
        with _migration_session(engine) as connection:
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
