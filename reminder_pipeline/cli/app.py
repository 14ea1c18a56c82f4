"""The ``reminder-pipeline`` commands (click): thin adapters over the same calls as the Dagster ops.

Every value is checked by the validators in :mod:`reminder_pipeline.config`, the ones the
environment and the Dagster run config use, so a bad value is the same one line wherever it comes
from, naming it as the operator gave it (``--batch-size`` or ``REMINDER_BATCH_SIZE``). Exit codes:
see :mod:`.output` and docs/cli.md. Only ``db upgrade`` (and ``up``, the embedded quick start)
migrate: the dispatcher's commands run as the least-privilege role and refuse an old schema.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

import click
from click.core import ParameterSource

from .. import __version__, logs
from ..config import (
    DEFAULT_BATCH_SIZE,
    DEFAULT_CYCLE_BUDGET_SECONDS,
    DEFAULT_MAX_BATCHES,
    DEFAULT_POISON_LIMIT,
    DEFAULT_PURGE_BATCH_SIZE,
    DEFAULT_RETENTION_HOURS,
    ConfigError,
    Settings,
    check_as_of,
    check_batch_size,
    check_budget_seconds,
    check_max_batches,
    check_number,
    check_poison_limit,
    check_port,
    check_purge_batch_size,
    check_retention_hours,
    mask_url,
)
from .output import (
    EXIT_FAILURE,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_PARTIAL,
    EXIT_USAGE,
    ProgressLine,
    print_error,
    print_fields,
    print_json,
    print_table,
)

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

    from ..domain.model import CycleCounts
    from ..local.dagster_processes import StackRecord
    from ..local.endpoints import Endpoints
    from ..messaging.kafka import KafkaPublisher

log = logging.getLogger("reminder_pipeline.cli")

#: How often a progress line is written on stderr during long work.
DEFAULT_PROGRESS_SECONDS = 5.0


class SchemaNotReady(RuntimeError):
    """The database is behind the code's schema; ``db upgrade`` (as the owner) must run first."""


# --- values: the shared validators behind click -----------------------------------------------


def _given_as(param: click.Parameter, ctx: click.Context | None) -> str:
    """The name the operator used for a value: its environment variable or its option."""
    if (
        ctx is not None
        and param.name is not None
        and isinstance(param.envvar, str)
        and ctx.get_parameter_source(param.name) is ParameterSource.ENVIRONMENT
    ):
        return param.envvar
    if isinstance(param, click.Option):
        return max(param.opts, key=len)
    return param.human_readable_name


class Checked(click.ParamType):
    """A click type that converts through one of :mod:`reminder_pipeline.config`'s validators."""

    def __init__(self, check: Callable[[object, str], Any], metavar: str) -> None:
        self.check = check
        self.metavar = metavar
        self.name = metavar.lower()

    def get_metavar(self, param: click.Parameter, ctx: click.Context | None = None) -> str:
        """The placeholder shown in ``--help``."""
        return self.metavar

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        """The checked value; a bad one raises the validator's one-line ConfigError (exit 2)."""
        name = _given_as(param, ctx) if param is not None else "value"
        return self.check(value, name)


BATCH_SIZE = Checked(check_batch_size, "ROWS")
MAX_BATCHES = Checked(check_max_batches, "N")
BUDGET_SECONDS = Checked(check_budget_seconds, "SECONDS")
AS_OF = Checked(lambda value, name: check_as_of(value, name), "ISO-8601")
RETENTION_HOURS = Checked(check_retention_hours, "HOURS")
PURGE_BATCH_SIZE = Checked(check_purge_batch_size, "ROWS")
POISON_LIMIT = Checked(check_poison_limit, "ROWS")
PORT = Checked(check_port, "PORT")
PROGRESS_SECONDS = Checked(lambda value, name: check_number(value, name, 0.0, 3600.0), "SECONDS")


def _check_reminder_id(value: object, name: str) -> uuid.UUID:
    try:
        return value if isinstance(value, uuid.UUID) else uuid.UUID(str(value).strip())
    except ValueError:
        raise ConfigError(f"{name}={value!r} is not a reminder id (a UUID)") from None


REMINDER_ID = Checked(_check_reminder_id, "REMINDER_ID")

