"""``reminder-pipeline``: a thin command line over the same use cases the Dagster ops call."""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
import uuid
from datetime import datetime
from typing import Any

from . import cycle, logs
from .config import ConfigError, Settings
from .services import ServiceError

log = logging.getLogger("reminder_pipeline.cli")


def _settings() -> Settings:
    return Settings.from_env()


def _open(settings: Settings):
    """Start what the environment does not replace; an engine on the app database, reachable."""
    from .db import check_connection, make_engine
    from .runtime import ensure_servers

    endpoints = ensure_servers(settings)
    engine = make_engine(endpoints.database_url)
    check_connection(engine)
    return endpoints, engine


def _publisher(settings: Settings, bootstrap_servers: str):
    from .messaging.kafka import KafkaPublisher, ensure_topic

    kafka = settings.kafka(bootstrap_servers)
    ensure_topic(kafka, timeout=10.0)  # also the broker's reachability check, before any write
    return KafkaPublisher(kafka)


def _print(data: Any) -> None:
    print(json.dumps(data, default=str, indent=2))


def _parse_as_of(value: str | None) -> datetime | None:
    if value is None:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise ConfigError(f"--as-of {value!r} is not an ISO-8601 timestamp") from None


def cmd_db(args: argparse.Namespace) -> int:
    """Apply or show the schema migrations."""
    from .store import migrate

    _, engine = _open(_settings())
    if args.action == "upgrade":
        migrate.upgrade(engine)
    elif args.action == "downgrade":
        migrate.downgrade(engine, args.revision or "base")
    print(f"database at revision {migrate.current_revision(engine)} (head {migrate.head_revision()})")
    return 0


def cmd_services(args: argparse.Namespace) -> int:
    """Start, stop or show the embedded servers."""
    from .runtime import embedded_broker, embedded_postgres, ensure_servers, stop_servers

    settings = _settings()
    if args.action == "start":
        _print(ensure_servers(settings).env())
    elif args.action == "stop":
        stop_servers(settings)
        print("embedded servers stopped")
    else:
        pg, broker = embedded_postgres(settings), embedded_broker(settings)
        _print(
            {
                "postgres": {"running": pg.is_running(), "url": pg.url(), "data_dir": str(pg.data_dir)},
                "broker": {"running": broker.is_running(), "bootstrap_servers": broker.bootstrap_servers},
            }
        )
    return 0


def cmd_dispatch(args: argparse.Namespace) -> int:
    """Run one dispatch cycle (select, decide, transition + outbox, relay) and print its counts."""
    from .store import migrate

    settings = _settings()
    endpoints, engine = _open(settings)
    publisher = None if args.no_relay else _publisher(settings, endpoints.bootstrap_servers)
    migrate.upgrade(engine)
    report = cycle.run_cycle(
        engine,
        publisher,
        as_of=_parse_as_of(args.as_of),
        batch_size=args.batch_size or settings.batch_size,
        max_batches=args.max_batches,
        budget_seconds=args.budget_seconds or settings.cycle_budget_seconds,
    )
    if publisher is not None:
        publisher.close()
    _print(report.as_dict())
    return 0 if report.relay.failed == 0 else 3


def cmd_relay(args: argparse.Namespace) -> int:
    """Publish unpublished outbox rows now."""
    from .messaging.relay import relay_outbox

    settings = _settings()
    endpoints, engine = _open(settings)
    publisher = _publisher(settings, endpoints.bootstrap_servers)
    result = relay_outbox(engine, publisher, budget_seconds=settings.cycle_budget_seconds)
    publisher.close()
    _print(result.__dict__)
    return 0 if result.failed == 0 else 3


def cmd_demo(args: argparse.Namespace) -> int:
    """Seed demo events."""
    from . import demo
    from .store import migrate

    _, engine = _open(_settings())
    migrate.upgrade(engine)
    _print(demo.seed(engine, overdue=args.overdue, upcoming=args.upcoming))
    return 0


