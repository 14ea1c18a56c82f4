"""``metrics``: the Prometheus metrics endpoint (read from the database) until stopped."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from ..config import DEFAULT_METRICS_HOST, DEFAULT_METRICS_PORT
from .context import load_settings, open_servers, stop_requests
from .exits import EXIT_OK
from .options import env_option, port_option

if TYPE_CHECKING:
    from collections.abc import Mapping

    from ..observability.exporter import DaemonHeartbeats


@click.command()
@env_option(
    "--host",
    default=DEFAULT_METRICS_HOST,
    envvar="REMINDER_METRICS_HOST",
    help="Address to listen on (a container sets 0.0.0.0).",
)
@port_option(
    "--port",
    default=DEFAULT_METRICS_PORT,
    envvar="REMINDER_METRICS_PORT",
    help="Port of the /metrics endpoint.",
)
def metrics(host: str, port: int) -> int:
    """Serve the Prometheus metrics endpoint (read from the database) until stopped."""
    from ..observability.exporter import start_exporter

    settings = load_settings()
    endpoints, engine = open_servers(settings)
    engine.dispose()  # the reachability check only: the exporter keeps its own small pool
    exporter = start_exporter(
        settings, endpoints, host=host, port=port, heartbeats=heartbeat_reader(settings.env)
    )
    print(f"Prometheus metrics: {exporter.url}", flush=True)
    with stop_requests() as stop:
        try:
            stop.wait()
        finally:
            exporter.stop()
    return EXIT_OK


#: The reader of Dagster's daemon heartbeats, in the Dagster layer (only defs/ imports Dagster;
#: the command line does not depend on it): loaded by name, and only where an instance is named.
HEARTBEATS_READER = "reminder_pipeline.defs.heartbeats"


def heartbeat_reader(env: Mapping[str, str]) -> DaemonHeartbeats | None:
    """Dagster's daemon heartbeats when ``DAGSTER_HOME`` names an instance, else None."""
    import importlib

    if not env.get("DAGSTER_HOME"):
        return None
    reader: DaemonHeartbeats = importlib.import_module(HEARTBEATS_READER).instance_heartbeats()
    return reader