json_option = click.option(
    "--json",
    "as_json",
    is_flag=True,
    default=False,
    envvar="REMINDER_JSON",
    show_envvar=True,
    help="Print the result as JSON (data for scripts) instead of text.",
)


# --- shared plumbing ---------------------------------------------------------------------------


def _settings() -> Settings:
    return Settings.from_env()


def _open(settings: Settings, *, broker: bool = False) -> tuple[Endpoints, Engine]:
    """The servers the command needs (a URL, else the embedded ones), an engine that answers."""
    from ..local.endpoints import ensure_servers
    from ..store.engine import check_connection, make_engine

    endpoints = ensure_servers(settings, broker=broker)
    engine = make_engine(endpoints.database_url)
    check_connection(engine)
    return endpoints, engine


def _require_schema(engine: Engine) -> None:
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
def _database(*, schema: bool = True) -> Iterator[Engine]:
    """The app database for one command: reachable, at this code's schema unless ``schema`` is
    False (the migration commands), disposed afterwards."""
    _, engine = _open(_settings())
    try:
        if schema:
            _require_schema(engine)
        yield engine
    finally:
        engine.dispose()


def _publisher(settings: Settings, bootstrap_servers: str | None) -> KafkaPublisher:
    from ..messaging.kafka import KafkaPublisher, ensure_topic

    kafka = settings.kafka(bootstrap_servers)
    ensure_topic(kafka, timeout=10.0)  # also the broker's reachability check, before any write
    return KafkaPublisher(kafka)


def _operator() -> str:
    """The operator's OS user (the audit trail of destructive commands)."""
    from ..audit import os_user

    return os_user()


@contextmanager
def _stop_signals(*more: signal.Signals) -> Iterator[threading.Event]:
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
def _interrupt_on(*signals: signal.Signals) -> Iterator[None]:
    """``signals`` raise KeyboardInterrupt, as SIGINT does (one way out of a start)."""

    def interrupt(*_: object) -> None:
        raise KeyboardInterrupt

    previous = {sig: signal.signal(sig, interrupt) for sig in signals}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


# --- the group ---------------------------------------------------------------------------------


@click.group(
    context_settings={
        "show_default": True,
        "help_option_names": ["-h", "--help"],
        "max_content_width": 100,
    },
)
@click.version_option(
    __version__, "--version", prog_name="reminder-pipeline", message="%(prog)s %(version)s"
)
@click.option(
    "--log-level",
    type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
    default="INFO",
    envvar="REMINDER_LOG_LEVEL",
    show_envvar=True,
    help="Level of the JSON log lines on stderr.",
)
@click.option(
    "--progress-seconds",
    type=PROGRESS_SECONDS,
    default=DEFAULT_PROGRESS_SECONDS,
    envvar="REMINDER_PROGRESS_SECONDS",
    show_envvar=True,
    help="Interval of the progress lines on stderr during long work (0: every step).",
)
@click.pass_context
def cli(ctx: click.Context, log_level: str, progress_seconds: float) -> None:
    """The calendar's reminder dispatcher: the same use cases as the Dagster jobs, from a shell.

    Exit codes: 0 done; 1 runtime failure (a server down, a row not in a state the command may
    change); 2 bad usage or configuration (nothing was started or written); 3 partial publish
    (rows written, some outbox rows left unpublished for the next relay); 130 interrupted.
    """
    logs.configure(getattr(logging, log_level.upper(), logging.INFO))
    ctx.obj = {"progress_seconds": progress_seconds}


def progress_line() -> ProgressLine:
    """A progress line on stderr at the interval given by ``--progress-seconds``."""
    obj = click.get_current_context().find_root().obj or {}
    return ProgressLine(
        sys.stderr, every_seconds=obj.get("progress_seconds", DEFAULT_PROGRESS_SECONDS)
    )


# --- dispatch and relay ------------------------------------------------------------------------


def _relay_exit(failed: int) -> int:
    return EXIT_OK if failed == 0 else EXIT_PARTIAL


