"""Servers for the benchmark: embedded PostgreSQL + broker on free ports (or the ones named by
``DATABASE_URL`` / ``KAFKA_BOOTSTRAP_SERVERS``), as a :class:`Servers` (where they are, and the
scratch databases: ``reminder_pipeline_testkit.servers``); progress lines."""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from sqlalchemy.engine import make_url

from reminder_pipeline.local.servers import EmbeddedBroker, EmbeddedPostgres, free_port
from reminder_pipeline_testkit.servers import Servers

REPO_ROOT = Path(__file__).resolve().parent.parent


def progress(message: str) -> None:
    """One progress line on stderr (the table goes to stdout)."""
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def fmt_rate(value: float) -> str:
    return f"{value / 1000:.1f}k" if value >= 1000 else f"{value:.0f}"


@contextlib.contextmanager
def servers(
    keep_workdir: bool = False,
    stat_statements: bool = False,
    broker: bool = True,
    *,
    own: bool = False,
    settings: tuple[str, ...] = (),
) -> Iterator[Servers]:
    """Embedded PostgreSQL + broker in a temp dir on free ports, unless the environment names servers.

    ``stat_statements`` loads pg_stat_statements in the embedded server (for profiling);
    ``broker=False``: no broker (a benchmark of the database alone; ``bootstrap_servers`` empty).
    ``settings`` are more ``postgresql.conf`` lines for it; ``own``: embedded servers even when
    ``DATABASE_URL`` / ``KAFKA_BOOTSTRAP_SERVERS`` name others (a benchmark of two stacks).
    """
    workdir = Path(tempfile.mkdtemp(prefix="rp-bench-"))
    pg = embedded = None
    try:
        admin_url = None if own else os.environ.get("DATABASE_URL")
        if admin_url:
            admin_url = (
                make_url(admin_url)
                .set(drivername="postgresql+psycopg")
                .render_as_string(hide_password=False)
            )
        else:
            pg = EmbeddedPostgres(data_dir=workdir / "pg" / "data", port=free_port())
            progress(f"starting embedded PostgreSQL on port {pg.port}")
            pg.start()
            lines = list(settings)
            if stat_statements:
                lines += [
                    "shared_preload_libraries = 'pg_stat_statements'",
                    "pg_stat_statements.track = all",
                ]
            if lines:
                conf = pg.data_dir / "postgresql.conf"
                with conf.open("a") as f:
                    f.write("\n" + "\n".join(lines) + "\n")
                pg.stop()
                pg.start()
            admin_url = pg.url("postgres")
        servers_ = "" if own else os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "")
        if not servers_ and broker:
            embedded = EmbeddedBroker(state_dir=workdir / "broker", port=free_port())
            progress(f"starting embedded broker on port {embedded.port}")
            servers_ = embedded.start()
        srv = Servers(admin_url, servers_, workdir, embedded=pg is not None)
        try:
            yield srv
        finally:
            srv.drop_all()
    finally:
        if embedded is not None:
            embedded.stop()
        if pg is not None:
            pg.stop()
        if not keep_workdir:
            shutil.rmtree(workdir, ignore_errors=True)


def server_version(srv: Servers) -> str:
    with srv.admin() as conn:
        return str(conn.execute("SHOW server_version").fetchone()[0])
