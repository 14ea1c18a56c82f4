"""The ``reminder-pipeline`` commands (click): thin adapters over the same calls as the Dagster ops.

The values and shared options: :mod:`.options`; what the commands open at run time:
:mod:`.context`; exit codes: :mod:`.exits` and docs/cli.md.
"""

from __future__ import annotations

import logging
import uuid
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

import click

from .. import __version__, logs
from ..config import (
    DEFAULT_BATCH_SIZE,
    DEFAULT_MAX_BATCHES,
    DEFAULT_POISON_LIMIT,
    DEFAULT_PURGE_BATCH_SIZE,
    DEFAULT_RETENTION_HOURS,
    ConfigError,
    mask_url,
)
from .context import (
    DEFAULT_PROGRESS_SECONDS,
    database,
    load_settings,
    open_publisher,
    open_servers,
    operator_name,
    progress_line,
    require_schema,
    stop_signals,
)
from .exits import (
    EXIT_FAILURE,
    EXIT_OK,
    relay_exit,
    run,
)
from .options import (
    AS_OF,
    BATCH_SIZE,
    MAX_BATCHES,
    POISON_LIMIT,
    PROGRESS_SECONDS,
    PURGE_BATCH_SIZE,
    RETENTION_HOURS,
    batch_size_option,
    budget_option,
    env_option,
    flag,
    force_option,
    json_option,
    port_option,
    reminder_id_argument,
)
from .output import PROG, print_error, print_fields, print_json, print_table
from .up import up

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

    from ..domain.model import CycleCounts


