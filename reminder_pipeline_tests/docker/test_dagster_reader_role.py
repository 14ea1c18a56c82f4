"""The exporter's read-only login on Dagster's storage, made as compose makes it, in the real PostgreSQL.

compose's db-roles step makes Dagster's storage login the owner of its database; its
db-dagster-reader-role step (docker/postgres/roles/dagster_reader_role.sql through psql, as the
superuser, names and password from the environment) makes the exporter's login there. Dagster's
instance opened as the exporter opens it (the image's dagster.yaml in ``DAGSTER_HOME``,
``DAGSTER_PG_URL`` naming that login) answers ``get_daemon_heartbeats()`` and can write nothing,
whether Dagster created its tables before the script ran or after it (compose's order: the
script runs before Dagster first starts). ``reminder-pipeline metrics`` started before the tables
exist serves everything else, logs that once, and serves the heartbeats once they are there.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest
import sqlalchemy as sa
import yaml
from dagster import DagsterInstance

# Test-only: the record dagster-daemon writes (its module is not public API; the code reads it
# through the public ``instance.get_daemon_heartbeats()``).
from dagster._daemon.types import DaemonHeartbeat
from sqlalchemy.engine import make_url

from reminder_pipeline.defs.heartbeats import instance_heartbeats
from reminder_pipeline.local.servers import free_port
from reminder_pipeline.observability import exporter as exp
from reminder_pipeline_tests.observability.helpers import scrape

from ..integration.test_least_privilege import (  # noqa: F401 - a fixture, used by name
    COMPOSE,
    ROOT,
    Deployment,
    deployment,
    psql,
)

SCRIPT = COMPOSE.parent / "postgres" / "roles" / "dagster_reader_role.sql"
#: The image's instance configuration (docker/Dockerfile copies it into DAGSTER_HOME).
#: The instance config the image copies into its DAGSTER_HOME (docker/Dockerfile).
DAGSTER_YAML = ROOT / "reminder_pipeline" / "dagster_instance.yaml"


def _dsn(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


@pytest.fixture
def make_reader(deployment: Deployment, database_url: str) -> Iterator[Callable[[], str]]:  # noqa: F811
    """Runs compose's db-dagster-reader-role step (twice: it runs on every start) and returns the
    URL the exporter gets; drops the login afterwards."""
    service = yaml.safe_load(COMPOSE.read_text())["services"]["db-dagster-reader-role"]
    assert service["entrypoint"][-1] == "/roles/dagster_reader_role.sql"
    assert service["environment"]["PGDATABASE"] == "dagster"
    login, password = f"rp_dagster_reader_{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    storage = make_url(deployment.dagster_url)
    superuser = make_url(database_url)  # the server's superuser, as POSTGRES_USER in compose
    env = {
        **os.environ,
        "PGHOST": str(superuser.host),
        "PGPORT": str(superuser.port),
        "PGUSER": str(superuser.username),
        "PGPASSWORD": superuser.password or "",
        "PGDATABASE": str(storage.database),
        "DAGSTER_DB_USER": deployment.dagster_login,
        "DAGSTER_READER_DB_USER": login,
        "DAGSTER_READER_DB_PASSWORD": password,
    }
    url = storage.set(username=login, password=password).render_as_string(hide_password=False)

    def run() -> str:
        for _ in range(2):
            done = subprocess.run(
                [str(psql()), "-v", "ON_ERROR_STOP=1", "-f", str(SCRIPT)],
                env=env,
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert done.returncode == 0, done.stdout + done.stderr
        return url

    yield run
    admin = superuser.set(drivername="postgresql")
    with psycopg.connect(
        admin.set(database=storage.database).render_as_string(hide_password=False),
        autocommit=True,
    ) as conn:
        exists = conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (login,)).fetchone()
        if exists:
            conn.execute(f'DROP OWNED BY "{login}"')
            conn.execute(f'DROP ROLE "{login}"')


def dagster_home(path: Path) -> Path:
    """A DAGSTER_HOME as the image has it: the shipped instance config as its dagster.yaml
    (storage from DAGSTER_PG_URL) and nothing else."""
    path.mkdir()
    shutil.copy(DAGSTER_YAML, path / "dagster.yaml")
    return path


def dagster_creates_its_tables_and_beats(
    deployment: Deployment,  # noqa: F811
    tmp_path: Path,
    seconds_ago: float,
) -> None:
    """Dagster's own login opens the instance (creating its tables on the first open, as the
    daemon and webserver do) and writes a scheduler heartbeat, as dagster-daemon does."""
    home = tmp_path / f"owner_home_{uuid.uuid4().hex[:6]}"
    home.mkdir()
    config = {
        "storage": {"postgres": {"postgres_url": deployment.dagster_url}},
        "telemetry": {"enabled": False},
    }
    (home / "dagster.yaml").write_text(yaml.safe_dump(config))
    with DagsterInstance.from_config(str(home)) as instance:
        instance.add_daemon_heartbeat(
            DaemonHeartbeat(time.time() - seconds_ago, "SCHEDULER", "test")
        )


def assert_the_reader_reads_and_writes_nothing(
    reader_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # As the exporter opens it: DAGSTER_HOME and DAGSTER_PG_URL, the reader of defs/heartbeats.py.
    monkeypatch.setenv("DAGSTER_HOME", str(dagster_home(tmp_path / "exporter_home")))
    monkeypatch.setenv("DAGSTER_PG_URL", reader_url)
    read = instance_heartbeats()
    deadline = time.monotonic() + 60
    while True:
        try:  # a read awaits the instance's opening 3 s at most; a loaded machine may take longer
            beats = read()
            break
        except TimeoutError:
            assert time.monotonic() < deadline, "the instance never opened"
    assert set(beats) == {"SCHEDULER"}
    assert 300 <= time.time() - beats["SCHEDULER"] < 400

    instance = DagsterInstance.get()
    with pytest.raises(sa.exc.DBAPIError):
        instance.add_daemon_heartbeat(DaemonHeartbeat(time.time(), "SCHEDULER", "reader"))
    assert instance.get_daemon_heartbeats()["SCHEDULER"].daemon_id == "test"
    # Not read-only by its session setting alone: with it switched off, the grants refuse.
    with psycopg.connect(_dsn(reader_url), autocommit=True) as conn:
        for read_only in ("on", "off"):
            conn.execute(f"SET default_transaction_read_only = {read_only}")
            for statement in (
                "UPDATE daemon_heartbeats SET daemon_id = 'x'",
                "DELETE FROM runs",
                "INSERT INTO kvs (key, value) VALUES ('x', 'y')",
                "CREATE TABLE reader_probe (id int)",
                "DROP TABLE daemon_heartbeats",
            ):
                with pytest.raises(
                    (psycopg.errors.InsufficientPrivilege, psycopg.errors.ReadOnlySqlTransaction)
                ) as caught:
                    conn.execute(statement)
                if read_only == "off":
                    assert isinstance(caught.value, psycopg.errors.InsufficientPrivilege)


def test_the_reader_reads_the_tables_dagster_made_before_the_script(
    deployment: Deployment,  # noqa: F811
    make_reader: Callable[[], str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    dagster_creates_its_tables_and_beats(deployment, tmp_path, seconds_ago=300)
    reader_url = make_reader()
    assert_the_reader_reads_and_writes_nothing(reader_url, tmp_path, monkeypatch)


def test_the_reader_reads_the_tables_dagster_makes_after_the_script(
    deployment: Deployment,  # noqa: F811
    make_reader: Callable[[], str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """compose's order: the role steps run before Dagster first starts and creates its tables."""
    reader_url = make_reader()
    with psycopg.connect(_dsn(deployment.dagster_url)) as conn:
        tables = conn.execute(
            "SELECT count(*) FROM pg_tables WHERE schemaname = 'public'"
        ).fetchone()
    assert tables == (0,)
    dagster_creates_its_tables_and_beats(deployment, tmp_path, seconds_ago=300)
    assert_the_reader_reads_and_writes_nothing(reader_url, tmp_path, monkeypatch)


