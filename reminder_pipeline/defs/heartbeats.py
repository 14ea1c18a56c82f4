"""Dagster's daemon heartbeats for the metrics exporter: the one place that reads them.

The daemon writes a heartbeat per daemon type (``SCHEDULER``, ``SENSOR``, ``QUEUED_RUN_COORDINATOR``
…) into the instance's storage every few seconds; ``instance.get_daemon_heartbeats()`` (public
instance API) returns the newest of each. The exporter (``observability/exporter.py``) turns them
into ``calendar_reminder_dispatch_daemon_heartbeat_age_seconds{daemon}``: a stale scheduler
heartbeat means the daemon is down, the cause behind a quiet dispatcher.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from dagster import DagsterInstance


def daemon_heartbeats(instance: DagsterInstance) -> dict[str, float]:
    """The newest heartbeat's epoch seconds per daemon type."""
    return {daemon: beat.timestamp for daemon, beat in instance.get_daemon_heartbeats().items()}


def instance_heartbeats(instance: DagsterInstance | None = None) -> Callable[[], dict[str, float]]:
    """A reader of ``instance``'s heartbeats (default: ``DAGSTER_HOME``'s, opened on first use,
    so a storage that is down fails a scrape, not the exporter's start)."""
    opened: list[DagsterInstance] = [] if instance is None else [instance]
    lock = threading.Lock()

    def read() -> dict[str, float]:
        with lock:  # scrapes may overlap; open the instance once
            if not opened:
                opened.append(DagsterInstance.get())
        return daemon_heartbeats(opened[0])

    return read
