"""The application's SQLAlchemy engine (psycopg 3)."""

from __future__ import annotations

import contextlib

from sqlalchemy import create_engine
from sqlalchemy.engine import Engine, make_url

from ..config import mask_secrets, mask_url, validate_database_url

#: Pinned, not left to the server's ``default_transaction_isolation``: the cycle's correctness
#: argument (lock, re-read under the lock, decide on that state) is made for READ COMMITTED, where
#: a re-read after the lock sees the latest committed row; under REPEATABLE READ or SERIALIZABLE
#: a concurrent cancel would turn into serialization failures instead.
ISOLATION_LEVEL = "READ COMMITTED"


def make_engine(
    url: str, *, pool_size: int = 5, application_name: str = "reminder-pipeline"
) -> Engine:
    """An engine for ``url``; psycopg2 URLs are moved to psycopg 3, the app's driver."""
    validate_database_url(url)
    parsed = make_url(url).set(drivername="postgresql+psycopg")
    return create_engine(
        parsed,
        isolation_level=ISOLATION_LEVEL,
        # Error messages carry the statement but never its parameters (ids, payloads, errors
        # text): they end up in logs, in Dagster's event log and on operators' terminals.
        hide_parameters=True,
        pool_size=pool_size,
        max_overflow=5,
        pool_pre_ping=True,
        connect_args={
            "application_name": application_name,
            "connect_timeout": 10,
            # A dispatcher that dies or is cut off mid-statement must not keep its row locks: the
            # server checks the client every 5 s even while a query runs, and ends a session left
            # idle inside a transaction after 2 minutes (ours last milliseconds).
            # Timestamps come back in UTC whatever the server's default zone (no conversion per
            # row when payloads are built).
            "options": "-c client_connection_check_interval=5000"
            " -c idle_in_transaction_session_timeout=120000 -c TimeZone=UTC",
        },
    )


class DatabaseUnavailable(ConnectionError):
    """The database named by DATABASE_URL cannot be reached; the message is one line."""


def check_connection(engine: Engine, setting: str = "DATABASE_URL") -> None:
    """Connect once and run ``SELECT 1``; raise :class:`DatabaseUnavailable` naming ``setting``."""
    from sqlalchemy import exc, text

    url = mask_url(engine.url.render_as_string(hide_password=False))
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
    except exc.DBAPIError as error:
        reason = str(error.orig).strip().splitlines()[0] if error.orig else type(error).__name__
        raise DatabaseUnavailable(
            f"{setting}: cannot connect to {url}: {mask_secrets(reason)}"
        ) from None


def dagster_storage_url(url: str, database: str | None = None) -> str:
    """``url`` (any PostgreSQL driver) as dagster-postgres needs it: ``postgresql+psycopg2://``.

    A multi-host URL keeps its hosts: dagster-postgres hands the URL to SQLAlchemy's psycopg2
    dialect, which passes libpq the host list and ``target_session_attrs``.
    """
    validate_database_url(url, "DAGSTER_PG_URL")
    parsed = make_url(url).set(drivername="postgresql+psycopg2")
    if database is not None:
        parsed = parsed.set(database=database)
    return parsed.render_as_string(hide_password=False)


def create_database(admin_url: str, name: str) -> None:
    """``CREATE DATABASE name`` on the server of ``admin_url`` unless it exists (races are fine)."""
    import psycopg
    from psycopg import errors, sql

    dsn = make_url(admin_url).set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(dsn, autocommit=True, connect_timeout=10) as conn:
        if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone():
            return
        # Created meanwhile by another process: as good.
        with contextlib.suppress(errors.DuplicateDatabase, errors.UniqueViolation):
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
