"""The write side of the dispatch metrics: one ledger row per cycle, in Postgres.

Why a ledger table, not in-process counters or a Pushgateway:

* Each Dagster run is a short-lived process. In-process ``prometheus_client`` counters die with
  it; nothing would be left to scrape.
* A Pushgateway keeps only the *last* push per grouping key: per-run counters overwrite each
  other (or, grouped per run, pile up for ever), it cannot sum increments, and a gateway restart
  without persistence loses every counter. Histograms pushed per run are equally awkward.
* The database is already the dispatcher's source of truth and is shared by every parallel
  dispatcher (SKIP LOCKED). A row per cycle written there is durable, needs no new moving part,
  and survives restarts of the run processes and of the exporter. The exporter turns
  ``totals + SUM(detail)`` into counters and histograms on each scrape, so they are monotonic
  across everything but a database restore.

The write is its own short transaction *after* the cycle, never inside the dispatch
transaction (a row lock on the ledger must not extend the reminder row locks), with tight
statement/lock time-outs; if it fails it is logged and the cycle is not failed. Its times
(``started_at``, ``finished_at``) are the database's, stamped by the statement that writes the
row: this host's clock only measures the cycle's duration (docs/design.md, "One clock").
Histograms are stored as per-bucket counts with fixed bounds (here, and the lateness ones in
``domain/lateness.py``; changing them needs the totals reset).

Retention: detail rows older than :data:`DETAIL_RETENTION` by the database's clock are rolled
up into the single totals row by the writer itself (bounded per call, one roller at a time), so
a scrape reads at most a day of rows (~1,440 per dispatcher) whatever the age of the system.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from datetime import datetime, timedelta

from sqlalchemy.engine import Engine

from ..domain.lateness import LATENESS_BUCKETS, bucket_counts
from ..domain.model import LEDGER_COUNTERS, CycleCounts
from ..logs import event
from ..store import metrics_repository
from ..store.metrics_repository import CycleRecord

log = logging.getLogger(__name__)

#: Upper bounds (seconds) of the cycle duration histogram: the design's target is < 30 s a cycle.
DURATION_BUCKETS: tuple[float, ...] = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 15, 30, 60, 120)

#: A dispatching host whose clock differs from the database's by more than this (seconds) is
#: logged, counted in the ledger and fails the ``clock_skew`` warning check; its clock is never
#: used for what is due or for what a cycle writes (the database's is).
CLOCK_SKEW_WARN_SECONDS = 5.0
#: The window of the clock skew gauge and check.
CLOCK_SKEW_WINDOW = timedelta(minutes=15)

#: How long per-cycle rows stay in ``dispatch_cycles`` before being rolled up into the totals.
DETAIL_RETENTION = timedelta(days=1)
#: Time-outs of the ledger write: it is a side channel and must never hold up a cycle.
WRITE_STATEMENT_TIMEOUT_MS = 5 * 1000
WRITE_LOCK_TIMEOUT_MS = 2 * 1000


def cumulative(counts: Sequence[int]) -> list[int]:
    """Running totals of per-bucket counts (what Prometheus calls the bucket values)."""
    total, out = 0, []
    for count in counts:
        total += count
        out.append(total)
    return out


def quantile(q: float, counts: Sequence[int], bounds: Sequence[float]) -> float | None:
    """The ``q`` quantile of a bucketed histogram, interpolated like PromQL's histogram_quantile.

    None when the histogram is empty; the highest finite bound when the rank falls in +Inf.
    """
    total = sum(counts)
    if total == 0:
        return None
    rank = q * total
    running = 0
    for i, count in enumerate(counts):
        if running + count >= rank and count > 0:
            if i == len(bounds):
                return float(bounds[-1])
            lower = 0.0 if i == 0 else float(bounds[i - 1])
            upper = float(bounds[i])
            return lower + (upper - lower) * (rank - running) / count
        running += count
    return float(bounds[-1])


def _kind(error: BaseException | str | None) -> str | None:
    if error is None:
        return None
    return error if isinstance(error, str) else type(error).__name__


def build_record(
    run_id: str,
    counts: CycleCounts | None,
    *,
    duration_seconds: float | None = None,
    as_of: datetime | None = None,
    error: BaseException | str | None = None,
    clock_skew_seconds: float | None = None,
) -> CycleRecord:
    """The ledger row for one cycle (pure; ``error`` set means the cycle failed).

    It holds no moment of this host's: the database stamps ``finished_at`` (and ``started_at``,
    that less the duration) in the statement that writes the row.
    """
    counts = counts or CycleCounts()
    # A caller that did not time the cycle itself (a failed run) passes its own measurement.
    duration = counts.duration_ms / 1000 if counts.duration_ms else (duration_seconds or 0.0)
    duration = max(duration, 0.0) if math.isfinite(duration) else 0.0
    lateness = counts.lateness
    return CycleRecord(
        run_id=run_id,
        as_of=as_of,
        succeeded=error is None,
        **{name: getattr(counts, name) for name in LEDGER_COUNTERS},
        duration_seconds=duration,
        duration_buckets=bucket_counts([duration], DURATION_BUCKETS),
        lateness_sum=lateness.total,
        lateness_count=lateness.count,
        lateness_buckets=list(lateness.buckets),
        error_kind=_kind(error),
        clock_skew_seconds=clock_skew_seconds,
    )


def record_cycle(
    engine: Engine,
    run_id: str,
    counts: CycleCounts | None,
    *,
    duration_seconds: float | None = None,
    as_of: datetime | None = None,
    error: BaseException | str | None = None,
    clock_skew_seconds: float | None = None,
) -> bool:
    """Write one cycle to the ledger in its own transaction; never raises. True when written.

    Call it once per cycle, after the dispatch transaction committed (or failed): from
    ``run_cycle`` and from the Dagster op that ends a run. The row's times are the database's
    (docs/design.md, "One clock"); this host's clock only measured the duration:
    ``counts.duration_ms`` when set, otherwise ``duration_seconds``. An ``error`` (exception or
    its class name) marks the cycle failed and counts in
    ``calendar_reminder_dispatch_errors_total{kind="cycle"}``; only the class name is kept.
    """
    try:
        record = build_record(
            run_id,
            counts,
            duration_seconds=duration_seconds,
            as_of=as_of,
            error=error,
            clock_skew_seconds=clock_skew_seconds,
        )
        with engine.begin() as conn:
            metrics_repository.set_local_timeouts(
                conn, WRITE_STATEMENT_TIMEOUT_MS, WRITE_LOCK_TIMEOUT_MS
            )
            metrics_repository.insert_cycle(conn, record)
    except Exception as exc:  # noqa: BLE001 - metrics must never fail the cycle they describe
        event(
            log,
            logging.WARNING,
            "cycle not recorded in the metrics ledger",
            run_id=run_id,
            error_kind=type(exc).__name__,
        )
        return False
    roll_up(engine)
    return True


def roll_up(engine: Engine, *, retention: timedelta = DETAIL_RETENTION) -> int:
    """Fold ledger rows finished over ``retention`` ago, by the database's clock; never raises.

    The cutoff is the database's clock, read in the statement, never a host's: a host whose
    clock runs ahead cannot fold rows newer than the window (nor a slow one keep old rows).
    """
    seconds = max(retention.total_seconds(), 0.0)
    try:
        with engine.begin() as conn:
            metrics_repository.set_local_timeouts(
                conn, WRITE_STATEMENT_TIMEOUT_MS, WRITE_LOCK_TIMEOUT_MS
            )
            moved = metrics_repository.roll_up_detail(
                conn, seconds, len(DURATION_BUCKETS) + 1, len(LATENESS_BUCKETS) + 1
            )
    except Exception as exc:  # noqa: BLE001 - retried by the next cycle's write
        event(log, logging.WARNING, "metrics ledger roll-up failed", error_kind=type(exc).__name__)
        return 0
    if moved:
        event(log, logging.INFO, "metrics ledger rolled up", rows=moved, retention_seconds=seconds)
    return moved