@cli.command()
@click.option(
    "--batch-size",
    type=BATCH_SIZE,
    default=DEFAULT_BATCH_SIZE,
    envvar="REMINDER_BATCH_SIZE",
    show_envvar=True,
    help="Rows per batch (each batch one transaction), 1..10,000.",
)
@click.option(
    "--max-batches",
    type=MAX_BATCHES,
    default=DEFAULT_MAX_BATCHES,
    envvar="REMINDER_MAX_BATCHES",
    show_envvar=True,
    help="Batches this cycle may drain (1 = the design's cycle), 1..10,000.",
)
@click.option(
    "--budget-seconds",
    type=BUDGET_SECONDS,
    default=DEFAULT_CYCLE_BUDGET_SECONDS,
    envvar="REMINDER_CYCLE_BUDGET_SECONDS",
    show_envvar=True,
    help="No new batch starts after this many seconds, 1..600.",
)
@click.option(
    "--as-of",
    type=AS_OF,
    default=None,
    envvar="REMINDER_AS_OF",
    show_envvar=True,
    show_default="now",
    help="AsOf: ISO-8601 with a zone (2026-11-30T10:00:00Z), never in the future.",
)
@click.option(
    "--no-relay",
    is_flag=True,
    default=False,
    envvar="REMINDER_NO_RELAY",
    show_envvar=True,
    help="Write Sent rows and their outbox rows, publish nothing.",
)
@json_option
def dispatch(
    batch_size: int,
    max_batches: int,
    budget_seconds: float,
    as_of: datetime | None,
    no_relay: bool,
    as_json: bool,
) -> int:
    """Run one dispatch cycle now (select, decide, transition + outbox, relay); print its counts.

    Never migrates: run `db upgrade` first. Exit 3 when some outbox rows could not be published.
    """
    from .. import cycle

    settings = _settings()
    endpoints, engine = _open(settings, broker=not no_relay)
    try:
        _require_schema(engine)
        publisher = None if no_relay else _publisher(settings, endpoints.bootstrap_servers)
        line = progress_line()

        def progress(counts: CycleCounts) -> None:
            # The backlog is counted only when a line is due (every few seconds of a drain).
            if line.due():
                line.rows(counts.selected, cycle.backlog_left(engine))

        try:
            report = cycle.run_cycle(
                engine,
                publisher,
                as_of=as_of,
                batch_size=batch_size,
                max_batches=max_batches,
                budget_seconds=budget_seconds,
                progress=progress,
            )
        finally:
            if publisher is not None:
                publisher.close()
    finally:
        engine.dispose()
    counts = report.as_dict()
    if as_json:
        print_json(counts)
    else:
        print_fields(
            "dispatch cycle",
            {
                k: counts.get(k)
                for k in (
                    "sent",
                    "skipped",
                    "skipped_locked",
                    "failed",
                    "published",
                    "publish_failed",
                    "batches",
                    "duration_ms",
                    "backlog_remaining",
                    "run_id",
                )
            },
        )
    return _relay_exit(report.relay.failed)


@cli.command()
@click.option(
    "--budget-seconds",
    type=BUDGET_SECONDS,
    default=DEFAULT_CYCLE_BUDGET_SECONDS,
    envvar="REMINDER_CYCLE_BUDGET_SECONDS",
    show_envvar=True,
    help="Stop publishing after this many seconds, 1..600.",
)
@json_option
def relay(budget_seconds: float, as_json: bool) -> int:
    """Publish unpublished outbox rows now. Exit 3 when some could not be published."""
    from ..messaging.relay import relay_outbox

    settings = _settings()
    endpoints, engine = _open(settings, broker=True)
    try:
        _require_schema(engine)
        publisher = _publisher(settings, endpoints.bootstrap_servers)
        try:
            result = relay_outbox(engine, publisher, budget_seconds=budget_seconds)
        finally:
            publisher.close()
    finally:
        engine.dispose()
    data = {
        "published": result.published,
        "failed": result.failed,
        "batches": result.batches,
        "busy": result.busy,
        "last_error": result.last_error,
    }
    if as_json:
        print_json(data)
    else:
        print_fields("relay", data)
    return _relay_exit(result.failed)


# --- poison rows -------------------------------------------------------------------------------


@cli.group()
def poison() -> None:
    """Rows that keep failing: list them, retry one now, or skip one for good."""