@dataclass
class Exporter:
    """``reminder-pipeline metrics`` in a process of its own; ``err`` once it stopped."""

    url: str
    home: Path
    err: str = ""

    def warnings(self) -> list[str]:
        """Its log's WARNING lines (JSON lines; anything else on stderr is not the package's)."""
        lines = [line for line in self.err.splitlines() if line.startswith("{")]
        return [line for line in lines if json.loads(line).get("level") == "WARNING"]


@contextmanager
def exporter(database_url: str, dagster_pg_url: str, tmp_path: Path) -> Iterator[Exporter]:
    """The exporter as compose runs it: the app database, the image's DAGSTER_HOME and the
    Dagster storage URL it is given; stopped with SIGTERM (exit 0) when the block ends."""
    port = free_port()
    running = Exporter(f"http://127.0.0.1:{port}/metrics", dagster_home(tmp_path / "exporter"))
    env = {
        **os.environ,
        "DATABASE_URL": database_url,
        "REMINDER_METRICS_PORT": str(port),
        "REMINDER_PIPELINE_HOME": str(tmp_path / "rp_home"),
        "DAGSTER_HOME": str(running.home),
        "DAGSTER_PG_URL": dagster_pg_url,
    }
    process = subprocess.Popen(
        [sys.executable, "-m", "reminder_pipeline.cli", "metrics"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                scrape(running.url)
                break
            except OSError:
                assert process.poll() is None, process.communicate()
                assert time.monotonic() < deadline, "the exporter did not start listening"
                time.sleep(0.1)
        yield running
        process.send_signal(signal.SIGTERM)
        _, running.err = process.communicate(timeout=30)
        assert process.returncode == 0, running.err
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()


def test_the_exporter_started_before_dagsters_tables_serves_the_heartbeats_once_they_exist(
    deployment: Deployment,  # noqa: F811
    make_reader: Callable[[], str],
    database_url: str,
    tmp_path: Path,
) -> None:
    """``reminder-pipeline metrics`` as compose runs it: up while Dagster's storage is empty (the
    reader cannot create the tables: the series is absent, one log line for any number of
    scrapes, no traceback), then the heartbeats once Dagster made its tables."""
    with exporter(database_url, make_reader(), tmp_path) as running:
        before = [scrape(running.url) for _ in range(3)]
        dagster_creates_its_tables_and_beats(deployment, tmp_path, seconds_ago=300)
        deadline = time.monotonic() + 60
        while (
            age := scrape(running.url).value(exp.DAEMON_HEARTBEAT_AGE, daemon="SCHEDULER")
        ) is None:
            assert time.monotonic() < deadline, "the heartbeats never appeared"
            time.sleep(0.2)
    for scraped in before:
        assert scraped.value(exp.UP) == 1
        assert exp.DAEMON_HEARTBEAT_AGE not in scraped.families
    assert 300 <= age < 400
    assert "Traceback" not in running.err, running.err
    assert all(line.startswith("{") for line in running.err.splitlines()), running.err
    [warning] = running.warnings()
    assert "cannot read Dagster's daemon heartbeats" in warning
    # The image's dagster.yaml is all its DAGSTER_HOME needs: the exporter writes nothing there.
    assert [p.name for p in running.home.iterdir()] == ["dagster.yaml"]


def test_a_dagster_storage_that_refuses_the_reader_costs_the_scrape_that_series_only(
    deployment: Deployment,  # noqa: F811
    database_url: str,
    tmp_path: Path,
) -> None:
    """A login the role step never made (dagster-postgres retries a refused connection for about
    12 s, beyond Prometheus' 10 s scrape timeout): every scrape still answers within it, with
    the dispatcher's metrics, and the exporter says once why the series is absent."""
    dagster_creates_its_tables_and_beats(deployment, tmp_path, seconds_ago=10)
    password = uuid.uuid4().hex
    stranger = make_url(deployment.dagster_url).set(username="rp_no_such_login", password=password)
    with exporter(
        database_url, stranger.render_as_string(hide_password=False), tmp_path
    ) as running:
        scrapes = [scrape(running.url) for _ in range(3)]  # each within scrape()'s 10 s
    for scraped in scrapes:
        assert scraped.value(exp.UP) == 1
        assert exp.DAEMON_HEARTBEAT_AGE not in scraped.families
        duration = scraped.value(exp.SCRAPE_DURATION)
        assert duration is not None and duration < 10
    [warning] = running.warnings()
    assert "cannot read Dagster's daemon heartbeats" in warning
    assert password not in running.err
