"""Settings from the environment: the same names for the embedded default and production.

Every bad value is refused with a one-line :class:`ConfigError` naming the setting, before any
cycle starts, so a misconfigured deployment never runs half a cycle.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from contextlib import suppress
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta
from pathlib import Path
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
#: Every Kafka client's bounds on a silent broker (docs/configuration.md, "Connection bounds").
KAFKA_CONNECT_TIMEOUT_MS = 5 * 1000
KAFKA_SOCKET_TIMEOUT_MS = 15_000
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")

DEFAULT_BATCH_SIZE = 200
MAX_BATCH_SIZE = 10_000
MAX_BATCHES = 10_000
#: One cycle, scheduled or from the CLI: batches of ``batch_size`` (each one transaction) until
#: none is due or the budget is spent. The design's SLO (2 minutes) outranks a per-minute cap of
#: 200 rows; ``max_batches: 1`` (``REMINDER_DISPATCH_MAX_BATCHES=1``) restores the literal
#: one-batch cycle (docs/design.md, "Peaks").
CYCLE_MAX_BATCHES = MAX_BATCHES
#: The variable both the schedule and ``reminder-pipeline dispatch`` read for ``max_batches``.
CYCLE_MAX_BATCHES_ENV = "REMINDER_DISPATCH_MAX_BATCHES"
DEFAULT_CYCLE_BUDGET_SECONDS = 30.0
#: The batches a cycle started in code without ``max_batches`` writes: the design's literal
#: one-batch cycle (the schedule and the CLI pass CYCLE_MAX_BATCHES).
DEFAULT_MAX_BATCHES = 1
MIN_BUDGET_SECONDS = 1.0
#: The widest time budget anything accepts (the CLI); each Dagster job narrows it with ``high``.
MAX_BUDGET_SECONDS = 600.0
#: A purge never deletes rows published in the last hour: a smaller retention is a typo.
MIN_RETENTION_HOURS = 1.0
MAX_RETENTION_HOURS = 24.0 * 366
DEFAULT_RETENTION_HOURS = 168.0
DEFAULT_PURGE_BATCH_SIZE = 1000
MAX_PURGE_BATCH_SIZE = 10_000
DEFAULT_POISON_LIMIT = 100
#: Seconds a bulk poison action waits for rows another session holds before it gives up, changing
#: nothing and naming them (``--lock-timeout``): a cycle holds its rows for a moment only.
DEFAULT_POISON_LOCK_TIMEOUT_SECONDS = 5.0
MAX_POISON_LIMIT = 1000
#: The ports the local stack listens on unless the environment names others (the embedded servers,
#: the Dagster webserver) and the /metrics endpoint's port and address (docs/configuration.md).
DEFAULT_EMBEDDED_PG_PORT = 54329
DEFAULT_EMBEDDED_BROKER_PORT = 19092
DEFAULT_WEBSERVER_PORT = 3000
DEFAULT_METRICS_PORT = 9464
DEFAULT_METRICS_HOST = "127.0.0.1"
#: The variables ``consume`` takes its group and its de-duplication store from (cli/consume.py);
#: a trace reads the same ones to find that store (consumer/delivered.py).
CONSUMER_GROUP_ID_ENV = "REMINDER_CONSUMER_GROUP_ID"
CONSUMER_DEDUP_PATH_ENV = "REMINDER_CONSUMER_DEDUP_PATH"
CONSUMER_DEDUP_URL_ENV = "REMINDER_CONSUMER_DEDUP_URL"


class ConfigError(ValueError):
    """A setting is missing or malformed; the message is one line naming the setting."""


# --- shared validators ------------------------------------------------------------------------
# One check per value, shared by the command line (``--batch-size``), the environment
# (``REMINDER_BATCH_SIZE``) and the Dagster run config (``batch_size``): the same bounds and the
# same one-line message, ``<name>=<value> <what is wrong>``, with ``name`` as the operator typed it.


#: A number as text is ASCII digits, as typed at a shell: ``int()`` and ``float()`` also take
#: other scripts' digits (``٣``) and ``_`` between digits (``1_000``), which no operator means.
_INTEGER = re.compile(r"[+-]?[0-9]+", re.ASCII)
_NUMBER = re.compile(
    r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|[+-]?(?:inf|infinity|nan)",
    re.ASCII | re.IGNORECASE,
)


def is_integer_text(text: str) -> bool:
    """Whether ``text`` is an integer as a person types one: ASCII digits, an optional sign."""
    return _INTEGER.fullmatch(text.strip()) is not None


def _shown(value: object) -> str:
    """The value as it appears in a message: text quoted, numbers as typed."""
    return repr(value) if isinstance(value, str) else str(value)


def check_int(value: object, name: str, low: int, high: int) -> int:
    """``value`` (an int or its text) as an int within ``[low, high]``; else a ConfigError."""
    if isinstance(value, bool) or not isinstance(value, int | str):
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        else:
            raise ConfigError(f"{name}={_shown(value)} is not an integer")
    if isinstance(value, str):
        if not is_integer_text(value):
            raise ConfigError(f"{name}={value!r} is not an integer")
        number = int(value.strip())
    else:
        number = value
    if not low <= number <= high:
        raise ConfigError(f"{name}={number} is out of range [{low}, {high}]")
    return number


def check_number(value: object, name: str, low: float, high: float) -> float:
    """``value`` (a number or its text) as a finite float in ``[low, high]``; else ConfigError."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ConfigError(f"{name}={_shown(value)} is not a number")
    if isinstance(value, str) and not _NUMBER.fullmatch(value.strip()):
        raise ConfigError(f"{name}={value!r} is not a number")
    number = float(value.strip() if isinstance(value, str) else value)
    if not math.isfinite(number):
        raise ConfigError(f"{name}={number} is not a finite number")
    if not low <= number <= high:
        raise ConfigError(f"{name}={number:g} is out of range [{low:g}, {high:g}]")
    return number


