"""Every setting that takes a database URL accepts SQLAlchemy's multi-host form (the app's engine on
psycopg 3, Dagster's storage on psycopg2, the consumer's de-dup store on libpq's own form), and
refuses a host list libpq would misread in one line; every connection carries its bounds
(keepalives, tcp_user_timeout, a statement timeout, a client read bound), the URL's own settings
winning. The tests marked ``server`` check on a real PostgreSQL: a connection through a host list
whose first server is down, the settings each session shows, the server's cancel before the read
bound."""

from __future__ import annotations

import psycopg
import pytest
import sqlalchemy as sa
from sqlalchemy.engine import make_url

from reminder_pipeline.config import (
    ConfigError,
    Settings,
    libpq_url,
    mask_url,
    validate_database_url,
)
from reminder_pipeline.consumer.dedup import psycopg_dsn
from reminder_pipeline.local.servers import free_port
from reminder_pipeline.store import pg_client
from reminder_pipeline.store.engine import (
    STATEMENT_TIMEOUT_MS,
    dagster_storage_url,
    make_engine,
    migration_bounds,
)

MULTI = (
    "postgresql+psycopg://app:hunter2@/calendar"
    "?host=db-a.internal:5432&host=db-b.internal:5433&target_session_attrs=read-write"
)


def _libpq_params(engine: sa.Engine) -> dict[str, object]:
    _, params = engine.dialect.create_connect_args(engine.url)
    return params


def test_the_multi_host_form_reaches_libpq_as_its_host_and_port_lists_on_both_drivers():
    assert validate_database_url(MULTI) == MULTI
    app = make_engine(MULTI)
    dagster = sa.create_engine(dagster_storage_url(MULTI))
    try:
        for engine in (app, dagster):
            params = _libpq_params(engine)
            assert params["host"] == "db-a.internal,db-b.internal"
            assert params["port"] == "5432,5433"
            assert params["target_session_attrs"] == "read-write"
        assert dagster.dialect.driver == "psycopg2" and app.dialect.driver == "psycopg"
    finally:
        app.dispose()
        dagster.dispose()


def test_libpqs_own_list_form_is_accepted_too():
    url = "postgresql+psycopg://app@/calendar?host=db-a,db-b&port=5432,5433"
    validate_database_url(url)
    engine = make_engine(url)
    try:
        params = _libpq_params(engine)
        assert (params["host"], params["port"]) == ("db-a,db-b", "5432,5433")
    finally:
        engine.dispose()


@pytest.mark.parametrize(
    "url",
    [
        # libpq's host= takes no ports: SQLAlchemy would pass "db-a:5432,db-b:5433" as a name.
        "postgresql+psycopg://app@/calendar?host=db-a:5432,db-b:5433",
        # SQLAlchemy cannot parse libpq's list in the authority (its int() of the port fails).
        "postgresql+psycopg://app@db-a:5432,db-b:5433/calendar",
        "postgresql+psycopg://app@/calendar?host=db-a:5432&host=db-b:5433&port=5432",
        "postgresql+psycopg://app@/calendar?host=db-a,db-b&port=5432",
    ],
)
def test_a_host_list_libpq_would_misread_is_refused_in_one_line_naming_the_form(url):
    with pytest.raises(ConfigError) as info:
        validate_database_url(url, "DAGSTER_PG_URL")
    message = str(info.value)
    assert message.startswith("DAGSTER_PG_URL")
    assert "?host=HostA:PortA&host=HostB:PortB" in message and "\n" not in message


def test_the_dagster_storage_url_refuses_it_as_well():
    with pytest.raises(ConfigError, match=r"^DAGSTER_PG_URL: a comma list in one host="):
        dagster_storage_url("postgresql+psycopg2://d@/dagster?host=a:1,b:2")


def test_printed_urls_hide_the_password_and_keep_the_hosts_readable():
    shown = mask_url(MULTI)
    assert "hunter2" not in shown
    assert "host=db-a.internal:5432&host=db-b.internal:5433" in shown
    # What psql and the de-dup store (libpq) take: the driver gone, libpq's host and port lists.
    assert libpq_url(MULTI) == (
        "postgresql://app:hunter2@/calendar"
        "?host=db-a.internal,db-b.internal&port=5432,5433&target_session_attrs=read-write"
    )
    assert psycopg_dsn(MULTI) == libpq_url(MULTI)
    assert libpq_url("postgresql+psycopg://app@db:5432/c?host=/run/pg") == (
        "postgresql://app@db:5432/c?host=/run/pg"
    )


def test_the_dedup_store_refuses_the_comma_list_with_ports_too():
    with pytest.raises(ConfigError, match=r"^--dedup-url: a comma list in one host="):
        psycopg_dsn("postgresql://dedup@/notifications?host=a:1,b:2")
    # libpq's own list in the authority is libpq's to check: passed through.
    assert psycopg_dsn("postgresql://dedup@a:1,b:2/n") == "postgresql://dedup@a:1,b:2/n"


def _multi_host(url: str) -> str:
    """``url`` with a first server that refuses connections, then the real one."""
    parsed = make_url(url)
    dead = f"127.0.0.1:{free_port()}"
    live = f"{parsed.host}:{parsed.port}"
    base = parsed.render_as_string(hide_password=False).split("@", 1)[0]
    return f"{base}@/{parsed.database}?host={dead}&host={live}&target_session_attrs=read-write"