@poison.command("list")
@click.option(
    "--limit",
    type=POISON_LIMIT,
    default=DEFAULT_POISON_LIMIT,
    envvar="REMINDER_POISON_LIMIT",
    show_envvar=True,
    help="Rows listed at most, 1..1,000.",
)
@json_option
def poison_list(limit: int, as_json: bool) -> int:
    """Pending rows with failed attempts, oldest due first, with their last error."""
    from ..operator_jobs import poison as poison_rows

    with _database() as engine:
        rows = poison_rows.list_rows(engine, limit)
    if as_json:
        print_json(rows)
    else:
        print_table(
            rows,
            ("id", "attempts", "next_attempt_at", "due_at", "last_error"),
            empty="no poison rows",
        )
    return EXIT_OK


def _poison_change(action: str, reminder_id: uuid.UUID, force: bool) -> int:
    """Retry or skip one row in its own transaction; refuse a row that has not failed."""
    from ..operator_jobs import poison as poison_rows

    with _database() as engine:
        done = poison_rows.change(engine, action, reminder_id, actor=_operator(), force=force)
    if done.changed:
        print(f"poison {action}: done ({reminder_id})", flush=True)
        return EXIT_OK
    reason = (done.reason or "").replace("force acts", "--force acts")
    print_error(f"poison {action} {reminder_id}: nothing changed: {reason}")
    return EXIT_FAILURE


_FORCE_HELP = (
    "Act on a Pending row even if it never failed. No environment variable: "
    "it must be typed each time."
)


@poison.command("retry")
@click.argument("reminder_id", type=REMINDER_ID)
@click.option("--force", is_flag=True, default=False, help=_FORCE_HELP)
def poison_retry(reminder_id: uuid.UUID, force: bool) -> int:
    """Clear a poison row's back-off so the next cycle tries it (logged with your OS user)."""
    return _poison_change("retry", reminder_id, force)


@poison.command("skip")
@click.argument("reminder_id", type=REMINDER_ID)
@click.option("--force", is_flag=True, default=False, help=_FORCE_HELP)
def poison_skip(reminder_id: uuid.UUID, force: bool) -> int:
    """Move a poison row to Skipped: it is never published (logged with your OS user)."""
    return _poison_change("skip", reminder_id, force)


# --- outbox ------------------------------------------------------------------------------------


@cli.group()
def outbox() -> None:
    """Outbox maintenance."""


@outbox.command("purge")
@click.option(
    "--retention-hours",
    type=RETENTION_HOURS,
    default=DEFAULT_RETENTION_HOURS,
    envvar="REMINDER_OUTBOX_RETENTION_HOURS",
    show_envvar=True,
    help="Delete published rows older than this; at least 1 hour, at most 366 days.",
)
@click.option(
    "--batch-size",
    type=PURGE_BATCH_SIZE,
    default=DEFAULT_PURGE_BATCH_SIZE,
    envvar="REMINDER_PURGE_BATCH_SIZE",
    show_envvar=True,
    help="Rows per DELETE transaction, 1..10,000.",
)
@json_option
def outbox_purge(retention_hours: float, batch_size: int, as_json: bool) -> int:
    """Delete published outbox rows past the retention, in small batches; never unpublished ones."""
    from ..operator_jobs.outbox_retention import purge_outbox

    with _database() as engine:
        deleted = purge_outbox(
            engine,
            timedelta(hours=retention_hours),
            batch_size=batch_size,
            operator=_operator(),
        )
    if as_json:
        print_json({"deleted": deleted, "retention_hours": retention_hours})
    else:
        print(
            f"purged {deleted} published outbox rows older than {retention_hours:g} h", flush=True
        )
    return EXIT_OK


# --- schema ------------------------------------------------------------------------------------


@cli.group()
def db() -> None:
    """Schema migrations (Alembic). Run them with the schema owner's DATABASE_URL."""


def _revision_line(engine: Engine) -> dict[str, str | None]:
    from ..store import migrate

    return {"current": migrate.current_revision(engine), "head": migrate.head_revision()}


def _print_revision(data: dict[str, str | None], as_json: bool) -> None:
    if as_json:
        print_json(data)
    else:
        print(f"database at revision {data['current']} (head {data['head']})", flush=True)


