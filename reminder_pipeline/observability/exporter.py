"""The metrics endpoint: the design's Prometheus metrics, computed from the database on each scrape.

``reminder-pipeline metrics`` (and ``reminder-pipeline up``) serve ``/metrics`` over HTTP. There
is no in-process state: counters and histograms are ``totals + SUM(detail)`` over the per-cycle
ledger (:mod:`.ledger`, written by every dispatch run), and the gauges are read live from the
reminder and outbox tables (backlog, poison rows, outbox lag). So every Dagster run (a
short-lived process) counts, parallel dispatchers add up, and an exporter restart loses nothing:
a counter only ever grows. Who holds back vacuum and what it costs the dispatcher are read from
PostgreSQL's own views (pg_stat_activity and its kin, the cumulative statistics of the due and
unpublished indexes and their tables): those counters are the server's, reset with its
statistics.

Each scrape is a handful of index-backed statements in one short read-only REPEATABLE READ
transaction (one snapshot: a ledger roll-up moving rows between the two tables cannot be seen
half-done, which would make a counter step back), bounded by a statement time-out. If the
database cannot be read, the scrape still answers, with ``calendar_reminder_dispatch_up 0``; and
it answers within :data:`SCRAPE_DEADLINE_SECONDS` (Prometheus gives up at 10 s) even when a
database goes silent: the reads run on threads of their own, each ended by its connection's
bounds (:mod:`reminder_pipeline.store.pg_client`).

The exporter heals by itself when its database restarts (a failover, a crash, a minor upgrade):
a failed scrape drops every pooled connection, so the next scrape connects afresh (the pool's
pre-ping would also catch a dead one), and the first scrape after the server answers serves the
figures again. An outage is logged twice, when it starts and when it ends, never per scrape, and
counted in ``calendar_reminder_dispatch_database_reconnects_total``. The scraper's interval is
the retry's pace: nothing is retried between scrapes.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from prometheus_client import CollectorRegistry
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from sqlalchemy.engine import Engine

from ..config import DEFAULT_METRICS_HOST, DOCS_DIR, Settings
from ..domain.lateness import LATENESS_BUCKETS
from ..logs import event
from ..store import metrics_repository, outbox_repository, repository
from . import forecast, ledger
from .metric_names import (
    BACKLOG_GAUGE,
    BACKLOG_OLDEST_AGE,
    CLOCK_SKEW,
    CLOCK_SKEWED_CYCLES,
    CYCLE_DURATION,
    CYCLES,
    DAEMON_HEARTBEAT_AGE,
    DISPATCH_METRIC_NAMES,
    ERRORS,
    FORECAST_CAPACITY,
    FORECAST_PEAK_DUE,
    FORECAST_PEAK_TIME,
    ITEMS,
    LAST_SUCCESS,
    LATENESS,
    OUTBOX_LAG_GAUGE,
    OUTBOX_UNPUBLISHED,
    POISON_OLDEST_AGE,
    POISON_ROWS_GAUGE,
    PUBLISHED,
    RECONNECTS,
    RELAY_LOCK_SILENT,
    SCRAPE_DURATION,
    SKIP_LOCKED,
    TIME_ZONE_FALLBACKS_COUNTER,
    UP,
)
from .metrics_http import MetricsPortUnavailable, MetricsServer, serve_registry
from .vacuum_figures import vacuum_families

log = logging.getLogger(__name__)


#: Reads Dagster's daemon heartbeats: the newest heartbeat's epoch seconds per daemon type
#: (``SCHEDULER``, ``SENSOR``, ...). The Dagster layer provides it (only defs/ imports Dagster).
DaemonHeartbeats = Callable[[], Mapping[str, float]]

SCRAPE_STATEMENT_TIMEOUT_MS = 5 * 1000
#: A scrape answers within this, whatever the databases do (Prometheus gives up at 10 s): what is
#: not read by then is left out (``up 0`` without the database, no heartbeat ages without
#: Dagster's). A read still waiting ends by its own bounds (store/engine.py, store/pg_client.py).
SCRAPE_DEADLINE_SECONDS = 7.0


@dataclass(frozen=True)
class Snapshot:
    """Everything one scrape reads, from one database snapshot."""

    totals: metrics_repository.LedgerTotals
    backlog: repository.Backlog
    outbox: outbox_repository.OutboxLag
    poison: metrics_repository.PoisonRows
    clock_skew: metrics_repository.ClockSkew
    #: The next 24 hours' busiest minute and one run's capacity (observability.forecast).
    forecast: forecast.Forecast
    #: The session holding the relay lock (None: nobody), docs/design.md "The relay's lock".
    relay_lock: metrics_repository.RelayLockHolder | None = None
    #: Who holds back vacuum, oldest first, and since when.
    horizon: metrics_repository.VacuumHorizon | None = None
    #: The due index's and the outbox's unpublished index's read statistics and sizes.
    index_reads: tuple[metrics_repository.IndexReads, ...] = ()
    #: Live and dead rows and the last vacuum of event_reminders and outbox.
    table_dead_rows: tuple[metrics_repository.TableDeadRows, ...] = ()


def read_snapshot(engine: Engine, now: datetime | None = None) -> Snapshot:
    """Ledger totals and live gauges in one short read-only REPEATABLE READ transaction.

    ``now`` defaults to the database's clock (the ledger's and the rows' one clock).
    """
    with (
        engine.connect().execution_options(
            isolation_level="REPEATABLE READ", postgresql_readonly=True
        ) as conn,
        conn.begin(),
    ):
        metrics_repository.set_local_timeouts(conn, SCRAPE_STATEMENT_TIMEOUT_MS, 1_000)
        now = now or repository.database_clock(conn)
        totals = metrics_repository.ledger_totals(
            conn, len(ledger.DURATION_BUCKETS) + 1, len(LATENESS_BUCKETS) + 1
        )
        return Snapshot(
            totals,
            repository.backlog(conn, now),
            outbox_repository.outbox_lag(conn),
            metrics_repository.poison_summary(conn, now),
            metrics_repository.clock_skew_since(
                conn, now - ledger.CLOCK_SKEW_WINDOW, ledger.CLOCK_SKEW_WARN_SECONDS
            ),
            forecast.read(conn),
            metrics_repository.relay_lock_holder(conn),
            metrics_repository.read_vacuum_horizon(conn, now),
            tuple(metrics_repository.index_reads(conn)),
            tuple(metrics_repository.table_dead_rows(conn)),
        )


def _histogram(
    name: str, doc: str, bounds: tuple[float, ...], counts: list[int], total: float
) -> HistogramMetricFamily:
    running = ledger.cumulative(counts)
    buckets = [(_le(b), float(c)) for b, c in zip(bounds, running, strict=False)]
    buckets.append(("+Inf", float(running[-1])))
    return HistogramMetricFamily(name, doc, buckets=buckets, sum_value=total)


def _le(bound: float) -> str:
    return repr(float(bound))


def families(snapshot: Snapshot) -> list[Metric]:
    """The metric families of one snapshot (pure: no I/O)."""
    t = snapshot.totals
    cycles = CounterMetricFamily(CYCLES, "Dispatch cycles recorded, by result.", labels=["result"])
    cycles.add_metric(["succeeded"], t.cycles - t.cycles_failed)
    cycles.add_metric(["failed"], t.cycles_failed)
    items = CounterMetricFamily(
        ITEMS, "Reminder rows moved out of Pending, by result.", labels=["result"]
    )
    items.add_metric(["sent"], t.sent)
    items.add_metric(["skipped"], t.skipped)
    errors = CounterMetricFamily(
        ERRORS,
        "Errors: failed cycles, poison rows left Pending, deliveries the broker refused.",
        labels=["kind"],
    )
    errors.add_metric(["cycle"], t.cycles_failed)
    errors.add_metric(["item"], t.failed)
    errors.add_metric(["publish"], t.publish_failed)
    out: list[Metric] = [
        _histogram(
            CYCLE_DURATION,
            "Duration of a dispatch cycle.",
            ledger.DURATION_BUCKETS,
            t.duration_buckets,
            t.duration_sum,
        ),
        cycles,
        items,
        CounterMetricFamily(
            SKIP_LOCKED,
            "Due rows skipped because another instance held their lock.",
            value=t.skipped_locked,
        ),
        errors,
        CounterMetricFamily(
            PUBLISHED, "Outbox messages acknowledged by the broker.", value=t.published
        ),
        _histogram(
            LATENESS,
            "SentAt - DueAt of sent reminders (SLO: p95 within 120 s).",
            LATENESS_BUCKETS,
            t.lateness_buckets,
            t.lateness_sum,
        ),
        GaugeMetricFamily(
            BACKLOG_GAUGE,
            "Pending reminders with DueAt < now, not yet processed.",
            value=snapshot.backlog.count,
        ),
        GaugeMetricFamily(
            BACKLOG_OLDEST_AGE,
            "Age of the oldest due Pending reminder (0 if none).",
            value=snapshot.backlog.oldest_due_age_seconds or 0.0,
        ),
        GaugeMetricFamily(
            OUTBOX_UNPUBLISHED,
            "Outbox messages not yet published.",
            value=snapshot.outbox.unpublished,
        ),
        GaugeMetricFamily(
            OUTBOX_LAG_GAUGE,
            "Age of the oldest unpublished outbox message (0 if none).",
            value=snapshot.outbox.oldest_unpublished_age_seconds or 0.0,
        ),
        GaugeMetricFamily(
            RELAY_LOCK_SILENT,
            "How long the session holding the relay lock has sent nothing (idle, or waiting on "
            "its client); 0 if nobody holds it or it works. A live relay is never silent for "
            "more than a few seconds.",
            value=0.0 if snapshot.relay_lock is None else snapshot.relay_lock.silent_seconds,
        ),
        # Live, not a counter: a poison row retried with a growing back-off adds to errors_total
        # only at each retry, while it stays held back the whole time (the errors alert's gauge).
        GaugeMetricFamily(
            POISON_ROWS_GAUGE,
            f"Due Pending reminders held back by repeated failures "
            f"(>= {metrics_repository.POISON_MIN_ATTEMPTS} failed attempts).",
            value=snapshot.poison.count,
        ),
        GaugeMetricFamily(
            POISON_OLDEST_AGE,
            "Age (now - DueAt) of the oldest poison row (0 if none).",
            value=snapshot.poison.oldest_due_age_seconds or 0.0,
        ),
        CounterMetricFamily(
            TIME_ZONE_FALLBACKS_COUNTER,
            "Reminders sent with TimeZone UTC: their event's zone is not a canonical IANA name.",
            value=t.time_zone_fallbacks,
        ),
    ]
    # Gauges over a recent window of the ledger: a host whose clock is off is seen, not trusted.
    minutes = ledger.CLOCK_SKEW_WINDOW.total_seconds() / 60
    out += [
        GaugeMetricFamily(
            CLOCK_SKEW,
            f"Largest difference between a dispatching host's clock and the database's over the "
            f"last {minutes:.0f} min (seconds, 0 if none).",
            value=snapshot.clock_skew.max_abs_seconds or 0.0,
        ),
        GaugeMetricFamily(
            CLOCK_SKEWED_CYCLES,
            f"Cycles in the last {minutes:.0f} min started by a host whose clock is more than "
            f"{ledger.CLOCK_SKEW_WARN_SECONDS:.0f} s off the database's.",
            value=snapshot.clock_skew.skewed_cycles,
        ),
    ]
    # The coming peak (the ``coming_peak`` check's figures): warn before it is due.
    ahead = snapshot.forecast
    peak_minute, peak_due = ahead.peak
    hours = ahead.hours
    out += [
        GaugeMetricFamily(
            FORECAST_PEAK_DUE,
            f"Pending reminders due in the busiest minute of the next {hours} h.",
            value=peak_due,
        ),
        GaugeMetricFamily(
            FORECAST_PEAK_TIME,
            f"Start of the busiest minute of the next {hours} h (0 if nothing is due).",
            value=0.0 if peak_minute is None else peak_minute.timestamp(),
        ),
        GaugeMetricFamily(
            FORECAST_CAPACITY,
            "Rows one dispatch run moves within its budget at the drain rate the ledger measured.",
            value=ahead.capacity_per_run,
        ),
    ]
    out += vacuum_families(snapshot.horizon, snapshot.index_reads, snapshot.table_dead_rows)
    # Absent until a cycle has ever succeeded: the liveness rule treats absence as "not live".
    if t.last_success_at is not None:
        out.append(
            GaugeMetricFamily(
                LAST_SUCCESS,
                "When the last successful cycle finished.",
                value=t.last_success_at.timestamp(),
            )
        )
    return out


class LedgerCollector(Collector):
    """A prometheus_client collector reading the ledger and the live tables on each scrape."""

    def __init__(self, engine: Engine, heartbeats: DaemonHeartbeats | None = None) -> None:
        self._engine = engine
        self._heartbeats = heartbeats
        self._healthy: bool | None = None
        self._heartbeats_read: bool | None = None
        self._reconnects = 0  # outages this process saw end (the first read is not one)
        self._lock = threading.Lock()  # scrapes may overlap: each change is logged once
        # The reads run here, so a scrape can answer while a silent database keeps one waiting;
        # one thread each: scrapes queued behind a waiting read answer at their deadline.
        self._reads = ThreadPoolExecutor(1, thread_name_prefix="metrics-read")
        self._beats = ThreadPoolExecutor(1, thread_name_prefix="metrics-heartbeats")

    def close(self) -> None:
        """Let the read threads go (a read still waiting ends by its own bounds)."""
        self._reads.shutdown(wait=False, cancel_futures=True)
        self._beats.shutdown(wait=False, cancel_futures=True)

    def describe(self) -> Iterator[Metric]:
        """The families' names, without touching the database (used at registration)."""
        yield from (
            Metric(name.removesuffix("_total"), "", "untyped") for name in DISPATCH_METRIC_NAMES
        )

    def collect(self) -> Iterator[Metric]:
        """One scrape: read a snapshot; on failure serve only ``up 0`` (and log the change once).

        Answers within :data:`SCRAPE_DEADLINE_SECONDS`: a read that has not answered by then
        counts as a failure.
        """
        started = time.monotonic()
        deadline = started + SCRAPE_DEADLINE_SECONDS
        reading = self._reads.submit(read_snapshot, self._engine)
        beats = self._beats.submit(self._heartbeats) if self._heartbeats is not None else None
        try:
            snapshot = reading.result(timeout=SCRAPE_DEADLINE_SECONDS)
        except Exception as exc:  # noqa: BLE001 - a scrape answers even when the DB does not
            # Connections to a server that went away are dead: the next scrape connects afresh.
            self._engine.dispose()
            silent = isinstance(exc, TimeoutError)
            self._transition(False, "NoAnswerInTime" if silent else type(exc).__name__)
            yield GaugeMetricFamily(UP, "1 if the last scrape read the database.", value=0)
            yield self._reconnects_family()
            return
        self._transition(True, None)
        yield GaugeMetricFamily(UP, "1 if the last scrape read the database.", value=1)
        yield self._reconnects_family()
        yield from families(snapshot)
        if beats is not None:
            yield from self._daemon_heartbeats(beats, deadline)
        yield GaugeMetricFamily(
            SCRAPE_DURATION,
            "Time this scrape spent reading the database.",
            value=time.monotonic() - started,
        )

    def _daemon_heartbeats(
        self, reading: Future[Mapping[str, float]], deadline: float
    ) -> Iterator[Metric]:
        """The age of each Dagster daemon's newest heartbeat; absent when they cannot be read
        by the scrape's deadline."""
        try:
            beats = reading.result(timeout=max(deadline - time.monotonic(), 0.0))
        except Exception as exc:  # noqa: BLE001 - the dispatcher's metrics are served regardless
            if self._heartbeats_read is not False:
                event(
                    log,
                    logging.WARNING,
                    "metrics scrape cannot read Dagster's daemon heartbeats",
                    error_kind=type(exc).__name__,
                )
            self._heartbeats_read = False
            return
        self._heartbeats_read = True
        ages = GaugeMetricFamily(
            DAEMON_HEARTBEAT_AGE,
            "Seconds since each Dagster daemon's newest heartbeat (the scheduler's going stale "
            "means the daemon is down: no schedule ticks, no dispatch runs).",
            labels=["daemon"],
        )
        now = time.time()
        for daemon, beat in sorted(beats.items()):
            ages.add_metric([daemon], max(now - beat, 0.0))
        yield ages

    def _reconnects_family(self) -> Metric:
        return CounterMetricFamily(
            RECONNECTS,
            "Times this exporter read the database again after failing to (an outage it "
            "recovered from; kept in the exporter's memory, so it restarts at 0 with it).",
            value=self._reconnects,
        )

    def _transition(self, healthy: bool, error_kind: str | None) -> None:
        # Log changes only: Prometheus scrapes every 15 s, a log line each time would drown others.
        with self._lock:
            if healthy == self._healthy:
                return
            recovered = healthy and self._healthy is False
            self._healthy = healthy
            self._reconnects += recovered
        if healthy:
            event(log, logging.INFO, "metrics scrape reads the database", recovered=recovered)
        else:
            event(
                log,
                logging.WARNING,
                "metrics scrape cannot read the database (migrated? reachable?)",
                error_kind=error_kind,
            )