def check_batch_size(value: object, name: str = "batch_size") -> int:
    """Rows per batch (the design's BatchSize): 1..MAX_BATCH_SIZE."""
    return check_int(value, name, 1, MAX_BATCH_SIZE)


def check_max_batches(value: object, name: str = "max_batches") -> int:
    """Batches one cycle may drain: 1..MAX_BATCHES."""
    return check_int(value, name, 1, MAX_BATCHES)


def check_budget_seconds(
    value: object, name: str = "budget_seconds", high: float = MAX_BUDGET_SECONDS
) -> float:
    """A cycle's time budget in seconds: finite, MIN_BUDGET_SECONDS..``high``."""
    return check_number(value, name, MIN_BUDGET_SECONDS, high)


def parse_as_of(value: object, name: str = "as_of") -> datetime | None:
    """AsOf's form: ISO-8601 text (or a datetime) with a zone; None/empty means now.

    Whether it is in the future is :func:`check_as_of`'s, against the database's clock: the
    option and the run config are parsed on a host whose clock may be off.
    """
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    if isinstance(value, datetime):
        parsed = value
    elif isinstance(value, str):
        text = value.strip()
        try:
            # "Z" is accepted by fromisoformat only from 3.11 on; spelled out for clarity.
            parsed = datetime.fromisoformat(text[:-1] + "+00:00" if text.endswith("Z") else text)
        except ValueError:
            raise ConfigError(
                f"{name}={text!r} is not an ISO-8601 timestamp (e.g. 2026-11-30T10:00:00Z)"
            ) from None
    else:
        raise ConfigError(f"{name}={_shown(value)} is not an ISO-8601 timestamp")
    if parsed.tzinfo is None or parsed.utcoffset() is None:
        raise ConfigError(
            f"{name}={parsed.isoformat()!r} has no time zone (e.g. 2026-11-30T10:00:00Z)"
        )
    return parsed


