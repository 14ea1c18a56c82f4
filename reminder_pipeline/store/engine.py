"""The application's SQLAlchemy engine (psycopg 3)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from sqlalchemy import create_engine, event
from sqlalchemy.engine import Connection, Engine, make_url

from ..config import mask_secrets, mask_url, validate_database_url
from . import pg_client

#: Pinned, not left to the server's ``default_transaction_isolation``: the cycle's correctness
#: argument (lock, re-read under the lock, decide on that state) is made for READ COMMITTED, where
#: a re-read after the lock sees the latest committed row; under REPEATABLE READ or SERIALIZABLE
#: a concurrent cancel would turn into serialization failures instead.
ISOLATION_LEVEL = "READ COMMITTED"


#: The dispatcher's statements (a batch of up to 10,000 rows takes about a second, a relay
#: mark well under one) and the operator commands' (index-backed, or in short batches). With
#: the read bound (pg_client.READ_MARGIN_SECONDS) a silent database is noticed within 15 s.
STATEMENT_TIMEOUT_MS = 10 * 1000
#: A migration may rebuild an index on a large table: one hour (:func:`migration_bounds`).
MIGRATION_STATEMENT_TIMEOUT_MS = 3_600_000
#: Dagster's own statements (runs, event log, ticks; the run retention pass's deletes).
DAGSTER_STATEMENT_TIMEOUT_MS = 60_000


def make_engine(
    url: str,
    *,
    pool_size: int = 5,
    application_name: str = "reminder-pipeline",
    statement_timeout_ms: int = STATEMENT_TIMEOUT_MS,
    connect_timeout: int = pg_client.CONNECT_TIMEOUT_SECONDS,
) -> Engine:
    """An engine for ``url``; psycopg2 URLs are moved to psycopg 3, the app's driver.

    Every connection is bounded (:mod:`reminder_pipeline.store.pg_client`): keepalives and
    ``tcp_user_timeout`` both ends, ``statement_timeout_ms`` on the server, and no wait for an
    answer past it plus a margin; settings the URL's query gives itself win.
    """
    validate_database_url(url)
    parsed = make_url(url).set(drivername="postgresql+psycopg")
    engine = create_engine(
        parsed,
        isolation_level=ISOLATION_LEVEL,
        # Error messages carry the statement but never its parameters (ids, payloads, errors
        # text): they end up in logs, in Dagster's event log and on operators' terminals.
        hide_parameters=True,
        pool_size=pool_size,
        max_overflow=5,
        pool_pre_ping=True,
    )
    read_timeout = pg_client.read_bound(statement_timeout_ms)

    @event.listens_for(engine, "do_connect")
    def _bounded(
        _dialect: object, _record: object, cargs: list[Any], cparams: dict[str, Any]
    ) -> pg_client.BoundedConnection[Any]:
        params = pg_client.bounded_params(
            cparams,
            statement_timeout_ms,
            # Timestamps come back in UTC whatever the server's default zone (no conversion per
            # row when payloads are built).
            "TimeZone=UTC",
            connect_timeout=connect_timeout,
        )
        params.setdefault("application_name", application_name)
        return pg_client.connect_bounded(read_timeout, *cargs, **params)

    return engine


@contextlib.contextmanager
def migration_bounds(connection: Connection) -> Iterator[None]:
    """For a migration's session: its statements may run for :data:`MIGRATION_STATEMENT_TIMEOUT_MS`
    (server and client side alike), and the session ends on the way out.

    The session's, not one transaction's: an autocommit block (``CREATE INDEX CONCURRENTLY``)
    commits the migration's transaction and runs outside any. Ending the session leaves no pooled
    connection with the long bound (nor whatever else the migration set on it).
    """
    dbapi = connection.connection.dbapi_connection
    connection.exec_driver_sql(f"SET statement_timeout = {MIGRATION_STATEMENT_TIMEOUT_MS}")
    if isinstance(dbapi, pg_client.BoundedConnection):
        dbapi.read_timeout = pg_client.read_bound(MIGRATION_STATEMENT_TIMEOUT_MS)
    try:
        yield
    finally:
        connection.invalidate()
        connection.rollback()  # the connection's own state: the next use starts a new session


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
    """``url`` (any PostgreSQL driver) as dagster-postgres needs it: ``postgresql+psycopg2://``,
    with the connection bounds it does not set itself in its query.

    dagster-postgres hands the URL to SQLAlchemy's psycopg2 dialect, which passes the query to
    libpq: the keepalives, ``tcp_user_timeout`` and the session's ``options``
    (:data:`DAGSTER_STATEMENT_TIMEOUT_MS`), and a multi-host URL's host list and
    ``target_session_attrs``.
    """
    validate_database_url(url, "DAGSTER_PG_URL")
    parsed = make_url(url).set(drivername="postgresql+psycopg2")
    if database is not None:
        parsed = parsed.set(database=database)
    given = dict(parsed.query)
    # psycopg2 blocks inside libpq: no client read bound, the server's statement timeout only.
    # Dagster's transactions are its own: no idle-in-transaction limit imposed on them.
    params = pg_client.bounded_params(
        given, DAGSTER_STATEMENT_TIMEOUT_MS, idle_in_transaction=False
    )
    added = {key: str(value) for key, value in params.items() if key not in given}
    added["options"] = str(params["options"])
    rendered = parsed.update_query_dict(added).render_as_string(hide_password=False)
    # SQLAlchemy writes a space as "+", which libpq (psql, psycopg.connect) does not decode; a
    # "+" of a value is written %2B, so every "+" of the query is a space.
    path, sep, query = rendered.partition("?")
    return path + sep + query.replace("+", "%20")


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
