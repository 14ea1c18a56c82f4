"""A ``/metrics`` HTTP endpoint in a background thread that can be stopped.

prometheus_client's :func:`~prometheus_client.start_http_server` starts the server; this keeps
its handles so a caller can stop it cleanly (``up`` and the tests start and stop endpoints in one
process). The dispatcher's exporter and the consumer's endpoint both serve through it.

Given a docs directory, the same server also serves its files under ``/docs/`` as plain text, so
the runbook links in the Dagster UI (``REMINDER_DOCS_BASE_URL``) are links a browser opens on a
local stack (``up`` points them here): a ``file:`` link from a web page is not followed.
"""

from __future__ import annotations

import mimetypes
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote
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


#: Where the docs are served, under the server's root.
DOCS_PATH = "/docs/"

_App = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


def _doc_file(docs_dir: Path, path_info: str) -> Path | None:
    """The file under ``docs_dir`` that ``path_info`` (``/docs/...``) names, None if none."""
    relative = unquote(path_info[len(DOCS_PATH) :])
    root = docs_dir.resolve()
    wanted = (root / relative).resolve()
    if not wanted.is_relative_to(root) or not wanted.is_file():
        return None  # outside the docs (``..``) or not there
    return wanted


def with_docs(app: _App, docs_dir: Path) -> _App:
    """``app``, but ``GET /docs/<path>`` answered with that file of ``docs_dir`` (Markdown as
    plain text a browser shows, not downloads); 404 for anything else under ``/docs/``."""

    def serve(request: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        # ``request``: the WSGI environ of one request (not the process's environment).
        path_info = request.get("PATH_INFO") or "/"
        if not path_info.startswith(DOCS_PATH):
            return app(request, start_response)
        found = _doc_file(docs_dir, path_info)
        if found is None or request.get("REQUEST_METHOD", "GET") not in ("GET", "HEAD"):
            start_response("404 Not Found", [("Content-Type", "text/plain; charset=utf-8")])
            return [b"not found\n"]
        kind = mimetypes.guess_type(found.name)[0] or "application/octet-stream"
        if kind.startswith("text/") or found.suffix == ".md":
            kind = "text/plain; charset=utf-8"
        body = found.read_bytes()
        start_response("200 OK", [("Content-Type", kind), ("Content-Length", str(len(body)))])
        return [body]

    return serve


def serve_registry(
    registry: CollectorRegistry, host: str, port: int, *, docs_dir: Path | None = None
) -> MetricsServer:
    """Serve ``registry`` on ``http://host:port/metrics`` (and ``docs_dir`` under ``/docs/``
    when given); ``OSError`` if it cannot listen."""
    server, thread = start_http_server(port, addr=host, registry=registry)
    metrics_app = server.get_app()
    if docs_dir is not None and metrics_app is not None:
        server.set_app(with_docs(metrics_app, docs_dir))
    return MetricsServer(server, thread, host, port)