#: The first and the last instant a range's bound can name (Python's, in UTC).
FIRST_INSTANT = datetime.min.replace(tzinfo=UTC)
LAST_INSTANT = datetime.max.replace(tzinfo=UTC)
_FIRST_TEXT, _LAST_TEXT = FIRST_INSTANT.isoformat(), LAST_INSTANT.isoformat()
_TICK = timedelta(microseconds=1)  # PostgreSQL's resolution: "< t + 1 µs" is "<= t"


def _day_alone(value: object) -> date | None:
    """The day ``value`` names when it is a date alone (``2026-12-07``, ISO's compact
    ``20261207``), else None."""
    if isinstance(value, str):
        with suppress(ValueError):
            return date.fromisoformat(value.strip())
        return None
    return value if isinstance(value, date) and not isinstance(value, datetime) else None


def _time_given(value: object, name: str) -> datetime:
    when = parse_as_of(value, name)
    if when is None:
        raise ConfigError(f"{name} is empty (a day, 2026-12-01, or a time, 2026-12-01T10:00:00Z)")
    return when


def parse_range_start(value: object, name: str) -> datetime:
    """The first instant a range takes, in UTC: a day alone (``2026-12-07``, ``20261207``) is its
    00:00 UTC, a time needs its zone. One before the first instant Python holds is that one."""
    day = _day_alone(value)
    if day is not None:
        return datetime.combine(day, time(0), tzinfo=UTC)
    when = _time_given(value, name)
    try:
        return when.astimezone(UTC)
    except OverflowError:  # a year-1 or year-9999 time whose zone carries it out of range
        if (when.utcoffset() or timedelta(0)) > timedelta(0):
            return FIRST_INSTANT
        raise ConfigError(f"{name}={when.isoformat()!r} is after {_LAST_TEXT}") from None


def parse_range_end(value: object, name: str) -> datetime | None:
    """The instant a range ends before, in UTC, for a bound given inclusive: a day alone is the
    whole UTC day (up to the next day's 00:00 UTC), a time (with its zone) itself included.
    None: the bound is past the last instant Python holds (``9999-12-31``): no upper bound."""
    day = _day_alone(value)
    if day is not None:
        if day == date.max:
            return None
        return datetime.combine(day + timedelta(days=1), time(0), tzinfo=UTC)
    when = _time_given(value, name)
    try:
        end = when.astimezone(UTC)
    except OverflowError:
        if (when.utcoffset() or timedelta(0)) < timedelta(0):
            return None
        raise ConfigError(f"{name}={when.isoformat()!r} is before {_FIRST_TEXT}") from None
    return None if end == LAST_INSTANT else end + _TICK


def check_as_of(value: object, name: str = "as_of", *, now: datetime) -> datetime | None:
    """AsOf (:func:`parse_as_of`) not after ``now``, the database's clock; None means now."""
    parsed = parse_as_of(value, name)
    if parsed is not None and parsed > now:
        raise ConfigError(f"{name}={parsed.isoformat()!r} is in the future; it must be <= now")
    return parsed


def check_retention_hours(value: object, name: str = "retention_hours") -> float:
    """Outbox retention in hours: at least one hour (a smaller one would purge fresh rows)."""
    return check_number(value, name, MIN_RETENTION_HOURS, MAX_RETENTION_HOURS)


def check_purge_batch_size(value: object, name: str = "batch_size") -> int:
    """Rows per purge transaction: 1..MAX_PURGE_BATCH_SIZE."""
    return check_int(value, name, 1, MAX_PURGE_BATCH_SIZE)


def check_poison_limit(value: object, name: str = "limit") -> int:
    """Poison rows listed at most: 1..MAX_POISON_LIMIT."""
    return check_int(value, name, 1, MAX_POISON_LIMIT)


def check_port(value: object, name: str) -> int:
    """A TCP port: 1..65535."""
    return check_int(value, name, 1, 65535)


def _int_setting(env: Mapping[str, str], name: str, default: int, low: int, high: int) -> int:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    return check_int(raw, name, low, high)


