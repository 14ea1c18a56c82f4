"""The exporter's read-only login, made as compose makes it, in the real PostgreSQL.

compose's db-roles step (the dispatcher's group role and logins), then its db-reader-role step
(docker/postgres/roles/reader_role.sql through psql, names and password from the environment),
against a migrated database: the exporter's whole scrape (read_snapshot) works as that login,
and it can write nothing and read no event's title.
"""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Iterator

import psycopg
import pytest
import sqlalchemy as sa
import yaml
from sqlalchemy.engine import make_url

from reminder_pipeline.observability.exporter import read_snapshot
from reminder_pipeline.store.engine import make_engine

from ..integration.test_least_privilege import (  # noqa: F401 - a fixture, used by name
    COMPOSE,
    Deployment,
    deployment,
    psql,
)

SCRIPT = COMPOSE.parent / "postgres" / "roles" / "reader_role.sql"


@pytest.fixture
def reader_url(deployment: Deployment, database_url: str) -> Iterator[str]:  # noqa: F811
    service = yaml.safe_load(COMPOSE.read_text())["services"]["db-reader-role"]
    assert service["entrypoint"][-1] == "/roles/reader_role.sql"
    login, password = f"rp_reader_{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    owner = make_url(database_url)
    env = {
        **os.environ,
        "PGHOST": str(owner.host),
        "PGPORT": str(owner.port),
        "PGUSER": str(owner.username),
        "PGDATABASE": str(owner.database),
        "PGPASSWORD": owner.password or "",
        "REMINDER_READER_DB_USER": login,
        "REMINDER_READER_DB_PASSWORD": password,
    }
    for _ in range(2):  # compose runs it on every start: idempotent
        done = subprocess.run(
            [str(psql()), "-v", "ON_ERROR_STOP=1", "-f", str(SCRIPT)],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stdout + done.stderr
    yield owner.set(username=login, password=password).render_as_string(hide_password=False)
    dsn = owner.set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'DROP OWNED BY "{login}"')
        conn.execute(f'DROP ROLE "{login}"')


def test_the_exporter_scrapes_as_the_reader_and_can_write_nothing(reader_url: str) -> None:
    engine = make_engine(reader_url)
    try:
        snapshot = read_snapshot(engine)
        assert snapshot.totals is not None
        with engine.connect() as conn:
            for statement in (
                "UPDATE event_reminders SET attempts = attempts",
                "DELETE FROM outbox",
                "INSERT INTO dispatch_cycles DEFAULT VALUES",
            ):
                with pytest.raises(sa.exc.DBAPIError) as caught:
                    conn.execute(sa.text(statement))
                conn.rollback()
                assert isinstance(
                    caught.value.orig,
                    psycopg.errors.InsufficientPrivilege | psycopg.errors.ReadOnlySqlTransaction,
                )
            with pytest.raises(sa.exc.DBAPIError) as caught:
                conn.execute(sa.text("SELECT title FROM calendar_events LIMIT 1"))
            assert isinstance(caught.value.orig, psycopg.errors.InsufficientPrivilege)
    finally:
        engine.dispose()