@db.command("upgrade")
@json_option
def db_upgrade(as_json: bool) -> int:
    """Migrate the schema to this code's head (the owner role; the dispatcher never does)."""
    from ..store import migrate

    with _database(schema=False) as engine:
        migrate.upgrade(engine)
        data = _revision_line(engine)
    _print_revision(data, as_json)
    return EXIT_OK


@db.command("current")
@json_option
def db_current(as_json: bool) -> int:
    """Show the schema's revision and this code's head."""
    with _database(schema=False) as engine:
        data = _revision_line(engine)
    _print_revision(data, as_json)
    return EXIT_OK


# A relative revision (-1) is a REVISION, not an unknown option.
@db.command("downgrade", context_settings={"ignore_unknown_options": True})
@click.argument("revision")
@click.option(
    "--yes",
    is_flag=True,
    default=False,
    help="Confirm: a downgrade drops tables and columns with their data. No environment "
    "variable: it must be typed each time.",
)
def db_downgrade(revision: str, yes: bool) -> int:
    """Migrate the schema back to REVISION (a revision id, or `base` for nothing at all).

    Destructive: refused without --yes; logged with your OS user.
    """
    from ..audit import audited
    from ..store import migrate

    revision = revision.strip()
    if not revision:
        raise ConfigError("db downgrade needs a REVISION (see `reminder-pipeline db current`)")
    if not yes:
        raise ConfigError(
            f"db downgrade {revision} drops schema objects and their data: add --yes to confirm"
        )
    with _database(schema=False) as engine:
        before = migrate.current_revision(engine)
        with audited(
            "schema downgrade",
            operator=_operator(),
            action="db downgrade",
            from_revision=before,
            target=revision,
        ) as outcome:
            try:
                migrate.downgrade(engine, revision)
            except migrate.BadRevision as error:
                raise ConfigError(
                    f"db downgrade {revision}: {error} (revisions: `reminder-pipeline db current`,"
                    " or `base`)"
                ) from None
            data = _revision_line(engine)
            changed = data["current"] != before
            outcome.message = "schema downgraded" if changed else "schema unchanged"
            outcome.fields.update(to_revision=data["current"], changed=changed)
    if not changed:
        where = before or "no revision (empty database)"
        print(f"nothing to downgrade: the database is already at {where} ({revision})", flush=True)
        return EXIT_OK
    _print_revision(data, as_json=False)
    return EXIT_OK


# --- embedded servers --------------------------------------------------------------------------


@cli.group()
def services() -> None:
    """The embedded PostgreSQL and broker (the `embedded` extra; not for production)."""


@services.command("start")
@json_option
def services_start(as_json: bool) -> int:
    """Start the embedded servers unless running; print where they are (passwords masked)."""
    from ..local.endpoints import ensure_servers, require_embedded

    require_embedded()
    endpoints = ensure_servers(_settings())
    data = {
        name: mask_url(value) if "URL" in name else value for name, value in endpoints.env().items()
    }
    if as_json:
        print_json(data)
    else:
        for name, value in data.items():
            print(f"{name}={value}", flush=True)
    return EXIT_OK


@services.command("stop")
def services_stop() -> int:
    """Stop a running `up` of this home and its Dagster processes, then the embedded servers."""
    from ..local.dagster_processes import StackRecord
    from ..local.endpoints import require_embedded, stop_servers

    require_embedded()
    settings = _settings()
    stopped = StackRecord(settings.home).stop()
    if stopped:
        what = ", ".join(f"{name} pid {pid}" for name, pid in stopped.items())
        print(f"stopped {what}", flush=True)
    stop_servers(settings)
    print("embedded servers stopped", flush=True)
    return EXIT_OK


@services.command("status")
@json_option
def services_status(as_json: bool) -> int:
    """Whether the embedded servers and an `up` with its Dagster processes run, and where."""
    from ..local.dagster_processes import StackRecord
    from ..local.endpoints import embedded_broker, embedded_postgres, require_embedded

    require_embedded()
    settings = _settings()
    pg, broker = embedded_postgres(settings), embedded_broker(settings)
    stack = StackRecord(settings.home).running()
    data = {
        "postgres": {
            "running": pg.is_running(),
            "url": mask_url(pg.url()),
            "data_dir": str(pg.data_dir),
        },
        "broker": {"running": broker.is_running(), "bootstrap_servers": broker.bootstrap_servers},
        "dagster": {
            "running": bool(stack),
            **{f"{name}_pid": stack.get(name) for name in ("up", "daemon", "webserver")},
        },
    }
    if as_json:
        print_json(data)
    else:
        for name, fields in data.items():
            print_fields(name, fields)
    return EXIT_OK