def _float_setting(
    env: Mapping[str, str], name: str, default: float, low: float, high: float
) -> float:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    return check_number(raw, name, low, high)


_URL_PASSWORD = re.compile(r"(\b[A-Za-z][A-Za-z0-9+.-]*://[^:/@\s]*:)\S+@")


def mask_secrets(text: str) -> str:
    """``text`` with the password of each ``scheme://user:password@host`` in it shown as ``***``."""
    return _URL_PASSWORD.sub(r"\1***@", text)


def mask_url(url: str) -> str:
    """``url`` with its password replaced by ``***`` (for every line a person or a log reads).

    A multi-host query keeps its ``host=HostA:PortA`` readable (SQLAlchemy writes ``%3A``).
    """
    try:
        shown = make_url(url).render_as_string(hide_password=True)
    except (ArgumentError, ValueError):
        return "<unparsable URL>"
    path, sep, query = shown.partition("?")
    return path + sep + query.replace("%3A", ":").replace("%2F", "/").replace("%2C", ",")


#: SQLAlchemy's multi-host form, the one every database setting documents.
MULTI_HOST_FORM = "?host=HostA:PortA&host=HostB:PortB&target_session_attrs=read-write"


def _host_entries(query: Mapping[str, str | tuple[str, ...]]) -> list[tuple[str, str]]:
    """The (host, port) pairs of a URL's ``host=``/``port=`` query (``port`` may be "")."""
    hosts, ports = query.get("host"), query.get("port")
    if hosts is None:
        return []
    if isinstance(hosts, tuple):  # host=H:P repeated, SQLAlchemy's form
        return [(h, "") if h.startswith("/") or ":" not in h else _split(h) for h in hosts]
    names = hosts.split(",")
    port_list = ports.split(",") if isinstance(ports, str) else [""] * len(names)
    if len(names) == 1 and ":" in names[0] and not names[0].startswith("/") and not ports:
        return [_split(names[0])]
    return list(zip(names, port_list, strict=False))


def _split(entry: str) -> tuple[str, str]:
    host, _, port = entry.rpartition(":")
    return host, port


def check_database_hosts(url: str, name: str) -> None:
    """Refuse host lists that SQLAlchemy would hand libpq wrong (one line, the form to use).

    A URL SQLAlchemy cannot parse (libpq's ``HostA:PortA,HostB:PortB`` authority) is left to
    libpq, which checks it when it connects.
    """
    try:
        query = make_url(url).query
    except (ArgumentError, ValueError):
        return
    hosts, ports = query.get("host"), query.get("port")
    if hosts is None:
        return
    if isinstance(hosts, tuple) and ports is not None:
        raise ConfigError(
            f"{name}: repeated host= and a port= together; give each server as host=Host:Port "
            f"({MULTI_HOST_FORM})"
        )
    if isinstance(ports, tuple):
        raise ConfigError(f"{name}: port= repeated; use the multi-host form {MULTI_HOST_FORM}")
    if isinstance(hosts, str) and "," in hosts:
        if any(":" in h and not h.startswith("/") for h in hosts.split(",")):
            raise ConfigError(
                f"{name}: a comma list in one host= cannot carry ports ({hosts!r}); "
                f"repeat host= for each server: {MULTI_HOST_FORM}"
            )
        if ports is not None and len(ports.split(",")) != len(hosts.split(",")):
            raise ConfigError(
                f"{name}: host= names {len(hosts.split(','))} servers but port= "
                f"{len(ports.split(','))}; use the multi-host form {MULTI_HOST_FORM}"
            )
    for host, port in _host_entries(query):
        if not host or (port and not port.isdigit()):
            raise ConfigError(
                f"{name}: host entry {host + ':' + port if port else host!r} is not Host:Port "
                f"({MULTI_HOST_FORM})"
            )


