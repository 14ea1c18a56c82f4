"""What the commands share at run time: settings, the servers and database they open, the schema
check, the broker's publisher, the operator's name, signals and the progress line.

Only ``db upgrade`` (and ``up``, the embedded quick start) migrate: the dispatcher's commands run
as the least-privilege role and refuse an old schema (:class:`SchemaNotReady`).
"""

from __future__ import annotations

import os
import select
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager, suppress
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
def database(*, schema: bool = True, start: bool = True) -> Iterator[Engine]:
    """The app database for one command: reachable, at this code's schema unless ``schema`` is
    False (the migration commands), disposed afterwards. A look-up (``start=False``) never
    starts the embedded server: it takes it only when it already runs."""
    if start:
        _, engine = open_servers(load_settings())
    else:
        from ..local.endpoints import running_database_url
        from ..store.engine import check_connection, make_engine

        engine = make_engine(running_database_url(load_settings()))
        check_connection(engine)
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


def broker_settings(*, start: bool = True) -> KafkaSettings:
    """The broker's settings for a command that only reads or writes Kafka (a URL, else the
    embedded broker; a look-up, ``start=False``, takes it only when it already runs)."""
    from ..local.endpoints import embedded_broker, require_servers, running_bootstrap_servers

    settings = load_settings()
    if not start:
        return settings.kafka(running_bootstrap_servers(settings))
    require_servers(settings, database=False)
    return settings.kafka(settings.kafka_bootstrap_servers or embedded_broker(settings).start())


def operator_name() -> str:
    """The operator's OS user (the audit trail of destructive commands)."""
    from ..audit import os_user

    return os_user()


def honour_stop_signals() -> None:
    """SIGINT and SIGTERM stop this command even if it inherited them ignored.

    A shell starts a background job with SIGINT ignored, and Dagster maps SIGTERM onto SIGINT's
    disposition, so a process manager's SIGTERM could be lost for the whole of a cycle. SIGINT
    gets Python's KeyboardInterrupt (exit 130), SIGTERM its default (the process ends; the
    server rolls back an open transaction).
    """
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if signal.getsignal(signal.SIGTERM) == signal.SIG_IGN:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


class StopRequest:
    """A stop asked by a signal: once received it stays asked, whatever the code was doing.

    While ``interrupting`` (a start), the first signal also raises KeyboardInterrupt wherever
    the main thread is, so a long step (a server starting, a migration) ends at once. Python
    drops an exception raised inside a finaliser (``Exception ignored in ...``), so the start
    also calls :meth:`check` between its steps: the request is never lost. The handler takes no
    lock (one the main thread may hold when the signal comes): it wakes :meth:`wait` through a
    pipe.
    """

    def __init__(self, *, interrupting: bool = False) -> None:
        self.interrupting = interrupting
        self.signal: signal.Signals | None = None
        self._wake_read, self._wake_write = os.pipe()
        os.set_blocking(self._wake_write, False)

    def handle(self, signum: int, _frame: object) -> None:
        """The signal handler: record the first signal (later ones change nothing)."""
        if self.signal is not None:
            return
        self.signal = signal.Signals(signum)
        with suppress(OSError):
            os.write(self._wake_write, b"!")
        if self.interrupting:
            raise KeyboardInterrupt

    def asked(self) -> bool:
        """True once a stop signal came."""
        return self.signal is not None

    def check(self) -> None:
        """Raise KeyboardInterrupt if a stop was asked (a checkpoint of a start)."""
        if self.asked():
            raise KeyboardInterrupt

    def wait(self) -> None:
        """Block until a stop is asked (a signal after the test has written to the pipe)."""
        while not self.asked():
            select.select([self._wake_read], [], [])

    def close(self) -> None:
        """Release the pipe."""
        os.close(self._wake_read)
        os.close(self._wake_write)


@contextmanager
def stop_requests(*more: signal.Signals, interrupting: bool = False) -> Iterator[StopRequest]:
    """SIGINT, SIGTERM and ``more`` ask a stop while inside.

    Installed whatever the process inherited: a shell's background job starts with SIGINT
    ignored, and Dagster maps SIGTERM onto SIGINT's disposition, so both may come ignored.
    """
    request = StopRequest(interrupting=interrupting)
    previous = {
        sig: signal.signal(sig, request.handle) for sig in (signal.SIGINT, signal.SIGTERM, *more)
    }
    try:
        yield request
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)
        request.close()


def progress_line() -> ProgressLine:
    """A progress line on stderr at the interval given by ``--progress-seconds``."""
    obj = click.get_current_context().find_root().obj or {}
    return ProgressLine(
        sys.stderr, every_seconds=obj.get("progress_seconds", DEFAULT_PROGRESS_SECONDS)
    )
