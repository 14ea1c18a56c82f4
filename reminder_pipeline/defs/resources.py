"""The Postgres and Kafka resources: one engine and one producer per run, closed at teardown.

Values come from the environment at run time (``EnvVar`` in :mod:`reminder_pipeline.definitions`),
so the definitions load anywhere, and a run worker reads the same variable names as the CLI.
"""

from __future__ import annotations

import os
from typing import Optional

from dagster import ConfigurableResource, Failure, InitResourceContext
from pydantic import Field, PrivateAttr
from sqlalchemy import exc as sa_exc
from sqlalchemy import text
from sqlalchemy.engine import Engine, make_url

from .. import logs
from ..config import ConfigError, KafkaSettings, validate_database_url
from ..db import make_engine
from ..messaging.kafka import BrokerUnavailable, KafkaPublisher, ensure_topic


def _one_line(text_: str, limit: int = 300) -> str:
    line = " ".join(str(text_).split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _run_label(context: InitResourceContext) -> str:
    run = context.run
    return f"reminder-dispatch {run.run_id[:8]}" if run is not None else "reminder-dispatch"


class PostgresResource(ConfigurableResource):
    """The application database (``DATABASE_URL``): one SQLAlchemy engine per run."""

    database_url: str = Field(description="SQLAlchemy URL of the reminders database (DATABASE_URL).")
    pool_size: int = Field(default=5, ge=1, le=50, description="Connections kept by the run's pool.")

    _engine: Optional[Engine] = PrivateAttr(default=None)

    def setup_for_execution(self, context: InitResourceContext) -> None:
        """Open the engine and check the server answers, so a bad URL fails before any step."""
        logs.configure()  # the run's JSON log (stderr: the run's compute log), a line per record
        try:
            validate_database_url(self.database_url)
        except ConfigError as error:
            raise Failure(description=str(error)) from None
        # The run id in application_name lets an operator find a run's sessions in pg_stat_activity.
        engine = make_engine(self.database_url, pool_size=self.pool_size,
                             application_name=_run_label(context))
        try:
            with engine.connect() as conn:
                conn.execute(text("SELECT 1"))
        except sa_exc.DBAPIError as error:
            engine.dispose()
            url = make_url(self.database_url)
            raise Failure(
                description=(
                    f"DATABASE_URL: cannot connect to {url.host}:{url.port or 5432}/{url.database}: "
                    f"{_one_line(error.orig or error)}"
                )
            ) from None
        self._engine = engine

    def teardown_after_execution(self, context: InitResourceContext) -> None:
        """Close every pooled connection (a terminated run leaves no session behind)."""
        if self._engine is not None:
            self._engine.dispose()
            self._engine = None

    @property
    def engine(self) -> Engine:
        """The run's engine."""
        if self._engine is None:
            raise RuntimeError("PostgresResource used outside a run (setup_for_execution not called)")
        return self._engine


class KafkaResource(ConfigurableResource):
    """The broker (``KAFKA_BOOTSTRAP_SERVERS`` + optional security settings): one producer per run.

    The security fields default to None, meaning "read ``KAFKA_SECURITY_PROTOCOL`` /
    ``KAFKA_SASL_*`` from the environment at run time" through :class:`KafkaSettings`, the same
    code and one-line errors as the CLI. They are not ``EnvVar`` fields because an unset
    ``EnvVar`` is an error, and these settings are optional.
    """

    bootstrap_servers: str = Field(description="host:port[,host:port] (KAFKA_BOOTSTRAP_SERVERS).")
    security_protocol: Optional[str] = Field(default=None, description="Default: KAFKA_SECURITY_PROTOCOL or PLAINTEXT.")
    sasl_mechanism: Optional[str] = Field(default=None, description="Default: KAFKA_SASL_MECHANISM.")
    sasl_username: Optional[str] = Field(default=None, description="Default: KAFKA_SASL_USERNAME.")
    sasl_password: Optional[str] = Field(
        default=None, description="Default: KAFKA_SASL_PASSWORD.",
        json_schema_extra={"dagster__is_secret": True},  # masked in the UI if ever set in config
    )
    message_timeout_ms: int = Field(
        default=15_000, ge=1_000, le=300_000,
        description="How long the producer retries a message before reporting it failed.",
    )
    topic_timeout_seconds: float = Field(
        default=10.0, gt=0, le=120,
        description="How long the per-run topic check waits for the broker.",
    )

    _settings: Optional[KafkaSettings] = PrivateAttr(default=None)
    _publisher: Optional[KafkaPublisher] = PrivateAttr(default=None)
    _topic_error: Optional[str] = PrivateAttr(default=None)
    _topic_checked: bool = PrivateAttr(default=False)

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        for name, value in (
            ("KAFKA_SECURITY_PROTOCOL", self.security_protocol),
            ("KAFKA_SASL_MECHANISM", self.sasl_mechanism),
            ("KAFKA_SASL_USERNAME", self.sasl_username),
            ("KAFKA_SASL_PASSWORD", self.sasl_password),
        ):
            if value is not None:
                env[name] = value
        return env

    def setup_for_execution(self, context: InitResourceContext) -> None:
        """Validate the settings and create the producer (it connects lazily, so this is cheap)."""
        try:
            self._settings = KafkaSettings.from_env(self._env(), self.bootstrap_servers)
        except ConfigError as error:
            raise Failure(description=str(error)) from None
        self._publisher = KafkaPublisher(self._settings, message_timeout_ms=self.message_timeout_ms)
        self._topic_checked = False
        self._topic_error = None

    def teardown_after_execution(self, context: InitResourceContext) -> None:
        """Flush what the producer still holds; rows not acknowledged stay unpublished in the outbox."""
        if self._publisher is not None:
            left = self._publisher.close(timeout=min(10.0, self.message_timeout_ms / 1000))
            if left:
                context.log.warning(
                    f"kafka producer closed with {left} undelivered messages; "
                    "their outbox rows stay unpublished for the next cycle"
                )
            self._publisher = None

    @property
    def settings(self) -> KafkaSettings:
        """The validated client settings."""
        if self._settings is None:
            raise RuntimeError("KafkaResource used outside a run (setup_for_execution not called)")
        return self._settings

    @property
    def publisher(self) -> KafkaPublisher:
        """The run's producer."""
        if self._publisher is None:
            raise RuntimeError("KafkaResource used outside a run (setup_for_execution not called)")
        return self._publisher

    def topic_error(self) -> Optional[str]:
        """Make sure the contract's topic exists, once per run; a one-line error when the broker is unreachable.

        Not done in setup: a broker outage must not stop the transition from writing the outbox
        (the rows wait there); only publishing fails, and the run says so plainly.
        """
        if not self._topic_checked:
            self._topic_checked = True
            try:
                ensure_topic(self.settings, timeout=self.topic_timeout_seconds)
            except BrokerUnavailable as error:
                self._topic_error = _one_line(str(error))
            except Exception as error:  # noqa: BLE001 - any admin failure means "do not publish now"
                self._topic_error = _one_line(
                    f"Kafka at {self.settings.bootstrap_servers}: {type(error).__name__}: {error}"
                )
        return self._topic_error

    def ready_publisher(self) -> Optional[KafkaPublisher]:
        """The producer when the topic is there, else None (the outbox keeps the rows)."""
        return None if self.topic_error() is not None else self.publisher