class MetricsExporter:
    """A running ``/metrics`` HTTP endpoint; :meth:`stop` shuts it down."""

    def __init__(
        self,
        server: MetricsServer,
        engine: Engine,
        collector: LedgerCollector,
        *,
        owns_engine: bool,
    ) -> None:
        self._server = server
        self._engine = engine
        self._collector = collector
        self._owns_engine = owns_engine
        self.host = server.host
        self.port = server.port

    @property
    def url(self) -> str:
        """The scrape URL."""
        return self._server.url

    def stop(self) -> None:
        """Stop serving, wait for the server thread, release the database connections."""
        self._server.stop()
        self._collector.close()
        if self._owns_engine:
            self._engine.dispose()
        event(log, logging.INFO, "metrics exporter stopped", port=self.port)


class DatabaseAddress(Protocol):
    """Where the app database is: all the exporter needs of the local stack's ``Endpoints`` (or
    of any object with the URL)."""

    @property
    def database_url(self) -> str:
        """The app database's SQLAlchemy URL."""


def start_exporter(
    settings: Settings,
    endpoints: DatabaseAddress,
    *,
    host: str | None = None,
    port: int | None = None,
    engine: Engine | None = None,
    heartbeats: DaemonHeartbeats | None = None,
) -> MetricsExporter:
    """Serve ``/metrics`` in a background thread on ``host:port`` and return the running exporter.

    Defaults: ``REMINDER_METRICS_HOST`` (else 127.0.0.1; a container sets 0.0.0.0) and
    ``settings.metrics_port`` (``REMINDER_METRICS_PORT``, 9464). A port in use is a one-line
    :class:`ServiceError`. ``heartbeats`` adds the age of Dagster's daemon heartbeats.
    """
    from ..store.engine import make_engine

    host = host or settings.env.get("REMINDER_METRICS_HOST") or DEFAULT_METRICS_HOST
    port = settings.metrics_port if port is None else port
    owns_engine = engine is None
    engine = engine or make_engine(
        endpoints.database_url,
        pool_size=2,
        application_name="reminder-pipeline-exporter",
        statement_timeout_ms=SCRAPE_STATEMENT_TIMEOUT_MS,
    )
    registry = CollectorRegistry(auto_describe=False)
    collector = LedgerCollector(engine, heartbeats)
    registry.register(collector)
    try:
        # The checkout's docs under /docs/ too: the runbook links `up` gives the Dagster UI.
        server = serve_registry(
            registry, host, port, docs_dir=DOCS_DIR if DOCS_DIR.is_dir() else None
        )
    except OSError as exc:
        collector.close()
        if owns_engine:
            engine.dispose()
        raise MetricsPortUnavailable(
            f"metrics exporter cannot listen on {host}:{port} (REMINDER_METRICS_PORT): {exc}"
        ) from None
    event(log, logging.INFO, "metrics exporter listening", host=host, port=port)
    return MetricsExporter(server, engine, collector, owns_engine=owns_engine)
