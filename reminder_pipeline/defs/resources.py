"""The Postgres and Kafka resources: one engine and one producer per run, closed at teardown.

Values come from the environment when a run starts (``EnvVar`` in ``definitions.py``), so the
definitions load anywhere and a run worker reads the same variables, with the same one-line
errors, as the CLI.
"""

# No ``from __future__ import annotations``: Dagster reads the fields' annotations.

import os
from typing import Optional

from dagster import ConfigurableResource, Failure, InitResourceContext
from pydantic import Field, PrivateAttr
from sqlalchemy.engine import Engine

from .. import logs
from ..config import ConfigError, KafkaSettings, mask_secrets
from ..messaging.kafka import DELIVERY_TIMEOUT_MS, KafkaPublisher, ensure_topic
from ..store.engine import DatabaseUnavailable, check_connection, make_engine


def _outside_a_run(name: str) -> RuntimeError:
    return RuntimeError(f"{name} used outside a run (setup_for_execution not called)")


# ConfigurableResource is generic over what a factory hands the ops; Dagster's documented form for a
# resource that is itself the value takes no argument (the parameter is its internal plumbing).
class PostgresResource(ConfigurableResource):  # type: ignore[type-arg]
    """The application database (``DATABASE_URL``): one SQLAlchemy engine per run."""

    database_url: str = Field(description="SQLAlchemy URL of the reminders database.")
    pool_size: int = Field(default=5, ge=1, le=50, description="Connections kept by the pool.")

    _engine: Optional[Engine] = PrivateAttr(default=None)

    def setup_for_execution(self, context: InitResourceContext) -> None:
        """Open the engine and check the server answers, so a bad URL fails before any step."""
        logs.configure()  # the run's JSON log (stderr: the run's compute log), a line per record
        run = context.run
        # The run id in application_name: an operator finds a run's sessions in pg_stat_activity.
        label = f"reminder-dispatch {run.run_id[:8]}" if run is not None else "reminder-dispatch"
        try:
            engine = make_engine(
                self.database_url, pool_size=self.pool_size, application_name=label
            )
            check_connection(engine)
        except (ConfigError, DatabaseUnavailable) as error:
            raise Failure(description=str(error)) from None
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
            raise _outside_a_run("PostgresResource")
        return self._engine


class KafkaResource(ConfigurableResource):  # type: ignore[type-arg]  # as above
    """The broker (``KAFKA_BOOTSTRAP_SERVERS``; its security settings, ``KAFKA_SECURITY_PROTOCOL``
    and ``KAFKA_SASL_*``, from the environment like the CLI's): one producer per run."""

    bootstrap_servers: str = Field(description="host:port[,host:port].")
    message_timeout_ms: int = Field(
        default=DELIVERY_TIMEOUT_MS,
        ge=1_000,
        le=DELIVERY_TIMEOUT_MS,  # the default is the longest
        description="How long the producer retries a message (a broker that pauses this long "
        "is ridden out; a publish waits at most 15 s for acks, the rest stay in flight).",
    )
    topic_timeout_seconds: float = Field(
        default=10.0, gt=0, le=120, description="How long the topic check waits."
    )

    _publisher: Optional[KafkaPublisher] = PrivateAttr(default=None)
    _topic_error: Optional[str] = PrivateAttr(default=None)
    _topic_checked: bool = PrivateAttr(default=False)

    def setup_for_execution(self, context: InitResourceContext) -> None:
        """Validate the settings and create the producer (it connects lazily: cheap)."""
        try:
            settings = KafkaSettings.from_env(os.environ, self.bootstrap_servers)
        except ConfigError as error:
            raise Failure(description=str(error)) from None
        self._publisher = KafkaPublisher(settings, message_timeout_ms=self.message_timeout_ms)
        self._topic_checked, self._topic_error = False, None

    def teardown_after_execution(self, context: InitResourceContext) -> None:
        """Flush what the producer holds; rows not acknowledged stay unpublished in the outbox."""
        if self._publisher is not None:
            left = self._publisher.close(timeout=min(10.0, self.message_timeout_ms / 1000))
            if left and context.log is not None:
                context.log.warning(
                    f"kafka producer closed with {left} undelivered messages; "
                    "their outbox rows stay unpublished for the next cycle"
                )
            self._publisher = None

    @property
    def publisher(self) -> KafkaPublisher:
        """The run's producer."""
        if self._publisher is None:
            raise _outside_a_run("KafkaResource")
        return self._publisher

    def topic_error(self) -> Optional[str]:
        """Make sure the contract's topic exists, once per run; why not, in one line.

        Not in setup: a broker outage must not stop the transition from writing the outbox (the
        rows wait there); only publishing fails, and the run says so plainly.
        """
        if not self._topic_checked:
            self._topic_checked = True
            try:
                ensure_topic(self.publisher.settings, timeout=self.topic_timeout_seconds)
            except Exception as error:  # noqa: BLE001 - any admin failure: do not publish now
                self._topic_error = " ".join(mask_secrets(str(error)).split())[:300]
        return self._topic_error

    def ready_publisher(self) -> Optional[KafkaPublisher]:
        """The producer when the topic is there, else None (the outbox keeps the rows)."""
        return None if self.topic_error() is not None else self.publisher
