"""The real ``dagster-daemon`` over a stack's servers (a :class:`.servers.Servers`): the
application's database migrated to head and Dagster's database beside it, a ``DAGSTER_HOME`` with
the shipped instance config and workspace (:func:`prepare_dagster`), then ``dagster-daemon run``
in a session of its own (:func:`spawn_daemon`: its group holds the code server and the run
workers, so one signal reaches them all), its output in ``daemon.log`` of that home.

Used by ``benchmarks.peak``, the soak's stack and ``faults/test_failover.py``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from .servers import Servers


def prepare_dagster(srv: Servers, app_suffix: str) -> tuple[dict[str, str], Path, str, object]:
    """The application and Dagster databases, a ``DAGSTER_HOME`` with the shipped instance config,
    the daemon's environment; returns (env, home, application database, instance)."""
    from dagster import DagsterInstance

    from reminder_pipeline.local.dagster_processes import prepare_home
    from reminder_pipeline.store import migrate
    from reminder_pipeline.store.engine import dagster_storage_url, make_engine

    app_db, dag_db = srv.create_database(app_suffix), srv.create_database("dagster")
    engine = make_engine(srv.url(app_db), pool_size=1)
    migrate.upgrade(engine)
    engine.dispose()
    home = srv.workdir / "dagster_home"
    prepare_home(home)
    env = {
        **os.environ,
        "DATABASE_URL": srv.url(app_db),
        "KAFKA_BOOTSTRAP_SERVERS": srv.bootstrap_servers,
        "DAGSTER_PG_URL": dagster_storage_url(srv.url(dag_db)),
        "DAGSTER_HOME": str(home),
        "DAGSTER_DISABLE_TELEMETRY": "1",
    }
    os.environ.update({k: env[k] for k in ("DAGSTER_PG_URL", "DAGSTER_HOME")})
    instance = DagsterInstance.from_config(str(home))  # Dagster's schema before the daemon
    return env, home, app_db, instance


def spawn_daemon(env: dict[str, str], home: Path) -> subprocess.Popen[bytes]:
    """``dagster-daemon run`` in a session of its own (its group: the code server, the runs)."""
    exe = os.path.join(os.path.dirname(sys.executable), "dagster-daemon")
    log = (home / "daemon.log").open("ab")
    return subprocess.Popen(
        [exe, "run", "-w", str(home / "workspace.yaml")],
        env=env,
        cwd=home,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
