"""Dagster's daemon heartbeats for the metrics exporter: the one place that reads them.

The daemon writes a heartbeat per daemon type (``SCHEDULER``, ``SENSOR``, ``QUEUED_RUN_COORDINATOR``
…) into the instance's storage every few seconds; ``instance.get_daemon_heartbeats()`` (public
instance API) returns the newest of each. The exporter (``observability/exporter.py``) turns them
into ``calendar_reminder_dispatch_daemon_heartbeat_age_seconds{daemon}``: a stale scheduler
heartbeat means the daemon is down, the cause behind a quiet dispatcher.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from concurrent.futures import Future

from dagster import DagsterInstance

#: How long a scrape waits for Dagster's storage (Prometheus gives the whole scrape 10 s). A
#: storage that does not answer (dagster-postgres retries a refused connection for about 12 s)
#: costs the scrape this series, not every metric.
READ_WAIT_SECONDS = 3.0


def daemon_heartbeats(instance: DagsterInstance) -> dict[str, float]:
    """The newest heartbeat's epoch seconds per daemon type."""
    return {daemon: beat.timestamp for daemon, beat in instance.get_daemon_heartbeats().items()}


def instance_heartbeats(
    instance: DagsterInstance | None = None, *, wait_seconds: float = READ_WAIT_SECONDS
) -> Callable[[], dict[str, float]]:
    """A reader of ``instance``'s heartbeats (default: ``DAGSTER_HOME``'s, opened in the
    background from now on, so a storage that is down fails a read, not the exporter's start; a
    failed open is tried again on the next read, so an exporter started before Dagster created
    its tables serves the heartbeats from the first read after).

    Each read runs in a thread of its own and is awaited ``wait_seconds`` at most (then
    ``TimeoutError``); while it runs, later reads await the same one rather than start another.
    """
    opened: list[DagsterInstance] = [] if instance is None else [instance]
    opening = threading.Lock()
    lock = threading.Lock()
    pending: list[Future[dict[str, float]]] = []

    def open_instance() -> DagsterInstance:
        with opening:  # the first read waits for the opening begun at the start
            if not opened:
                opened.append(DagsterInstance.get())
            return opened[0]

    def open_early() -> None:
        # A storage not ready yet is not reported here: the first read tries again and says so.
        with contextlib.suppress(Exception):
            open_instance()

    def fetch(future: Future[dict[str, float]]) -> None:
        try:
            future.set_result(daemon_heartbeats(open_instance()))
        except Exception as exc:  # noqa: BLE001 - handed to the reader, which raises it
            future.set_exception(exc)

    def read() -> dict[str, float]:
        with lock:  # scrapes may overlap
            if not pending or pending[0].done():
                future: Future[dict[str, float]] = Future()
                future.set_running_or_notify_cancel()
                pending[:] = [future]
                threading.Thread(
                    target=fetch, args=(future,), name="dagster-heartbeats", daemon=True
                ).start()
            current = pending[0]
        return current.result(timeout=wait_seconds)  # TimeoutError when it takes longer

    if not opened:
        # Opening the instance (its storages, their table checks) takes a while: not in a read.
        threading.Thread(target=open_early, name="dagster-instance", daemon=True).start()
    return read
