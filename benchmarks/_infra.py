"""Servers and databases for the benchmark: embedded PostgreSQL + broker on free ports (or the
ones named by ``DATABASE_URL`` / ``KAFKA_BOOTSTRAP_SERVERS``), scratch databases, progress lines."""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
from psycopg import sql
from sqlalchemy.engine import make_url

from reminder_pipeline.config import KafkaSettings
from reminder_pipeline.local.servers import EmbeddedBroker, EmbeddedPostgres, free_port

REPO_ROOT = Path(__file__).resolve().parent.parent


def progress(message: str) -> None:
    """One progress line on stderr (the table goes to stdout)."""
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def fmt_rate(value: float) -> str:
    return f"{value / 1000:.1f}k" if value >= 1000 else f"{value:.0f}"


@dataclass
class Servers:
    """Where the benchmark's databases and topic live."""

    admin_url: str  # SQLAlchemy URL (psycopg) of a database from which others are created
    bootstrap_servers: str
    workdir: Path
    embedded: bool
    prefix: str = field(default_factory=lambda: f"rpb_{uuid.uuid4().hex[:6]}")
    _created: list[str] = field(default_factory=list)

    @property
    def kafka(self) -> KafkaSettings:
        return KafkaSettings.from_env(os.environ, self.bootstrap_servers)

    def url(self, database: str, driver: str = "psycopg") -> str:
        return (
            make_url(self.admin_url)
            .set(drivername=f"postgresql+{driver}", database=database)
            .render_as_string(hide_password=False)
        )

    def dsn(self, database: str | None = None) -> str:
        parsed = make_url(self.admin_url).set(drivername="postgresql")
        if database is not None:
            parsed = parsed.set(database=database)
        return parsed.render_as_string(hide_password=False)

    def admin(self) -> psycopg.Connection:
        return psycopg.connect(self.dsn(), autocommit=True)

    def name(self, suffix: str) -> str:
        return f"{self.prefix}_{suffix}"

    def create_database(self, suffix: str, template: str | None = None) -> str:
        """CREATE DATABASE (optionally a copy of ``template``); returns its name."""
        name = self.name(suffix)
        with self.admin() as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )
            if template is None:
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
            else:
                conn.execute(
                    sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                        sql.Identifier(name), sql.Identifier(template)
                    )
                )
        self._created.append(name)
        return name

    def drop_database(self, name: str) -> None:
        with contextlib.suppress(psycopg.Error), self.admin() as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )
        if name in self._created:
            self._created.remove(name)

    def drop_all(self) -> None:
        for name in list(reversed(self._created)):
            self.drop_database(name)

    def checkpoint(self) -> None:
        """A CHECKPOINT so every timed run starts from the same WAL/full-page-image state."""
        with contextlib.suppress(psycopg.Error), self.admin() as conn:
            conn.execute("CHECKPOINT")


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