# --- long-running processes ----------------------------------------------------------------------


@cli.command()
@click.option(
    "--group-id",
    default="notifications-reference",
    envvar="REMINDER_CONSUMER_GROUP_ID",
    show_envvar=True,
    help="Kafka consumer group.",
)
@click.option(
    "--dedup-path",
    type=click.Path(dir_okay=False),
    default=None,
    envvar="REMINDER_CONSUMER_DEDUP_PATH",
    show_envvar=True,
    show_default="under REMINDER_PIPELINE_HOME",
    help="SQLite file of delivered ReminderIds (durable de-duplication, one host).",
)
@click.option(
    "--dedup-url",
    default=None,
    envvar="REMINDER_CONSUMER_DEDUP_URL",
    show_envvar=True,
    help="PostgreSQL URL of the de-duplication table shared by consumers on several hosts.",
)
@click.option(
    "--once",
    is_flag=True,
    default=False,
    envvar="REMINDER_CONSUMER_ONCE",
    show_envvar=True,
    help="Exit when the topic has been idle for a while.",
)
@click.option(
    "--metrics-port",
    type=PORT,
    default=None,
    envvar="REMINDER_CONSUMER_METRICS_PORT",
    show_envvar=True,
    show_default="no metrics endpoint",
    help="Serve the consumer's Prometheus metrics on this port.",
)
@click.option(
    "--locale",
    type=click.Choice(["en", "ru"]),
    default="en",
    envvar="REMINDER_CONSUMER_LOCALE",
    show_envvar=True,
    help="Language of the printed notifications.",
)
def consume(
    group_id: str,
    dedup_path: str | None,
    dedup_url: str | None,
    once: bool,
    metrics_port: int | None,
    locale: str,
) -> int:
    """Run the reference notifications consumer (one line per notification)."""
    from pathlib import Path

    from ..consumer import consume_main
    from ..local.endpoints import embedded_broker, require_servers

    settings = _settings()
    require_servers(settings, database=False)
    servers = settings.kafka_bootstrap_servers or embedded_broker(settings).start()
    return consume_main(
        settings,
        group_id=group_id,
        dedup_path=Path(dedup_path) if dedup_path else None,
        dedup_url=dedup_url or None,
        once=once,
        bootstrap_servers=servers,
        metrics_port=metrics_port,
        locale=locale,
    )


@cli.command()
@click.option(
    "--host",
    default="127.0.0.1",
    envvar="REMINDER_METRICS_HOST",
    show_envvar=True,
    help="Address to listen on (a container sets 0.0.0.0).",
)
@click.option(
    "--port",
    type=PORT,
    default=9464,
    envvar="REMINDER_METRICS_PORT",
    show_envvar=True,
    help="Port of the /metrics endpoint.",
)
def metrics(host: str, port: int) -> int:
    """Serve the Prometheus metrics endpoint (read from the database) until stopped."""
    from ..observability.exporter import start_exporter

    settings = _settings()
    endpoints, engine = _open(settings)
    engine.dispose()  # the reachability check only: the exporter keeps its own small pool
    exporter = start_exporter(settings, endpoints, host=host, port=port)
    print(f"Prometheus metrics: {exporter.url}", flush=True)
    with _stop_signals() as stop:
        try:
            stop.wait()
        finally:
            exporter.stop()
    return EXIT_OK


@cli.command()
@click.option(
    "--overdue",
    type=click.IntRange(0, 10_000),
    default=12,
    envvar="REMINDER_DEMO_OVERDUE",
    show_envvar=True,
    help="Demo events whose reminders are already due.",
)
@click.option(
    "--upcoming",
    type=click.IntRange(0, 10_000),
    default=30,
    envvar="REMINDER_DEMO_UPCOMING",
    show_envvar=True,
    help="Demo events whose reminders fall due over the next minutes.",
)
@json_option
def demo(overdue: int, upcoming: int, as_json: bool) -> int:
    """Seed demo events (a development database; needs the migrated schema)."""
    from ..local import demo as demo_data

    with _database() as engine:
        data = demo_data.seed(engine, overdue=overdue, upcoming=upcoming)
    if as_json:
        print_json(data)
    else:
        print_fields("demo data", data)
    return EXIT_OK


