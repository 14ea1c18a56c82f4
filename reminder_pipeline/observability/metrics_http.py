"""A ``/metrics`` HTTP endpoint in a background thread that can be stopped.

prometheus_client's :func:`~prometheus_client.start_http_server` starts the server; this keeps
its handles so a caller can stop it cleanly (``up`` and the tests start and stop endpoints in one
process). The dispatcher's exporter and the consumer's endpoint both serve through it.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, start_http_server


class MetricsPortUnavailable(OSError):
    """A ``/metrics`` port cannot be listened on; str() is one line naming it."""


@dataclass
class MetricsServer:
    """A running ``/metrics`` endpoint; :meth:`stop` ends it."""

    server: WSGIServer
    thread: threading.Thread
    host: str
    port: int

    @property
    def url(self) -> str:
        """The scrape URL."""
        return f"http://{self.host}:{self.port}/metrics"

    def stop(self) -> None:
        """Stop serving and wait for the server thread."""
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=10)


def serve_registry(registry: CollectorRegistry, host: str, port: int) -> MetricsServer:
    """Serve ``registry`` on ``http://host:port/metrics``; ``OSError`` if it cannot listen."""
    server, thread = start_http_server(port, addr=host, registry=registry)
    return MetricsServer(server, thread, host, port)