def test_each_client_connects_through_the_multi_host_form(pg_admin_url):
    url = _multi_host(pg_admin_url)
    app = make_engine(url, pool_size=1)
    # dagster-postgres builds its engine from postgres_url this way (create_pg_engine).
    from dagster_postgres.utils import create_pg_engine

    dagster = create_pg_engine(dagster_storage_url(url))
    try:
        for engine in (app, dagster):
            with engine.connect() as conn:
                assert conn.exec_driver_sql("SELECT pg_is_in_recovery()").scalar() is False
    finally:
        app.dispose()
        dagster.dispose()
    with psycopg.connect(psycopg_dsn(url), connect_timeout=10) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)


# -- the bounds ------------------------------------------------------------------------------


def test_a_urls_own_settings_win_over_the_bounds_and_applying_them_twice_changes_nothing():
    params = pg_client.bounded_params(
        {"keepalives_idle": "30", "options": "-c statement_timeout=2000 --search_path=app"},
        10_000,
        "TimeZone=UTC",
    )
    assert params["keepalives_idle"] == "30"  # the URL's
    assert params["tcp_user_timeout"] == pg_client.TCP_USER_TIMEOUT_MS
    options = params["options"]
    assert "statement_timeout=10000" not in options and options.endswith(
        "-c statement_timeout=2000 --search_path=app"
    )
    assert "-c tcp_keepalives_count=3" in options and "-c TimeZone=UTC" in options
    url = "postgresql+psycopg2://d@db/dagster?options=-csearch_path%3Ddagster"
    once = dagster_storage_url(url)
    assert dagster_storage_url(once) == once
    query = make_url(once).query
    assert query["tcp_user_timeout"] == str(pg_client.TCP_USER_TIMEOUT_MS)
    assert query["keepalives"] == "1" and "-csearch_path=dagster" in query["options"]
    assert "idle_in_transaction_session_timeout" not in query["options"]  # Dagster's own
    # libpq reads the same options from the URL (it decodes %20 as a space, never "+").
    options = psycopg.conninfo.conninfo_to_dict(libpq_url(once))["options"]
    assert options == query["options"] and "+" not in once.partition("?")[2]


def test_the_read_bound_is_the_statement_timeout_plus_a_margin_and_none_without_one():
    assert pg_client.read_bound(10_000) == 10 + pg_client.READ_MARGIN_SECONDS
    assert pg_client.read_bound(0) is None
    # Noticed within 30 s: the dispatcher's bound and one reconnect attempt.
    assert pg_client.read_bound(STATEMENT_TIMEOUT_MS) + pg_client.CONNECT_TIMEOUT_SECONDS <= 30


def test_every_kafka_client_bounds_a_silent_broker():
    config = Settings.from_env({"KAFKA_BOOTSTRAP_SERVERS": "k:9092"}).kafka().client_config()
    assert config["socket.keepalive.enable"] is True
    assert config["socket.timeout.ms"] == 15_000
    assert config["socket.connection.setup.timeout.ms"] == 5_000


def test_each_session_carries_the_bounds_on_the_server_side(database_url: str) -> None:
    app = make_engine(database_url, pool_size=1)
    dagster = sa.create_engine(dagster_storage_url(database_url))
    names = (
        "tcp_keepalives_idle",
        "tcp_keepalives_interval",
        "tcp_keepalives_count",
        "tcp_user_timeout",
        "statement_timeout",
        "idle_in_transaction_session_timeout",
    )
    try:
        for engine, statement, idle in ((app, "10s", "30s"), (dagster, "1min", "0")):
            with engine.connect() as conn:
                shown = [conn.exec_driver_sql(f"SHOW {name}").scalar() for name in names]
            assert shown == ["10", "5", "3", "25000", statement, idle], engine.dialect.driver
        with app.connect() as conn:
            assert conn.connection.dbapi_connection.read_timeout == 15.0  # type: ignore[union-attr]
            # A migration's own, for its session (an autocommit block commits its transaction),
            # which ends with the block: the next statement is a new session's, bounded as ever.
            with migration_bounds(conn):
                pid = conn.exec_driver_sql("SELECT pg_backend_pid()").scalar()
                conn.commit()
                assert conn.exec_driver_sql("SHOW statement_timeout").scalar() == "1h"
                assert conn.connection.dbapi_connection.read_timeout == 3605.0  # type: ignore[union-attr]
            assert conn.exec_driver_sql("SELECT pg_backend_pid()").scalar() != pid
            assert conn.connection.dbapi_connection.read_timeout == 15.0  # type: ignore[union-attr]
            assert conn.exec_driver_sql("SHOW statement_timeout").scalar() == "10s"
    finally:
        app.dispose()
        dagster.dispose()


def test_a_statement_past_its_timeout_is_the_servers_cancel_and_the_connection_lives(
    database_url: str,
) -> None:
    """The server's own cancel comes before the read bound: a slow statement is not taken for a
    silent database."""
    engine = make_engine(database_url, pool_size=1, statement_timeout_ms=1000)
    try:
        with engine.connect() as conn:
            with pytest.raises(sa.exc.OperationalError, match="canceling statement due to"):
                conn.exec_driver_sql("SELECT pg_sleep(3)")
            conn.rollback()
            assert not conn.invalidated and conn.exec_driver_sql("SELECT 1").scalar() == 1
    finally:
        engine.dispose()