def libpq_url(url: str) -> str:
    """``url`` as libpq reads it (psql, psycopg.connect): no SQLAlchemy driver in the scheme, and
    SQLAlchemy's repeated ``host=H:P`` turned into libpq's ``host=H1,H2&port=P1,P2``."""
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    hosts = [value for key, value in query if key == "host"]
    repeated = len(hosts) > 1
    single = len(hosts) == 1 and "," not in hosts[0] and not hosts[0].startswith("/")
    if repeated or (single and ":" in hosts[0] and not any(k == "port" for k, _ in query)):
        pairs = [(h, "") if h.startswith("/") or ":" not in h else _split(h) for h in hosts]
        servers = [("host", ",".join(h for h, _ in pairs))]
        if any(p for _, p in pairs):
            servers.append(("port", ",".join(p for _, p in pairs)))
        query = servers + [(k, v) for k, v in query if k not in ("host", "port")]
    scheme = parts.scheme.split("+", 1)[0]
    return urlunsplit(
        # quote, not quote_plus: libpq decodes %20, not "+", as a space (in ``options``).
        (
            scheme,
            parts.netloc,
            parts.path,
            urlencode(query, safe=",/:", quote_via=quote),
            parts.fragment,
        )
    )


def validate_database_url(url: str, name: str = "DATABASE_URL") -> str:
    """Check that ``url`` is a SQLAlchemy PostgreSQL URL; return it unchanged.

    Several servers (a primary and its replicas) go in SQLAlchemy's multi-host form,
    :data:`MULTI_HOST_FORM`; libpq's ``host=H1,H2&port=P1,P2`` works too.
    """
    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError):
        hint = f"; several servers go in the query: {MULTI_HOST_FORM}" if "," in url else ""
        raise ConfigError(f"{name} is not a valid SQLAlchemy URL{hint}") from None
    if parsed.get_backend_name() != "postgresql":
        raise ConfigError(
            f"{name} must be a PostgreSQL URL (postgresql+psycopg://...), got {parsed.drivername!r}"
        )
    if parsed.get_driver_name() not in ("psycopg", "psycopg2"):
        raise ConfigError(
            f"{name} must use the psycopg driver (postgresql+psycopg://...), "
            f"got {parsed.drivername!r}"
        )
    check_database_hosts(url, name)
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

    def client_config(self) -> dict[str, str | int | float | bool]:
        """librdkafka properties common to every client."""
        config: dict[str, str | int | float | bool] = {
            "bootstrap.servers": self.bootstrap_servers,
            "security.protocol": self.security_protocol,
            # A broker that takes no connection in 5 s is tried again (librdkafka: 30 s).
            "socket.connection.setup.timeout.ms": KAFKA_CONNECT_TIMEOUT_MS,
            # A request unanswered this long closes its connection, which is made again
            # (librdkafka: 60 s): a silent broker is noticed within 15 s of a request (a
            # consumer always has a fetch in flight; a producer's next produce).
            "socket.timeout.ms": KAFKA_SOCKET_TIMEOUT_MS,
            # SO_KEEPALIVE, at the host's timings (librdkafka sets no intervals).
            "socket.keepalive.enable": True,
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
                f"KAFKA_SECURITY_PROTOCOL={protocol!r} is not one of "
                f"{', '.join(SECURITY_PROTOCOLS)}"
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
                    f"KAFKA_SECURITY_PROTOCOL={protocol} needs KAFKA_SASL_USERNAME and "
                    "KAFKA_SASL_PASSWORD"
                )
        elif mechanism is not None:
            raise ConfigError(
                f"KAFKA_SASL_MECHANISM is set but KAFKA_SECURITY_PROTOCOL={protocol} "
                "does not use SASL"
            )
        return cls(
            bootstrap_servers=validate_bootstrap_servers(bootstrap_servers),
            security_protocol=protocol,
            sasl_mechanism=mechanism,
            sasl_username=username,
            sasl_password=password,
        )


