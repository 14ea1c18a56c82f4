"""Settings from the environment: the same names for the embedded default and production.

Every bad value is refused with a one-line :class:`ConfigError` naming the setting, before any
cycle starts, so a misconfigured deployment never runs half a cycle.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")

DEFAULT_BATCH_SIZE = 200
MAX_BATCH_SIZE = 10_000
DEFAULT_CYCLE_BUDGET_SECONDS = 30.0


class ConfigError(ValueError):
    """A setting is missing or malformed; the message is one line naming the setting."""


def _int_setting(env: Mapping[str, str], name: str, default: int, low: int, high: int) -> int:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw.strip())
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not an integer") from None
    if not low <= value <= high:
        raise ConfigError(f"{name}={value} is out of range [{low}, {high}]")
    return value


def _float_setting(env: Mapping[str, str], name: str, default: float, low: float, high: float) -> float:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = float(raw.strip())
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not a number") from None
    if not low <= value <= high:
        raise ConfigError(f"{name}={value} is out of range [{low}, {high}]")
    return value


def validate_database_url(url: str, name: str = "DATABASE_URL") -> str:
    """Check that ``url`` is a SQLAlchemy PostgreSQL URL; return it unchanged."""
    try:
        parsed = make_url(url)
    except ArgumentError:
        raise ConfigError(f"{name} is not a valid SQLAlchemy URL") from None
    if parsed.get_backend_name() != "postgresql":
        raise ConfigError(
            f"{name} must be a PostgreSQL URL (postgresql+psycopg://...), got {parsed.drivername!r}"
        )
    if parsed.get_driver_name() not in ("psycopg", "psycopg2"):
        raise ConfigError(
            f"{name} must use the psycopg driver (postgresql+psycopg://...), got {parsed.drivername!r}"
        )
    return url


def validate_bootstrap_servers(value: str, name: str = "KAFKA_BOOTSTRAP_SERVERS") -> str:
    """Check a comma-separated ``host:port`` list; return it stripped."""
    servers = [s.strip() for s in value.split(",") if s.strip()]
    if not servers:
        raise ConfigError(f"{name} is empty")
    for server in servers:
        host, sep, port = server.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigError(f"{name} entry {server!r} is not host:port")
    return ",".join(servers)


@dataclass(frozen=True)
class KafkaSettings:
    """Connection settings for the broker, shared by the producer, admin client and consumer."""

    bootstrap_servers: str
    security_protocol: str = "PLAINTEXT"
    sasl_mechanism: str | None = None
    sasl_username: str | None = None
    sasl_password: str | None = field(default=None, repr=False)

    def client_config(self) -> dict[str, str]:
        """librdkafka properties common to every client."""
        config = {
            "bootstrap.servers": self.bootstrap_servers,
            "security.protocol": self.security_protocol,
        }
        if self.sasl_mechanism:
            config["sasl.mechanism"] = self.sasl_mechanism
        if self.sasl_username is not None:
            config["sasl.username"] = self.sasl_username
        if self.sasl_password is not None:
            config["sasl.password"] = self.sasl_password
        return config

    @classmethod
    def from_env(cls, env: Mapping[str, str], bootstrap_servers: str) -> KafkaSettings:
        """Read the optional security settings; ``bootstrap_servers`` is already resolved."""
        protocol = (env.get("KAFKA_SECURITY_PROTOCOL") or "PLAINTEXT").strip().upper()
        if protocol not in SECURITY_PROTOCOLS:
            raise ConfigError(
                f"KAFKA_SECURITY_PROTOCOL={protocol!r} is not one of {', '.join(SECURITY_PROTOCOLS)}"
            )
        mechanism = (env.get("KAFKA_SASL_MECHANISM") or "").strip().upper() or None
        username = env.get("KAFKA_SASL_USERNAME") or None
        password = env.get("KAFKA_SASL_PASSWORD") or None
        if protocol.startswith("SASL_"):
            if mechanism is None:
                mechanism = "PLAIN"
            if mechanism not in SASL_MECHANISMS:
                raise ConfigError(
                    f"KAFKA_SASL_MECHANISM={mechanism!r} is not one of {', '.join(SASL_MECHANISMS)}"
                )
            if not username or not password:
                raise ConfigError(
                    f"KAFKA_SECURITY_PROTOCOL={protocol} needs KAFKA_SASL_USERNAME and KAFKA_SASL_PASSWORD"
                )
        elif mechanism is not None:
            raise ConfigError(
                f"KAFKA_SASL_MECHANISM is set but KAFKA_SECURITY_PROTOCOL={protocol} does not use SASL"
            )
        return cls(
            bootstrap_servers=validate_bootstrap_servers(bootstrap_servers),
            security_protocol=protocol,
            sasl_mechanism=mechanism,
            sasl_username=username,
            sasl_password=password,
        )


@dataclass(frozen=True)
class Settings:
    """Everything the dispatcher reads from the environment."""

    database_url: str | None
    kafka_bootstrap_servers: str | None
    home: Path
    batch_size: int = DEFAULT_BATCH_SIZE
    cycle_budget_seconds: float = DEFAULT_CYCLE_BUDGET_SECONDS
    embedded_pg_port: int = 54329
    embedded_broker_port: int = 19092
    webserver_port: int = 3000
    metrics_port: int = 9464
    env: Mapping[str, str] = field(default_factory=dict, repr=False, compare=False)

    @property
    def embedded(self) -> bool:
        """True when neither server is named, so the embedded ones are used."""
        return self.database_url is None and self.kafka_bootstrap_servers is None

    def kafka(self, bootstrap_servers: str | None = None) -> KafkaSettings:
        """Kafka settings, with ``bootstrap_servers`` filling in for an embedded broker."""
        servers = bootstrap_servers or self.kafka_bootstrap_servers
        if not servers:
            raise ConfigError("KAFKA_BOOTSTRAP_SERVERS is not set")
        return KafkaSettings.from_env(self.env, servers)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """Read and validate the environment (``os.environ`` by default)."""
        env = dict(os.environ if env is None else env)
        database_url = (env.get("DATABASE_URL") or "").strip() or None
        if database_url is not None:
            validate_database_url(database_url)
        servers = (env.get("KAFKA_BOOTSTRAP_SERVERS") or "").strip() or None
        if servers is not None:
            servers = validate_bootstrap_servers(servers)
            KafkaSettings.from_env(env, servers)  # validate the security settings now
        home = Path(env.get("REMINDER_PIPELINE_HOME") or ".reminder-pipeline").expanduser()
        return cls(
            database_url=database_url,
            kafka_bootstrap_servers=servers,
            home=home.resolve(),
            batch_size=_int_setting(env, "REMINDER_BATCH_SIZE", DEFAULT_BATCH_SIZE, 1, MAX_BATCH_SIZE),
            cycle_budget_seconds=_float_setting(
                env, "REMINDER_CYCLE_BUDGET_SECONDS", DEFAULT_CYCLE_BUDGET_SECONDS, 1.0, 600.0
            ),
            embedded_pg_port=_int_setting(env, "REMINDER_EMBEDDED_PG_PORT", 54329, 1, 65535),
            embedded_broker_port=_int_setting(env, "REMINDER_EMBEDDED_BROKER_PORT", 19092, 1, 65535),
            webserver_port=_int_setting(env, "DAGSTER_WEBSERVER_PORT", 3000, 1, 65535),
            metrics_port=_int_setting(env, "REMINDER_METRICS_PORT", 9464, 1, 65535),
            env=env,
        )