@cli.command()
@click.option(
    "--once",
    is_flag=True,
    default=False,
    envvar="REMINDER_UP_ONCE",
    show_envvar=True,
    help="Stop after the first cycle (no Dagster).",
)
@click.option(
    "--no-demo",
    is_flag=True,
    default=False,
    envvar="REMINDER_UP_NO_DEMO",
    show_envvar=True,
    help="Neither seed nor feed demo data.",
)
@click.option(
    "--keep-servers",
    is_flag=True,
    default=False,
    envvar="REMINDER_UP_KEEP_SERVERS",
    show_envvar=True,
    help="Leave PostgreSQL and the broker running on exit.",
)
def up(once: bool, no_demo: bool, keep_servers: bool) -> int:
    """Everything on the embedded default: servers, schema, topic, demo data, a cycle, Dagster.

    The quick start (the `embedded` extra): the one command besides `db upgrade` that migrates.
    """
    from ..local.dagster_processes import StackRecord, start_guard
    from ..local.endpoints import require_embedded

    require_embedded()
    settings = _settings()
    record = _take_over(StackRecord(settings.home))
    # The guard stops what this `up` started if it ends without doing so itself (SIGKILL, ...).
    guard = start_guard(settings.home, keep_servers=keep_servers or once)
    record.add("up", os.getpid())
    record.add("guard", guard.pid)
    try:
        return _up(settings, record, once=once, demo=not no_demo, keep_servers=keep_servers)
    finally:
        if guard.stdin is not None:
            guard.stdin.close()  # EOF: the guard acts only if the record is still there
        # It may still be stopping leftovers after that; it finishes alone.
        with suppress(subprocess.TimeoutExpired):
            guard.wait(30)


def _take_over(record: StackRecord) -> StackRecord:
    """Refuse to start beside a running ``up`` of the same home; stop what a dead one left."""
    from ..local.dagster_processes import OrchestratorError

    running = record.running()
    if "up" in running:
        raise OrchestratorError(
            f"reminder-pipeline up already runs under {record.path.parent} ({record.describe()}); "
            "stop it with `reminder-pipeline services stop`"
        )
    if running:
        what = record.describe()
        record.stop()
        _say(f"stopped what an earlier up left running: {what}")
    record.remove()
    return record


def _say(text: str) -> None:
    """Print a status line; a closed stdout (``up | tee`` after Ctrl-C) must not stop the stop."""
    try:
        print(text, flush=True)
    except OSError:  # EPIPE: nobody reads; send the rest of our output nowhere
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)


def _up(
    settings: Settings, record: StackRecord, *, once: bool, demo: bool, keep_servers: bool
) -> int:
    """``up``'s work, once the guard is there."""
    from .. import cycle
    from ..local import demo as demo_data
    from ..store import migrate

    print(f"reminder-pipeline: starting under {settings.home}", flush=True)
    endpoints, engine = _open(settings, broker=True)
    migrate.upgrade(engine)
    publisher = _publisher(settings, endpoints.bootstrap_servers)
    if demo:
        demo_data.seed(engine)
    report = cycle.run_cycle(engine, publisher, batch_size=settings.batch_size)
    publisher.close()
    counts = report.as_dict()
    print(
        "first dispatch cycle: sent={sent} skipped={skipped} skipped_locked={skipped_locked} "
        "failed={failed} published={published} duration_ms={duration_ms} "
        "backlog_remaining={backlog_remaining}".format(**counts),
        flush=True,
    )
    if once:
        engine.dispose()
        record.remove()  # the servers stay up by design; nothing else was started
        return EXIT_OK
    return _run_dagster(
        settings, endpoints, engine, record=record, demo=demo, keep_servers=keep_servers
    )


