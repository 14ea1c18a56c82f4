"""What the commands share at run time: settings, the servers and database they open, the schema
check, the broker's publisher, the operator's name, signals and the progress line.

Only ``db upgrade`` (and ``up``, the embedded quick start) migrate: the dispatcher's commands run
as the least-privilege role and refuse an old schema (:class:`SchemaNotReady`).
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import click

from ..config import KafkaSettings, Settings
from .output import ProgressLine

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

    from ..local.endpoints import Endpoints
    from ..messaging.kafka import KafkaPublisher

#: How often a progress line is written on stderr during long work.
DEFAULT_PROGRESS_SECONDS = 5.0


class SchemaNotReady(RuntimeError):
    """The database is behind the code's schema; ``db upgrade`` (as the owner) must run first."""


def load_settings() -> Settings:
    """The settings from the environment (a bad one raises ConfigError: exit 2)."""
    return Settings.from_env()


def open_servers(settings: Settings, *, broker: bool = False) -> tuple[Endpoints, Engine]:
    """The servers the command needs (a URL, else the embedded ones), an engine that answers."""
    from ..local.endpoints import ensure_servers
    from ..store.engine import check_connection, make_engine

    endpoints = ensure_servers(settings, broker=broker)
    engine = make_engine(endpoints.database_url)
    check_connection(engine)
    return endpoints, engine


def require_schema(engine: Engine) -> None:
    """Refuse a database behind this code's schema: the dispatcher's commands never migrate."""
    from ..store import migrate

    behind = migrate.pending_upgrade(engine)
    if behind is not None:
        current, head = behind
        raise SchemaNotReady(
            f"the database schema is at {current or 'no revision (empty database)'}, this code "
            f"needs {head}: run `reminder-pipeline db upgrade` with the schema owner's DATABASE_URL"
        )


@contextmanager
def database(*, schema: bool = True) -> Iterator[Engine]:
    """The app database for one command: reachable, at this code's schema unless ``schema`` is
    False (the migration commands), disposed afterwards."""
    _, engine = open_servers(load_settings())
    try:
        if schema:
            require_schema(engine)
        yield engine
    finally:
        engine.dispose()


def open_publisher(settings: Settings, bootstrap_servers: str | None) -> KafkaPublisher:
    """A producer on the topic, once the topic is there (the broker's reachability check)."""
    from ..messaging.kafka import KafkaPublisher, ensure_topic

    kafka = settings.kafka(bootstrap_servers)
    ensure_topic(kafka, timeout=10.0)  # also the broker's reachability check, before any write
    return KafkaPublisher(kafka)


def broker_settings() -> KafkaSettings:
    """The broker's settings for a command that only reads or writes Kafka (a URL, else the
    embedded broker)."""
    from ..local.endpoints import embedded_broker, require_servers

    settings = load_settings()
    require_servers(settings, database=False)
    return settings.kafka(settings.kafka_bootstrap_servers or embedded_broker(settings).start())


def operator_name() -> str:
    """The operator's OS user (the audit trail of destructive commands)."""
    from ..audit import os_user

    return os_user()


@contextmanager
def stop_signals(*more: signal.Signals) -> Iterator[threading.Event]:
    """An event set by SIGINT or SIGTERM (a clean stop of a long-running command), or ``more``."""
    stop = threading.Event()
    previous = {
        sig: signal.signal(sig, lambda *_: stop.set())
        for sig in (signal.SIGINT, signal.SIGTERM, *more)
    }
    try:
        yield stop
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@contextmanager
def interrupt_on(*signals: signal.Signals) -> Iterator[None]:
    """``signals`` raise KeyboardInterrupt, as SIGINT does (one way out of a start)."""

    def interrupt(*_: object) -> None:
        raise KeyboardInterrupt

    previous = {sig: signal.signal(sig, interrupt) for sig in signals}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def progress_line() -> ProgressLine:
    """A progress line on stderr at the interval given by ``--progress-seconds``."""
    obj = click.get_current_context().find_root().obj or {}
    return ProgressLine(
        sys.stderr, every_seconds=obj.get("progress_seconds", DEFAULT_PROGRESS_SECONDS)
    )
