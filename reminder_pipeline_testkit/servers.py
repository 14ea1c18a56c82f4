"""Where a stack's databases and topic live (:class:`Servers`): a PostgreSQL login that may create
databases, the broker's bootstrap servers and a work dir; the scratch databases made from it
(``<prefix>_<suffix>``, a template copy if asked) and dropped again.

A benchmark gets one from ``benchmarks._infra.servers()`` (embedded servers on free ports, or the
ones ``DATABASE_URL`` and ``KAFKA_BOOTSTRAP_SERVERS`` name); a test that starts its own servers
makes one for them (``faults/test_failover.py``: a primary and its replica).
"""

from __future__ import annotations

import contextlib
import os
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
from psycopg import sql
from sqlalchemy.engine import make_url

from reminder_pipeline.config import KafkaSettings


@dataclass
class Servers:
    """Where a benchmark's (or a test's) databases and topic live."""

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
