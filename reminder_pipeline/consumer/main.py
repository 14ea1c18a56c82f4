"""The consumer's main: settings in, a run until stopped, typed errors out.

:func:`run_consumer` is what ``reminder-pipeline consume`` runs. It decides no exit code and
prints nothing but notifications: a bad option raises ``ConfigError``, a metrics port that cannot
be listened on ``MetricsPortUnavailable``, and the broker, the de-duplication store and the
network raise their own errors (``BrokerUnavailable``, ``DedupStoreError``, ``sqlite3.Error``,
``OSError``, ``KafkaException``); the command line turns each into its code and one line on
stderr (``cli/consume.py``, ``cli/exits.py``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

from .. import logs
from ..config import DEFAULT_METRICS_HOST, ConfigError, Settings
from ..logs import event
from ..messaging.kafka import ensure_topic
from ..observability.metrics_http import MetricsServer
from .dedup import PostgresDedupStore, SqliteDedupStore
from .metrics import ConsumerMetrics, serve_metrics
from .options import DEFAULT_GROUP_ID, ConsumerOptions, ConsumeStats
from .runner import ReminderConsumer
from .sinks import NotificationSink, StdoutSink
from .texts import Locale

log = logging.getLogger(__name__)


@contextlib.contextmanager
def stop_on_signals(stop: threading.Event) -> Iterator[None]:
    """Set ``stop`` on SIGINT/SIGTERM while inside (main thread only; elsewhere a no-op)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    signals = (signal.SIGINT, signal.SIGTERM)
    previous = {sig: signal.getsignal(sig) for sig in signals}

    def request_stop(signum: int, _frame: object) -> None:
        event(log, logging.INFO, "stop requested", signal=signal.Signals(signum).name)
        stop.set()

    for sig in signals:
        signal.signal(sig, request_stop)
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def default_dedup_path(settings: Settings, group_id: str) -> Path:
    """Where the consumer remembers handled reminders: one file per consumer group."""
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in group_id)
    return settings.home / "notifications" / f"{safe}.dedup.sqlite3"


def sqlite_store_path(
    settings: Settings, group_id: str, dedup_path: Path | None, dedup_url: str | None
) -> Path | None:
    """The SQLite store ``consume`` keeps with these options (``dedup_path``, else its group's
    file under the home), or None when it keeps a shared PostgreSQL store (``dedup_url``): the
    one rule, for the consumer and for a trace that looks for its store."""
    if dedup_url is not None:
        return None
    return dedup_path or default_dedup_path(settings, group_id)


def run_consumer(
    settings: Settings,
    *,
    group_id: str = DEFAULT_GROUP_ID,
    dedup_path: Path | None = None,
    dedup_url: str | None = None,
    once: bool = False,
    bootstrap_servers: str | None = None,
    sink: NotificationSink | None = None,
    stop: threading.Event | None = None,
    options: ConsumerOptions | None = None,
    metrics_port: int | None = None,
    locale: str = Locale.EN.value,
) -> ConsumeStats:
    """Print reminders as they arrive until stopped (or, ``once``, until the topic is quiet).

    ``bootstrap_servers`` names the embedded broker when ``settings`` do not (the CLI knows it).
    ``once`` stops after the topic has been quiet for ``options.once_idle_seconds``. ``options``
    overrides everything but ``group_id`` and ``locale`` (tests: topic names, fast group joins).
    ``dedup_url`` keeps delivered ReminderIds in PostgreSQL, shared by consumers on any number of
    hosts, instead of the SQLite file ``dedup_path`` (one host; both is a ConfigError).
    ``metrics_port`` serves the consumer's Prometheus metrics on ``REMINDER_METRICS_HOST``
    (default 127.0.0.1) at that port. Returns what the run did; raises what stopped it.
    """
    logs.configure()
    stop = stop or threading.Event()
    server: MetricsServer | None = None
    try:
        if dedup_url is not None and dedup_path is not None:
            raise ConfigError("give --dedup-url or --dedup-path, not both")
        if metrics_port is not None and not 1 <= metrics_port <= 65535:
            raise ConfigError(f"--metrics-port {metrics_port} is not a port (1..65535)")
        try:
            options = dataclasses.replace(
                options or ConsumerOptions(), group_id=group_id, locale=locale
            )
        except ValueError as exc:
            raise ConfigError(f"--locale: {exc}") from None
        kafka = settings.kafka(bootstrap_servers)
        metrics = ConsumerMetrics()
        if metrics_port is not None:
            host = settings.env.get("REMINDER_METRICS_HOST") or DEFAULT_METRICS_HOST
            server = serve_metrics(metrics, host, metrics_port)
        # The DLQ is ours to create with the contract's partition count (auto-creation would
        # pick the broker's default); the source topic too, so starting before the
        # dispatcher's first publish subscribes to a topic with the right partitions. Where
        # ACLs allow this consumer no CREATE (docker/compose.yaml), both exist already and
        # DESCRIBE is enough.
        ensure_topic(kafka, topic=options.topic)
        ensure_topic(kafka, topic=options.dlq_topic)
        sqlite_path = sqlite_store_path(settings, group_id, dedup_path, dedup_url)
        store: PostgresDedupStore | SqliteDedupStore = (
            SqliteDedupStore(sqlite_path)
            if sqlite_path is not None
            else PostgresDedupStore(str(dedup_url))
        )
        with store as dedup, stop_on_signals(stop):
            consumer = ReminderConsumer(kafka, sink or StdoutSink(), dedup, options, metrics)
            return consumer.run(stop=stop, idle_timeout=options.once_idle_seconds if once else None)
    finally:
        if server is not None:
            server.stop()