#: Where the runbook links in the Dagster UI point (docs/configuration.md): the base URL of the
#: repository's ``docs/`` directory, by default the docs of this checkout as a ``file:`` URL
#: (``up`` points it at the metrics exporter, which serves this directory under ``/docs/``).
DOCS_BASE_URL_ENV = "REMINDER_DOCS_BASE_URL"
DOCS_DIR = Path(__file__).resolve().parents[1] / "docs"
DEFAULT_DOCS_BASE_URL = DOCS_DIR.as_uri() + "/"


def docs_base_url(env: Mapping[str, str] | None = None) -> str:
    """REMINDER_DOCS_BASE_URL (an absolute http, https or file URL), ending in ``/``."""
    raw = ((os.environ if env is None else env).get(DOCS_BASE_URL_ENV) or "").strip()
    if not raw:
        return DEFAULT_DOCS_BASE_URL
    parts = urlsplit(raw)
    absolute = parts.path if parts.scheme == "file" else parts.netloc
    if parts.scheme not in ("http", "https", "file") or not absolute:
        raise ConfigError(f"{DOCS_BASE_URL_ENV}={raw!r} is not an absolute http, https or file URL")
    return raw if raw.endswith("/") else raw + "/"


@dataclass(frozen=True)
class Settings:
    """Everything the dispatcher reads from the environment."""

    database_url: str | None
    kafka_bootstrap_servers: str | None
    home: Path
    batch_size: int = DEFAULT_BATCH_SIZE
    cycle_budget_seconds: float = DEFAULT_CYCLE_BUDGET_SECONDS
    embedded_pg_port: int = DEFAULT_EMBEDDED_PG_PORT
    embedded_broker_port: int = DEFAULT_EMBEDDED_BROKER_PORT
    webserver_port: int = DEFAULT_WEBSERVER_PORT
    metrics_port: int = DEFAULT_METRICS_PORT
    env: Mapping[str, str] = field(default_factory=dict, repr=False, compare=False)

    @property
    def embedded(self) -> bool:
        """True when neither server is named, so the embedded ones are used."""
        return self.database_url is None and self.kafka_bootstrap_servers is None

    @property
    def dagster_ui_url(self) -> str:
        """The Dagster UI's address (the webserver on DAGSTER_WEBSERVER_PORT): run links."""
        return _ui_address(self.webserver_port)

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
            batch_size=_int_setting(
                env, "REMINDER_BATCH_SIZE", DEFAULT_BATCH_SIZE, 1, MAX_BATCH_SIZE
            ),
            cycle_budget_seconds=_float_setting(
                env,
                "REMINDER_CYCLE_BUDGET_SECONDS",
                DEFAULT_CYCLE_BUDGET_SECONDS,
                MIN_BUDGET_SECONDS,
                MAX_BUDGET_SECONDS,
            ),
            embedded_pg_port=_int_setting(
                env, "REMINDER_EMBEDDED_PG_PORT", DEFAULT_EMBEDDED_PG_PORT, 1, 65535
            ),
            embedded_broker_port=_int_setting(
                env, "REMINDER_EMBEDDED_BROKER_PORT", DEFAULT_EMBEDDED_BROKER_PORT, 1, 65535
            ),
            webserver_port=_int_setting(
                env, "DAGSTER_WEBSERVER_PORT", DEFAULT_WEBSERVER_PORT, 1, 65535
            ),
            metrics_port=_int_setting(env, "REMINDER_METRICS_PORT", DEFAULT_METRICS_PORT, 1, 65535),
            env=env,
        )


def _ui_address(port: int) -> str:
    return f"http://127.0.0.1:{port}"


def dagster_ui_url(env: Mapping[str, str] | None = None) -> str:
    """The Dagster UI's address from DAGSTER_WEBSERVER_PORT alone (what definitions link at load,
    before a run has the rest of the settings)."""
    env = os.environ if env is None else env
    return _ui_address(
        _int_setting(env, "DAGSTER_WEBSERVER_PORT", DEFAULT_WEBSERVER_PORT, 1, 65535)
    )
