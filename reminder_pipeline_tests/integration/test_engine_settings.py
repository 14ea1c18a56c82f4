"""The application engine on a real PostgreSQL: READ COMMITTED whatever the server's default, and
database errors that carry no bound parameters (ids, payloads) and no password."""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import make_url

from reminder_pipeline.local.servers import free_port
from reminder_pipeline.store.engine import DatabaseUnavailable, check_connection, make_engine


def test_the_isolation_level_is_read_committed_even_when_the_database_defaults_otherwise(
    engine, database_url
):
    name = make_url(database_url).database
    with engine.begin() as conn:
        conn.exec_driver_sql(
            f"ALTER DATABASE \"{name}\" SET default_transaction_isolation = 'serializable'"
        )
    pinned = make_engine(database_url)
    try:
        with pinned.connect() as conn:
            assert conn.exec_driver_sql("SHOW transaction_isolation").scalar() == "read committed"
        with pinned.begin() as conn:
            assert conn.exec_driver_sql("SHOW transaction_isolation").scalar() == "read committed"
    finally:
        pinned.dispose()
    # The server's default really is different: a plain connection gets it.
    plain = sa.create_engine(make_url(database_url).set(drivername="postgresql+psycopg"))
    try:
        with plain.connect() as conn:
            assert conn.exec_driver_sql("SHOW transaction_isolation").scalar() == "serializable"
    finally:
        plain.dispose()


def test_database_errors_hide_their_parameters(engine):
    secret = "reminder-3f2a-not-for-logs"
    with pytest.raises(sa.exc.DBAPIError) as info, engine.connect() as conn:
        # Fails on its own (the server does not quote the value back): only SQLAlchemy could
        # show the parameters, and it must not (a batch's parameter is the whole batch).
        conn.execute(sa.text("SELECT CAST(:value AS text), 1 / 0"), {"value": secret})
    message = str(info.value)
    assert "SELECT CAST" in message  # the statement is still there to debug with
    assert secret not in message and "hidden due to hide_parameters" in message


def test_an_unreachable_database_is_one_line_without_the_password():
    url = f"postgresql+psycopg://app:hunter2@127.0.0.1:{free_port()}/calendar"
    engine = make_engine(url)
    try:
        with pytest.raises(DatabaseUnavailable) as info:
            check_connection(engine)
    finally:
        engine.dispose()
    message = str(info.value)
    assert message.startswith("DATABASE_URL: cannot connect to postgresql+psycopg://app:***@")
    assert "hunter2" not in message and "\n" not in message