def _run_dagster(
    settings: Settings,
    endpoints: Endpoints,
    engine: Engine,
    *,
    record: StackRecord,
    demo: bool,
    keep_servers: bool,
) -> int:
    """Dagster webserver + daemon, the exporter and the demo feeder until stopped; then stop all.

    Stopped by Ctrl-C (SIGINT), SIGTERM or the terminal's SIGHUP. Each step of the stop runs
    even if one before failed; the record is removed only when all of them succeeded (else the
    guard stops the rest when we exit).
    """
    from ..local import demo as demo_data
    from ..local.dagster_processes import DagsterStack
    from ..local.endpoints import stop_servers
    from ..observability.exporter import start_exporter

    env = {**os.environ, **endpoints.env(), "REMINDER_PIPELINE_HOME": str(settings.home)}
    stack = DagsterStack(
        home=settings.home / "dagster_home", env=env, port=settings.webserver_port, record=record
    )
    feeder = demo_data.DemoFeeder(engine) if demo else None
    exporter = None
    try:
        # Ctrl-C (or SIGHUP, SIGTERM) while Dagster loads interrupts the start, which stops
        # what it started.
        with _interrupt_on(signal.SIGHUP, signal.SIGTERM):
            stack.start(progress=progress_line().tick)
            exporter = start_exporter(settings, endpoints)
            if feeder:
                feeder.start()
        print(f"Dagster UI: {stack.url}  (schedule reminder_dispatch_schedule runs every minute)")
        print(f"Prometheus metrics: {exporter.url}")
        print(
            "Watch reminders arrive: reminder-pipeline consume   |   Ctrl-C stops everything",
            flush=True,
        )
        with _stop_signals(signal.SIGHUP) as stop:
            stop.wait()
    finally:
        _say("stopping...")
        steps: list[Callable[[], object]] = []
        if feeder:
            steps.append(feeder.stop)
        if exporter is not None:
            steps.append(exporter.stop)
        steps += [stack.stop, engine.dispose]
        if not keep_servers:
            steps.append(lambda: stop_servers(settings))
        failed = 0
        for step in steps:
            try:
                step()
            except Exception:  # the next steps still run; the guard gets what is left
                log.exception("stopping up: a step failed")
                failed += 1
        if not failed:
            record.remove()
        _say("stopped")
    return EXIT_OK


# --- entry point -------------------------------------------------------------------------------


def _exit_code(error: BaseException) -> int | None:
    """The documented exit code of an expected failure, else None."""
    from sqlalchemy import exc as sa_exc

    from ..local.dagster_processes import OrchestratorError
    from ..local.servers import ServiceError
    from ..store.engine import DatabaseUnavailable

    if isinstance(error, ConfigError):
        return EXIT_USAGE
    if isinstance(
        error,
        DatabaseUnavailable
        | ServiceError
        | OrchestratorError
        | SchemaNotReady
        | ConnectionError
        | sa_exc.DBAPIError
        | OSError,
    ):
        return EXIT_FAILURE
    try:
        from confluent_kafka import KafkaException
    except ImportError:  # pragma: no cover - a dependency
        return None
    return EXIT_FAILURE if isinstance(error, KafkaException) else None


def _message(error: BaseException) -> str:
    """One line for an expected failure; a database error's first line, never its parameters."""
    from sqlalchemy import exc as sa_exc

    if isinstance(error, sa_exc.DBAPIError):
        detail = str(error.orig).strip().splitlines()[0] if error.orig else type(error).__name__
        return f"database error: {detail}"
    return str(error) or type(error).__name__


def main(argv: list[str] | None = None) -> int:
    """Entry point: every expected failure is one line on stderr and a documented exit code."""
    try:
        result = cli.main(args=argv, prog_name="reminder-pipeline", standalone_mode=False)
    except click.exceptions.Abort:
        return EXIT_INTERRUPTED
    except click.UsageError as error:
        where = f" (see `{error.ctx.command_path} --help`)" if error.ctx is not None else ""
        print_error(f"{error.format_message()}{where}")
        return EXIT_USAGE
    except click.ClickException as error:
        print_error(error.format_message())
        return error.exit_code
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except Exception as error:  # mapped to a documented exit code, or re-raised
        code = _exit_code(error)
        if code is None:
            raise
        print_error(_message(error))
        return code
    return result if isinstance(result, int) else EXIT_OK


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