def cmd_poison(args: argparse.Namespace) -> int:
    """List poison rows, or retry / skip one (each logged)."""
    from .logs import event
    from .store import repository

    _, engine = _open(_settings())
    if args.action == "list":
        with engine.connect() as conn:
            _print(repository.list_poison(conn, args.limit))
        return 0
    if not args.reminder_id:
        raise ConfigError(f"poison {args.action} needs a reminder id")
    reminder_id = uuid.UUID(args.reminder_id)
    with engine.begin() as conn:
        done = (repository.retry_poison_now if args.action == "retry" else repository.skip_poison)(
            conn, reminder_id
        )
    event(log, logging.WARNING if done else logging.INFO, f"poison row {args.action}",
          reminder_id=str(reminder_id), changed=done, actor=os.environ.get("USER", "operator"))
    print(f"{args.action}: {'done' if done else 'not Pending, nothing changed'} ({reminder_id})")
    return 0 if done else 1


def cmd_consume(args: argparse.Namespace) -> int:
    """Run the reference notifications consumer (prints one line per notification)."""
    from .consumer import consume_main

    from pathlib import Path

    from .runtime import embedded_broker

    settings = _settings()
    servers = settings.kafka_bootstrap_servers or embedded_broker(settings).start()
    return consume_main(
        settings,
        group_id=args.group_id,
        dedup_path=Path(args.dedup_path) if args.dedup_path else None,
        once=args.once,
        bootstrap_servers=servers,
        metrics_port=args.metrics_port,
        locale=args.locale,
    )


def cmd_metrics(args: argparse.Namespace) -> int:
    """Serve the Prometheus metrics endpoint (read from the database) until stopped."""
    from .observability.exporter import serve_forever
    from .runtime import ensure_servers

    settings = _settings()
    return serve_forever(settings, ensure_servers(settings))


def cmd_outbox(args: argparse.Namespace) -> int:
    """Purge published outbox rows older than the retention."""
    from datetime import timedelta

    from .retention import purge_outbox

    _, engine = _open(_settings())
    deleted = purge_outbox(engine, timedelta(hours=args.retention_hours), batch_size=args.batch_size)
    print(f"purged {deleted} published outbox rows older than {args.retention_hours} h")
    return 0


def _wait_for_stop() -> None:
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()