@click.group(
    context_settings={
        "show_default": True,
        "help_option_names": ["-h", "--help"],
        "max_content_width": 100,
    },
)
@click.version_option(__version__, "--version", prog_name=PROG, message="%(prog)s %(version)s")
@env_option(
    "--log-level",
    type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
    default="INFO",
    envvar="REMINDER_LOG_LEVEL",
    help="Level of the JSON log lines on stderr.",
)
@env_option(
    "--progress-seconds",
    type=PROGRESS_SECONDS,
    default=DEFAULT_PROGRESS_SECONDS,
    envvar="REMINDER_PROGRESS_SECONDS",
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


# --- dispatch -------------------------------------------------------------------------------------


@cli.command()
@batch_size_option(
    type=BATCH_SIZE,
    default=DEFAULT_BATCH_SIZE,
    envvar="REMINDER_BATCH_SIZE",
    help="Rows per batch (each batch one transaction), 1..10,000.",
)
@env_option(
    "--max-batches",
    type=MAX_BATCHES,
    default=DEFAULT_MAX_BATCHES,
    envvar="REMINDER_MAX_BATCHES",
    help="Batches this cycle may drain (1 = the design's cycle), 1..10,000.",
)
@budget_option(help="No new batch starts after this many seconds, 1..600.")
@env_option(
    "--as-of",
    type=AS_OF,
    default=None,
    envvar="REMINDER_AS_OF",
    show_default="now",
    help="AsOf: ISO-8601 with a zone (2026-11-30T10:00:00Z), never in the future.",
)
@flag(
    "--no-relay",
    envvar="REMINDER_NO_RELAY",
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

    settings = load_settings()
    endpoints, engine = open_servers(settings, broker=not no_relay)
    try:
        require_schema(engine)
        publisher = None if no_relay else open_publisher(settings, endpoints.bootstrap_servers)
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
    return relay_exit(report.relay.failed)


@cli.command()
@budget_option(help="Stop publishing after this many seconds, 1..600.")
@json_option
def relay(budget_seconds: float, as_json: bool) -> int:
    """Publish unpublished outbox rows now. Exit 3 when some could not be published."""
    from ..messaging.relay import relay_outbox

    settings = load_settings()
    endpoints, engine = open_servers(settings, broker=True)
    try:
        require_schema(engine)
        publisher = open_publisher(settings, endpoints.bootstrap_servers)
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
    return relay_exit(result.failed)


# --- poison ---------------------------------------------------------------------------------------


@cli.group()
def poison() -> None:
    """Rows that keep failing: list them, retry one now, or skip one for good."""


@poison.command("list")
@env_option(
    "--limit",
    type=POISON_LIMIT,
    default=DEFAULT_POISON_LIMIT,
    envvar="REMINDER_POISON_LIMIT",
    help="Rows listed at most, 1..1,000.",
)
@json_option
def poison_list(limit: int, as_json: bool) -> int:
    """Pending rows with failed attempts, oldest due first, with their last error."""
    from ..operator_jobs import poison as poison_rows

    with database() as engine:
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

    with database() as engine:
        done = poison_rows.change(engine, action, reminder_id, actor=operator_name(), force=force)
    if done.changed:
        print(f"poison {action}: done ({reminder_id})", flush=True)
        return EXIT_OK
    reason = (done.reason or "").replace("force acts", "--force acts")
    print_error(f"poison {action} {reminder_id}: nothing changed: {reason}")
    return EXIT_FAILURE


@poison.command("retry")
@reminder_id_argument
@force_option
def poison_retry(reminder_id: uuid.UUID, force: bool) -> int:
    """Clear a poison row's back-off so the next cycle tries it (logged with your OS user)."""
    return _poison_change("retry", reminder_id, force)


@poison.command("skip")
@reminder_id_argument
@force_option
def poison_skip(reminder_id: uuid.UUID, force: bool) -> int:
    """Move a poison row to Skipped: it is never published (logged with your OS user)."""
    return _poison_change("skip", reminder_id, force)


# --- outbox ---------------------------------------------------------------------------------------


@cli.group()
def outbox() -> None:
    """Outbox maintenance."""


@outbox.command("purge")
@env_option(
    "--retention-hours",
    type=RETENTION_HOURS,
    default=DEFAULT_RETENTION_HOURS,
    envvar="REMINDER_OUTBOX_RETENTION_HOURS",
    help="Delete published rows older than this; at least 1 hour, at most 366 days.",
)
@batch_size_option(
    type=PURGE_BATCH_SIZE,
    default=DEFAULT_PURGE_BATCH_SIZE,
    envvar="REMINDER_PURGE_BATCH_SIZE",
    help="Rows per DELETE transaction, 1..10,000.",
)
@json_option
def outbox_purge(retention_hours: float, batch_size: int, as_json: bool) -> int:
    """Delete published outbox rows past the retention, in small batches; never unpublished ones."""
    from ..operator_jobs.outbox_retention import purge_outbox

    with database() as engine:
        deleted = purge_outbox(
            engine,
            timedelta(hours=retention_hours),
            batch_size=batch_size,
            operator=operator_name(),
        )
    if as_json:
        print_json({"deleted": deleted, "retention_hours": retention_hours})
    else:
        print(
            f"purged {deleted} published outbox rows older than {retention_hours:g} h", flush=True
        )
    return EXIT_OK


# --- db -------------------------------------------------------------------------------------------


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

    with database(schema=False) as engine:
        migrate.upgrade(engine)
        data = _revision_line(engine)
    _print_revision(data, as_json)
    return EXIT_OK


@db.command("current")
@json_option
def db_current(as_json: bool) -> int:
    """Show the schema's revision and this code's head."""
    with database(schema=False) as engine:
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
    with database(schema=False) as engine:
        before = migrate.current_revision(engine)
        with audited(
            "schema downgrade",
            operator=operator_name(),
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


# --- services -------------------------------------------------------------------------------------


@cli.group()
def services() -> None:
    """The embedded PostgreSQL and broker (the `embedded` extra; not for production)."""


@services.command("start")
@json_option
def services_start(as_json: bool) -> int:
    """Start the embedded servers unless running; print where they are (passwords masked)."""
    from ..local.endpoints import ensure_servers, require_embedded

    require_embedded()
    endpoints = ensure_servers(load_settings())
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
    settings = load_settings()
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
    settings = load_settings()
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


# --- consume --------------------------------------------------------------------------------------


@cli.command()
@env_option(
    "--group-id",
    default="notifications-reference",
    envvar="REMINDER_CONSUMER_GROUP_ID",
    help="Kafka consumer group.",
)
@env_option(
    "--dedup-path",
    type=click.Path(dir_okay=False),
    default=None,
    envvar="REMINDER_CONSUMER_DEDUP_PATH",
    show_default="under REMINDER_PIPELINE_HOME",
    help="SQLite file of delivered ReminderIds (durable de-duplication).",
)
@flag(
    "--once",
    envvar="REMINDER_CONSUMER_ONCE",
    help="Exit when the topic has been idle for a while.",
)
@port_option(
    "--metrics-port",
    envvar="REMINDER_CONSUMER_METRICS_PORT",
    show_default="no metrics endpoint",
    help="Serve the consumer's Prometheus metrics on this port.",
)
@env_option(
    "--locale",
    type=click.Choice(["en", "ru"]),
    default="en",
    envvar="REMINDER_CONSUMER_LOCALE",
    help="Language of the printed notifications.",
)
def consume(
    group_id: str, dedup_path: str | None, once: bool, metrics_port: int | None, locale: str
) -> int:
    """Run the reference notifications consumer (one line per notification)."""
    from pathlib import Path

    from ..consumer import consume_main
    from ..local.endpoints import embedded_broker, require_servers

    settings = load_settings()
    require_servers(settings, database=False)
    servers = settings.kafka_bootstrap_servers or embedded_broker(settings).start()
    return consume_main(
        settings,
        group_id=group_id,
        dedup_path=Path(dedup_path) if dedup_path else None,
        once=once,
        bootstrap_servers=servers,
        metrics_port=metrics_port,
        locale=locale,
    )


# --- metrics --------------------------------------------------------------------------------------


@cli.command()
@env_option(
    "--host",
    default="127.0.0.1",
    envvar="REMINDER_METRICS_HOST",
    help="Address to listen on (a container sets 0.0.0.0).",
)
@port_option(
    "--port",
    default=9464,
    envvar="REMINDER_METRICS_PORT",
    help="Port of the /metrics endpoint.",
)
def metrics(host: str, port: int) -> int:
    """Serve the Prometheus metrics endpoint (read from the database) until stopped."""
    from ..observability.exporter import start_exporter

    settings = load_settings()
    endpoints, engine = open_servers(settings)
    engine.dispose()  # the reachability check only: the exporter keeps its own small pool
    exporter = start_exporter(settings, endpoints, host=host, port=port)
    print(f"Prometheus metrics: {exporter.url}", flush=True)
    with stop_signals() as stop:
        try:
            stop.wait()
        finally:
            exporter.stop()
    return EXIT_OK


# --- demo -----------------------------------------------------------------------------------------


@cli.command()
@env_option(
    "--overdue",
    type=click.IntRange(0, 10_000),
    default=12,
    envvar="REMINDER_DEMO_OVERDUE",
    help="Demo events whose reminders are already due.",
)
@env_option(
    "--upcoming",
    type=click.IntRange(0, 10_000),
    default=30,
    envvar="REMINDER_DEMO_UPCOMING",
    help="Demo events whose reminders fall due over the next minutes.",
)
@json_option
def demo(overdue: int, upcoming: int, as_json: bool) -> int:
    """Seed demo events (a development database; needs the migrated schema)."""
    from ..local import demo as demo_data

    with database() as engine:
        data = demo_data.seed(engine, overdue=overdue, upcoming=upcoming)
    if as_json:
        print_json(data)
    else:
        print_fields("demo data", data)
    return EXIT_OK


cli.add_command(up)


def main(argv: list[str] | None = None) -> int:
    """Entry point: every expected failure is one line on stderr and a documented exit code."""
    return run(cli, argv, prog_name=PROG)
