"""``metrics``: the Prometheus metrics endpoint (read from the database) until stopped."""

from __future__ import annotations

import click

from .context import load_settings, open_servers, stop_requests
from .exits import EXIT_OK
from .options import env_option, port_option


@click.command()
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
    with stop_requests() as stop:
        try:
            stop.wait()
        finally:
            exporter.stop()
    return EXIT_OK