def cmd_up(args: argparse.Namespace) -> int:
    """Everything on the embedded default: servers, schema, topic, demo data, a first cycle, Dagster."""
    from . import demo
    from .store import migrate

    settings = _settings()
    print(f"reminder-pipeline: starting under {settings.home}", flush=True)
    endpoints, engine = _open(settings)
    migrate.upgrade(engine)
    publisher = _publisher(settings, endpoints.bootstrap_servers)
    if not args.no_demo:
        demo.seed(engine)
    report = cycle.run_cycle(engine, publisher, batch_size=settings.batch_size)
    publisher.close()
    counts = report.as_dict()
    print(
        "first dispatch cycle: sent={sent} skipped={skipped} skipped_locked={skipped_locked} "
        "failed={failed} published={published} duration_ms={duration_ms} "
        "backlog_remaining={backlog_remaining}".format(**counts),
        flush=True,
    )
    if args.once:
        return 0

    from .orchestrator import DagsterStack

    env = {**os.environ, **endpoints.env(), "REMINDER_PIPELINE_HOME": str(settings.home)}
    stack = DagsterStack(home=settings.home / "dagster_home", env=env, port=settings.webserver_port)
    feeder = demo.DemoFeeder(engine) if not args.no_demo else None
    exporter = None
    try:
        stack.start()
        try:
            from .observability.exporter import start_exporter

            exporter = start_exporter(settings, endpoints)
        except ImportError:
            exporter = None
        if feeder:
            feeder.start()
        print(f"Dagster UI: {stack.url}  (schedule reminder_dispatch_schedule runs every minute)")
        if exporter is not None:
            print(f"Prometheus metrics: http://127.0.0.1:{settings.metrics_port}/metrics")
        print("Watch reminders arrive: reminder-pipeline consume   |   Ctrl-C stops everything", flush=True)
        _wait_for_stop()
    finally:
        print("stopping...", flush=True)
        if feeder:
            feeder.stop()
        if exporter is not None:
            exporter.stop()
        stack.stop()
        engine.dispose()
        if not args.keep_servers:
            from .runtime import stop_servers

            stop_servers(settings)
        print("stopped", flush=True)
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The command line."""
    parser = argparse.ArgumentParser(prog="reminder-pipeline", description=__doc__)
    parser.add_argument("--log-level", default=os.environ.get("REMINDER_LOG_LEVEL", "INFO"))
    sub = parser.add_subparsers(dest="command", required=True)

    up = sub.add_parser("up", help="start the whole system on the embedded default")
    up.add_argument("--once", action="store_true", help="stop after the first cycle (no Dagster)")
    up.add_argument("--no-demo", action="store_true", help="do not seed or feed demo data")
    up.add_argument("--keep-servers", action="store_true", help="leave Postgres and the broker running")
    up.set_defaults(func=cmd_up)

    db = sub.add_parser("db", help="schema migrations")
    db.add_argument("action", choices=["upgrade", "downgrade", "current"])
    db.add_argument("revision", nargs="?")
    db.set_defaults(func=cmd_db)

    services = sub.add_parser("services", help="embedded servers")
    services.add_argument("action", choices=["start", "stop", "status"])
    services.set_defaults(func=cmd_services)

    dispatch = sub.add_parser("dispatch", help="run one dispatch cycle now")
    dispatch.add_argument("--batch-size", type=int)
    dispatch.add_argument("--max-batches", type=int, default=1)
    dispatch.add_argument("--budget-seconds", type=float)
    dispatch.add_argument("--as-of", help="ISO-8601, not in the future (default: now)")
    dispatch.add_argument("--no-relay", action="store_true")
    dispatch.set_defaults(func=cmd_dispatch)

    relay = sub.add_parser("relay", help="publish unpublished outbox rows now")
    relay.set_defaults(func=cmd_relay)

    demo = sub.add_parser("demo", help="seed demo events")
    demo.add_argument("--overdue", type=int, default=12)
    demo.add_argument("--upcoming", type=int, default=30)
    demo.set_defaults(func=cmd_demo)

    poison = sub.add_parser("poison", help="poison rows: list, retry now, or skip one")
    poison.add_argument("action", choices=["list", "retry", "skip"])
    poison.add_argument("reminder_id", nargs="?")
    poison.add_argument("--limit", type=int, default=100)
    poison.set_defaults(func=cmd_poison)

    consume = sub.add_parser("consume", help="reference notifications consumer")
    consume.add_argument("--group-id", default="notifications-reference")
    consume.add_argument("--dedup-path", help="SQLite file of delivered ReminderIds (durable de-duplication)")
    consume.add_argument("--once", action="store_true", help="exit when the topic is idle")
    consume.add_argument("--metrics-port", type=int, default=None,
                         help="serve the consumer's Prometheus metrics on this port")
    consume.add_argument("--locale", choices=("en", "ru"), default="en",
                         help="language of the reminder texts (default en)")
    consume.set_defaults(func=cmd_consume)
    metrics = sub.add_parser("metrics", help="serve Prometheus metrics on REMINDER_METRICS_PORT")
    metrics.set_defaults(func=cmd_metrics)

    outbox = sub.add_parser("outbox", help="outbox maintenance")
    outbox.add_argument("action", choices=["purge"])
    outbox.add_argument("--retention-hours", type=float, default=168.0)
    outbox.add_argument("--batch-size", type=int, default=1000)
    outbox.set_defaults(func=cmd_outbox)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point: every expected failure is one line on stderr and a non-zero exit."""
    args = build_parser().parse_args(argv)
    logs.configure(getattr(logging, str(args.log_level).upper(), logging.INFO))
    try:
        return args.func(args)
    except (ConfigError, ServiceError, cycle.AsOfInFutureError, ValueError, ConnectionError) as exc:
        print(f"reminder-pipeline: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
