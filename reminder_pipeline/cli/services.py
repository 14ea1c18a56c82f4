"""``services start|stop|status``: the embedded PostgreSQL and broker (the ``embedded`` extra)."""

from __future__ import annotations

from typing import Any

import click

from ..config import mask_url
from .context import load_settings
from .exits import EXIT_OK
from .options import json_option
from .output import print_fields, print_json, psql_url


@click.group()
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
    from ..local.endpoints import require_embedded, stop_servers
    from ..local.stack_record import StackRecord

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
    """Whether the embedded servers and an `up` with its Dagster processes run, and where; and
    the consumer's de-duplication store (`trace --dedup-path`; trace finds it by itself)."""
    from ..consumer.delivered import consumers_file
    from ..local.endpoints import (
        APP_DATABASE,
        embedded_broker,
        embedded_postgres,
        require_embedded,
    )
    from ..local.stack_record import StackRecord

    require_embedded()
    settings = load_settings()
    pg, broker = embedded_postgres(settings), embedded_broker(settings)
    stack = StackRecord(settings.home).running()
    store = consumers_file(settings)  # None: `consume` keeps REMINDER_CONSUMER_DEDUP_URL's
    data: dict[str, dict[str, Any]] = {
        "postgres": {
            "running": pg.is_running(),
            # The app's database as `up` prints it ("Database:"), a URL psql takes.
            "url": psql_url(settings.database_url or pg.url(APP_DATABASE)),
            "data_dir": str(pg.data_dir),
        },
        "broker": {"running": broker.is_running(), "bootstrap_servers": broker.bootstrap_servers},
        "dagster": {
            "running": bool(stack),
            **{f"{name}_pid": stack.get(name) for name in ("up", "daemon", "webserver")},
        },
        "consumer": {
            "dedup_path": None if store is None else str(store),
            "written": store is not None and store.is_file(),
        },
    }
    if as_json:
        print_json(data)
    else:
        for name, fields in data.items():
            print_fields(name, fields)
    return EXIT_OK
