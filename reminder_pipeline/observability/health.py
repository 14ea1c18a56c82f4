"""The design's alert conditions as plain functions over the database: the Dagster asset checks.

Each check reads the live tables or the metrics ledger (never a process's memory), so it gives
the same answer whichever process evaluates it, and it can be evaluated when no dispatch run
happens at all, which is what liveness means. The Prometheus rules in
``docker/prometheus/rules/reminder-dispatch.rules.yml`` encode the same thresholds.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta

from sqlalchemy.engine import Engine

from ..domain.lateness import LATENESS_BUCKETS
from ..messaging.relay_lock import RELAY_KEEPALIVE_SECONDS
from ..store import metrics_repository, outbox_repository, repository
from ..store.metrics_repository import POISON_MIN_ATTEMPTS
from . import forecast, ledger, vacuum_figures

RUNBOOK_DISPATCH = "docs/runbooks/reminder-dispatch.md"
RUNBOOK_OUTBOX = "docs/runbooks/outbox-backlog.md"
# The sections of the dispatch runbook, one per condition (the alert annotations link the same).
RUNBOOK_LIVENESS = RUNBOOK_DISPATCH + "#liveness-no-successful-cycle"
RUNBOOK_OVERDUE = RUNBOOK_DISPATCH + "#overdue-pending-reminders"
RUNBOOK_ERRORS = RUNBOOK_DISPATCH + "#errors-sustained"
RUNBOOK_LATENESS = RUNBOOK_DISPATCH + "#lateness-slo-burn"
RUNBOOK_CLOCK_SKEW = RUNBOOK_DISPATCH + "#clock-skew"
RUNBOOK_COMING_PEAK = RUNBOOK_DISPATCH + "#coming-peak-over-one-runs-capacity"
RUNBOOK_STUCK_RELAY = RUNBOOK_OUTBOX + "#stuck-relay"
RUNBOOK_VACUUM = RUNBOOK_DISPATCH + "#an-old-snapshot-holds-back-vacuum"

#: No successful cycle for longer than this: the dispatcher is not running (design: > 5 min).
LIVENESS_SECONDS = 300.0
#: A Pending row due longer ago than this: the worker lags or hangs (design: older than 5 min).
OVERDUE_SECONDS = 300.0
#: Errors are sustained when they have gone on this long with no gap of ERRORS_GAP or more:
#: what the alert's ``rate(calendar_reminder_dispatch_errors_total[5m]) > 0`` for ``10m`` sees.
ERRORS_WINDOW = timedelta(minutes=10)
ERRORS_GAP = timedelta(minutes=5)
#: The oldest unpublished outbox row may be this old before the backlog check fails.
OUTBOX_LAG_SECONDS = 120.0
#: A relay lock holder that has sent nothing for this long is silent, and named in the liveness
#: check too: a live relay runs a statement on its lock session every RELAY_KEEPALIVE_SECONDS.
RELAY_SILENT_SECONDS = 2 * RELAY_KEEPALIVE_SECONDS
#: Silent this long while rows wait, the holder holds up publishing and the outbox check fails at
#: once. The server ends a silent relay's session sooner (RELAY_IDLE_SESSION_SECONDS): a holder
#: past this is one that bound does not reach (an older relay, a session stuck writing to a peer
#: that does not read), and nobody else publishes meanwhile.
RELAY_STUCK_SECONDS = 30.0
#: The design's delivery SLO: SentAt - DueAt at p95 within 2 minutes, over this window.
LATENESS_SLO_SECONDS = 120.0
LATENESS_WINDOW = timedelta(minutes=15)
#: A snapshot held longer than this holds back vacuum long enough to cost the dispatcher: every
#: reminder dispatched (and message published) since keeps a dead index entry that a scan from
#: the oldest end reads (the figures measured: docs/runbooks/reminder-dispatch.md, "An old
#: snapshot holds back vacuum"). Reports and pg_dump of the shared database run that long;
#: batches, scrapes and the calendar's own requests never do. The vacuum_horizon check warns
#: past it.
SNAPSHOT_OLD_SECONDS = 15 * 60.0
#: The dispatcher slows when its cycles' median duration over the last SLOWING_WINDOW is above
#: SLOWING_FACTOR times their median over SLOWING_BASELINE (the ledger's duration histogram, as
#: the alert compares the two rates): with an old snapshot, the check's error.
SLOWING_WINDOW = timedelta(minutes=10)
SLOWING_BASELINE = timedelta(hours=6)
SLOWING_FACTOR = 2.0

Metadata = dict[str, float | int | str | None]


@dataclass(frozen=True)
class HealthCheck:
    """One evaluated condition: its name, verdict, a one-line description and its figures."""

    name: str
    passed: bool
    description: str
    metadata: Metadata = field(default_factory=dict)
    #: "ERROR" pages someone; "WARN" is shown but does not (maps to Dagster's AssetCheckSeverity).
    severity: str = "ERROR"
    #: Repository path of the runbook section for someone on call (also in ``metadata``).
    runbook_url: str = RUNBOOK_DISPATCH


def _round(value: float | None, digits: int = 1) -> float | None:
    return None if value is None else round(value, digits)


def _holder_metadata(holder: metrics_repository.RelayLockHolder | None) -> Metadata:
    """Who holds the relay lock, as both checks' metadata show it (None: nobody)."""
    return {
        "relay_lock_holder": None if holder is None else holder.describe(),
        "relay_lock_holder_pid": None if holder is None else holder.pid,
        "relay_lock_holder_silent_seconds": None
        if holder is None
        else _round(holder.silent_seconds),
    }


def _silent(holder: metrics_repository.RelayLockHolder | None, seconds: float) -> bool:
    return holder is not None and holder.silent_seconds >= seconds


def liveness(engine: Engine, now: datetime) -> HealthCheck:
    """A cycle succeeded in the last 5 minutes (from the ledger)."""
    with engine.connect() as conn:
        last = metrics_repository.last_success_at(conn)
        holder = metrics_repository.relay_lock_holder(conn)
    age = None if last is None else max((now - last).total_seconds(), 0.0)
    passed = age is not None and age <= LIVENESS_SECONDS
    if last is None:
        description = "No dispatch cycle has ever succeeded."
    else:
        description = f"Last successful cycle {age:.0f} s ago (limit {LIVENESS_SECONDS:.0f} s)."
    if holder is not None and _silent(holder, RELAY_SILENT_SECONDS):
        description += f" Relay lock held by a silent session: {holder.describe()}."
    return HealthCheck(
        name="dispatch_liveness",
        passed=passed,
        description=description,
        metadata={
            "seconds_since_last_success": _round(age),
            "last_success_at": None if last is None else last.isoformat(),
            "threshold_seconds": LIVENESS_SECONDS,
            **_holder_metadata(holder),
            "runbook_url": RUNBOOK_LIVENESS,
        },
        runbook_url=RUNBOOK_LIVENESS,
    )


def overdue(engine: Engine, now: datetime) -> HealthCheck:
    """No Pending row is due longer ago than 5 minutes."""
    with engine.connect() as conn:
        late = metrics_repository.count_overdue(conn, now - timedelta(seconds=OVERDUE_SECONDS), now)
        backlog = repository.backlog(conn, now)
    passed = late.count == 0
    description = (
        "No Pending reminder is overdue by more than 5 minutes."
        if passed
        else f"{late.count} Pending reminder(s) due more than {OVERDUE_SECONDS:.0f} s ago; "
        f"oldest {late.oldest_due_age_seconds or 0:.0f} s."
    )
    return HealthCheck(
        name="no_overdue_reminders",
        passed=passed,
        description=description,
        metadata={
            "overdue_count": late.count,
            "oldest_due_age_seconds": _round(late.oldest_due_age_seconds),
            "backlog": backlog.count,
            "threshold_seconds": OVERDUE_SECONDS,
            "runbook_url": RUNBOOK_OVERDUE,
        },
        runbook_url=RUNBOOK_OVERDUE,
    )


def errors_sustained_since(error_times: list[datetime], now: datetime) -> datetime | None:
    """Start of the run of errors that reaches ``now`` with no gap of ERRORS_GAP, or None.

    ``error_times`` are the finish times of cycles with errors, newest first. A 5-minute rate of
    the errors counter is above zero at ``now`` when an error finished less than 5 minutes ago,
    and stayed above zero since the start returned here.
    """
    if not error_times or now - error_times[0] >= ERRORS_GAP:
        return None
    start = error_times[0]
    for finished in error_times[1:]:
        if start - finished >= ERRORS_GAP:
            break
        start = finished
    return start


def errors(engine: Engine, now: datetime) -> HealthCheck:
    """No row is held back by repeated failures, and errors are not sustained over 10 minutes."""
    lookback = now - ERRORS_WINDOW - ERRORS_GAP  # far enough to tell "10 minutes or more"
    with engine.connect() as conn:
        poison = metrics_repository.poison_summary(conn, now)
        window = metrics_repository.cycles_since(conn, now - ERRORS_WINDOW)
        since = errors_sustained_since(
            metrics_repository.error_cycle_times_since(conn, lookback), now
        )
    sustained = None if since is None else max((now - since).total_seconds(), 0.0)
    sustained_long = sustained is not None and sustained >= ERRORS_WINDOW.total_seconds()
    passed = poison.count == 0 and not sustained_long
    minutes = ERRORS_WINDOW.total_seconds() / 60
    if poison.count:
        description = (
            f"{poison.count} due reminder(s) held back by repeated failures "
            f"(>= {POISON_MIN_ATTEMPTS} attempts); oldest "
            f"{poison.oldest_due_age_seconds or 0:.0f} s past DueAt."
        )
    elif sustained is not None and sustained_long:  # (sustained_long says it is not None)
        description = (
            f"Errors for {sustained / 60:.0f} min without a {ERRORS_GAP.total_seconds() / 60:.0f}"
            f"-min gap: {window.cycles_with_errors} of {window.cycles} cycles in the last "
            f"{minutes:.0f} min had errors."
        )
    else:
        description = (
            f"No rows held back; {window.cycles_with_errors} of {window.cycles} cycles in the last "
            f"{minutes:.0f} min had errors (not sustained for {minutes:.0f} min)."
        )
    return HealthCheck(
        name="dispatch_errors",
        passed=passed,
        description=description,
        metadata={
            "poison_rows": poison.count,
            "poison_oldest_age_seconds": _round(poison.oldest_due_age_seconds),
            "errors_sustained_seconds": _round(sustained),
            "cycles_in_window": window.cycles,
            "cycles_with_errors": window.cycles_with_errors,
            "failed_cycles": window.cycles_failed,
            "failed_items": window.failed,
            "publish_failed": window.publish_failed,
            "window_minutes": minutes,
            "runbook_url": RUNBOOK_ERRORS,
        },
        runbook_url=RUNBOOK_ERRORS,
    )


def outbox_backlog(engine: Engine, now: datetime) -> HealthCheck:
    """The oldest unpublished outbox row is younger than 2 minutes, and no silent relay holds
    the lock while rows wait (named whenever rows wait or it is silent)."""
    del now  # the outbox lag is measured on the database clock, like the exporter's gauge
    with engine.connect() as conn:
        lag = outbox_repository.outbox_lag(conn)
        holder = metrics_repository.relay_lock_holder(conn)
    age = lag.oldest_unpublished_age_seconds or 0.0
    stuck = lag.unpublished > 0 and _silent(holder, RELAY_STUCK_SECONDS)
    passed = (lag.unpublished == 0 or age <= OUTBOX_LAG_SECONDS) and not stuck
    description = (
        f"{lag.unpublished} unpublished message(s); oldest {age:.0f} s "
        f"(limit {OUTBOX_LAG_SECONDS:.0f} s)."
    )
    if holder is not None and (lag.unpublished or _silent(holder, RELAY_SILENT_SECONDS)):
        description += f" Relay lock held by {holder.describe()}"
        description += (
            f": silent over {RELAY_STUCK_SECONDS:.0f} s, it holds up publishing." if stuck else "."
        )
    runbook = RUNBOOK_STUCK_RELAY if stuck else RUNBOOK_OUTBOX
    return HealthCheck(
        name="outbox_backlog",
        passed=passed,
        description=description,
        metadata={
            "unpublished": lag.unpublished,
            "oldest_unpublished_age_seconds": _round(lag.oldest_unpublished_age_seconds),
            "threshold_seconds": OUTBOX_LAG_SECONDS,
            **_holder_metadata(holder),
            "runbook_url": runbook,
        },
        runbook_url=runbook,
    )


def partial_publish(
    checks: list[HealthCheck], unpublished_of_run: int, holder: str | None = None
) -> list[HealthCheck]:
    """The checks as a run that left ``unpublished_of_run`` of its own outbox rows unpublished
    reports them: its ``outbox_backlog`` verdict says so, a warning when it passes otherwise."""
    if not unpublished_of_run:
        return checks
    why = f" (relay lock held by {holder})" if holder else ""
    note = (
        f"This run left {unpublished_of_run} of its outbox message(s) unpublished{why}; the "
        "next cycle publishes them."
    )
    return [
        replace(
            check,
            passed=False,
            severity="WARN" if check.passed else check.severity,
            description=f"{note} {check.description}",
            metadata={**check.metadata, "unpublished_of_run": unpublished_of_run},
        )
        if check.name == "outbox_backlog"
        else check
        for check in checks
    ]


def lateness_slo(engine: Engine, now: datetime) -> HealthCheck:
    """Lateness (SentAt - DueAt) at p95 over the last 15 minutes is within the 120 s SLO."""
    size = len(LATENESS_BUCKETS) + 1
    with engine.connect() as conn:
        counts = metrics_repository.lateness_buckets_since(conn, now - LATENESS_WINDOW, size)
    p50 = ledger.quantile(0.5, counts, LATENESS_BUCKETS)
    p95 = ledger.quantile(0.95, counts, LATENESS_BUCKETS)
    sent = sum(counts)
    passed = p95 is None or p95 <= LATENESS_SLO_SECONDS
    description = (
        "No reminder sent in the window."
        if p95 is None
        else f"Lateness p95 {p95:.0f} s over {sent} sent (SLO {LATENESS_SLO_SECONDS:.0f} s)."
    )
    return HealthCheck(
        name="lateness_slo",
        passed=passed,
        description=description,
        metadata={
            "lateness_p50_seconds": _round(p50),
            "lateness_p95_seconds": _round(p95),
            "sent_in_window": sent,
            "slo_seconds": LATENESS_SLO_SECONDS,
            "window_minutes": LATENESS_WINDOW.total_seconds() / 60,
            "runbook_url": RUNBOOK_LATENESS,
        },
        severity="WARN",
        runbook_url=RUNBOOK_LATENESS,
    )


def clock_skew(engine: Engine, now: datetime) -> HealthCheck:
    """No cycle in the last 15 minutes was started by a host whose clock is more than 5 s off."""
    threshold = ledger.CLOCK_SKEW_WARN_SECONDS
    with engine.connect() as conn:
        skew = metrics_repository.clock_skew_since(conn, now - ledger.CLOCK_SKEW_WINDOW, threshold)
    passed = skew.skewed_cycles == 0
    top = skew.max_abs_seconds or 0.0
    description = (
        f"{skew.skewed_cycles} of {skew.measured_cycles} cycles started by a host whose clock is "
        f"more than {threshold:.0f} s off the database's (largest {top:.1f} s); the database's "
        "clock was used."
        if not passed
        else f"Dispatching hosts' clocks within {threshold:.0f} s of the database's "
        f"(largest {top:.1f} s over {skew.measured_cycles} cycles)."
    )
    return HealthCheck(
        name="clock_skew",
        passed=passed,
        description=description,
        metadata={
            "max_abs_clock_skew_seconds": _round(skew.max_abs_seconds, 3),
            "skewed_cycles": skew.skewed_cycles,
            "measured_cycles": skew.measured_cycles,
            "threshold_seconds": threshold,
            "window_minutes": ledger.CLOCK_SKEW_WINDOW.total_seconds() / 60,
            "runbook_url": RUNBOOK_CLOCK_SKEW,
        },
        severity="WARN",
        runbook_url=RUNBOOK_CLOCK_SKEW,
    )


def coming_peak(engine: Engine, now: datetime) -> HealthCheck:
    """No minute of the next 24 hours holds more due reminders than one run can move."""
    del now  # the forecast counts on the database's clock, like the due query
    ahead = forecast.forecast(engine)
    minute, due = ahead.peak
    over = ahead.over_capacity()
    capacity = ahead.capacity_per_run
    rate = (
        f"{ahead.drain_rows_per_second:,.0f} rows/s measured over {ahead.drain_cycles} cycles"
        if ahead.drain_cycles
        else f"{ahead.drain_rows_per_second:,.0f} rows/s assumed (no drain in the ledger yet)"
    )
    run = f"one run moves {capacity:,} in {ahead.budget_seconds:.0f} s at {rate}"
    if over:
        first, first_due = over[0]
        description = (
            f"{first.isoformat()} holds {first_due:,} due reminders, more than one run can move: "
            f"{run}; {len(over)} minute(s) over in the next {ahead.hours} h, the peak "
            f"{due:,} at {minute.isoformat() if minute else '-'}."
        )
    elif minute is None:
        description = f"Nothing due in the next {ahead.hours} h; {run}."
    else:
        description = f"Busiest coming minute {minute.isoformat()}: {due:,} due; {run}."
    return HealthCheck(
        name="coming_peak",
        passed=not over,
        description=description,
        metadata={
            "peak_minute": None if minute is None else minute.isoformat(),
            "peak_due": due,
            "capacity_per_run": capacity,
            "minutes_over_capacity": len(over),
            "first_minute_over": over[0][0].isoformat() if over else None,
            "drain_rows_per_second": round(ahead.drain_rows_per_second, 1),
            "drain_cycles": ahead.drain_cycles,
            "hours": ahead.hours,
            "runbook_url": RUNBOOK_COMING_PEAK,
        },
        severity="WARN",
        runbook_url=RUNBOOK_COMING_PEAK,
    )


def vacuum_horizon(engine: Engine, now: datetime) -> HealthCheck:
    """No snapshot older than 15 minutes holds back vacuum (a warning naming its holder), and
    none while the dispatcher slows (an error)."""
    size = len(ledger.DURATION_BUCKETS) + 1
    with engine.connect() as conn:
        horizon = metrics_repository.read_vacuum_horizon(conn, now)
        reads = metrics_repository.index_reads(conn)
        tables = metrics_repository.table_dead_rows(conn)
        recent = metrics_repository.duration_buckets_since(conn, now - SLOWING_WINDOW, size)
        baseline = metrics_repository.duration_buckets_since(conn, now - SLOWING_BASELINE, size)
    recent_p50 = ledger.quantile(0.5, recent, ledger.DURATION_BUCKETS)
    baseline_p50 = ledger.quantile(0.5, baseline, ledger.DURATION_BUCKETS)
    ratio = None if recent_p50 is None or not baseline_p50 else recent_p50 / baseline_p50
    slowing = ratio is not None and ratio > SLOWING_FACTOR
    age = horizon.age_seconds
    held = age > SNAPSHOT_OLD_SECONDS
    holder = horizon.oldest
    due = next((r for r in reads if r.index == metrics_repository.DUE_INDEX), None)
    per_scan = None if due is None else due.entries_per_scan
    cost = (
        f"; the due index reads {per_scan:,.0f} entries per scan on average, {due.size_bytes:,} "
        "bytes"
        if due is not None and per_scan is not None
        else ""
    )
    window = f"{SLOWING_WINDOW.total_seconds() / 60:.0f} min"
    base = f"{SLOWING_BASELINE.total_seconds() / 3600:.0f} h"
    pace = (
        f"cycle median {recent_p50:.2f} s over the last {window}, {ratio:.1f}x its {base} median"
        if recent_p50 is not None and ratio is not None
        else f"no cycle in the last {window}"
    )
    if holder is None:
        description = "Nothing holds back vacuum."
    elif not held:
        description = (
            f"Oldest snapshot {age:,.0f} s old (limit {SNAPSHOT_OLD_SECONDS:.0f} s): "
            f"{holder.describe()}."
        )
    else:
        description = (
            f"A snapshot {age / 60:,.0f} min old holds back vacuum: {holder.describe()}. "
            + (
                f"The dispatcher slows meanwhile ({pace}){cost}. "
                if slowing
                else f"The dispatcher keeps its pace ({pace}){cost}. "
            )
            + "Find the holder and whether it may be ended: runbook, "
            "'An old snapshot holds back vacuum'."
        )
    return HealthCheck(
        name="vacuum_horizon",
        passed=not held,
        description=description,
        metadata={
            "oldest_snapshot_age_seconds": round(age, 1),
            "oldest_snapshot_xmin_age": horizon.xmin_age,
            "threshold_seconds": SNAPSHOT_OLD_SECONDS,
            **vacuum_figures.holder_figures(horizon),
            "cycle_duration_p50_seconds": _round(recent_p50, 3),
            "cycle_duration_p50_baseline_seconds": _round(baseline_p50, 3),
            "slowdown_ratio": _round(ratio, 2),
            "slowdown_factor": SLOWING_FACTOR,
            **vacuum_figures.vacuum_cost_metadata(reads, tables),
            "runbook_url": RUNBOOK_VACUUM,
        },
        severity="ERROR" if held and slowing else "WARN",
        runbook_url=RUNBOOK_VACUUM,
    )


CHECKS = (
    liveness,
    overdue,
    errors,
    outbox_backlog,
    lateness_slo,
    clock_skew,
    coming_peak,
    vacuum_horizon,
)

_MIN = 60.0

#: What each check asserts, and its runbook section; names and order as :func:`evaluate` returns.
ASSERTIONS: dict[str, tuple[str, str]] = {
    "dispatch_liveness": (
        f"A dispatch cycle succeeded in the last {LIVENESS_SECONDS / _MIN:.0f} minutes (metrics "
        "ledger; every reminder_dispatch / reminder_catch_up run records its cycle).",
        RUNBOOK_LIVENESS,
    ),
    "no_overdue_reminders": (
        f"No Pending reminder is due more than {OVERDUE_SECONDS / _MIN:.0f} minutes ago.",
        RUNBOOK_OVERDUE,
    ),
    "dispatch_errors": (
        f"No reminder held back by repeated failures (>= {POISON_MIN_ATTEMPTS} attempts), and "
        f"errors (failed cycles, failing rows, refused deliveries) not going on for "
        f"{ERRORS_WINDOW.total_seconds() / _MIN:.0f} minutes without a "
        f"{ERRORS_GAP.total_seconds() / _MIN:.0f}-minute gap.",
        RUNBOOK_ERRORS,
    ),
    "outbox_backlog": (
        f"The oldest unpublished outbox message is at most {OUTBOX_LAG_SECONDS:.0f} s old, and "
        f"no relay silent for {RELAY_STUCK_SECONDS:.0f} s holds the relay lock while messages "
        "wait (a run that left its own messages unpublished reports a warning).",
        RUNBOOK_OUTBOX,
    ),
    "lateness_slo": (
        f"Lateness p95 (SentAt - DueAt) over {LATENESS_WINDOW.total_seconds() / _MIN:.0f} "
        f"minutes within the {LATENESS_SLO_SECONDS:.0f} s SLO (a warning, not a page).",
        RUNBOOK_LATENESS,
    ),
    "clock_skew": (
        f"No dispatch cycle in the last {ledger.CLOCK_SKEW_WINDOW.total_seconds() / _MIN:.0f} "
        f"minutes started by a host whose clock is more than {ledger.CLOCK_SKEW_WARN_SECONDS:.0f} "
        "s off the database's (a warning: the database's clock is used, never the host's).",
        RUNBOOK_CLOCK_SKEW,
    ),
    "coming_peak": (
        f"No minute of the next {forecast.DEFAULT_HOURS} hours holds more due reminders than one "
        "dispatch run moves within its budget at the drain rate the ledger measured (a warning, "
        "ahead of the peak).",
        RUNBOOK_COMING_PEAK,
    ),
    "vacuum_horizon": (
        f"No snapshot older than {SNAPSHOT_OLD_SECONDS / _MIN:.0f} minutes holds back vacuum on "
        "the calendar's database (a warning naming its holder: pid, application, client, state, "
        "since when; see the runbook before ending it), and none while the dispatcher slows "
        f"(its cycles' median duration over {SLOWING_WINDOW.total_seconds() / _MIN:.0f} minutes "
        f"above {SLOWING_FACTOR:.0f}x their {SLOWING_BASELINE.total_seconds() / 3600:.0f}-hour "
        "median: an error).",
        RUNBOOK_VACUUM,
    ),
}


def evaluate(engine: Engine, now: datetime | None = None) -> list[HealthCheck]:
    """Every check, in a fixed order: liveness, overdue, errors, outbox, lateness, clock skew,
    the coming peak, the vacuum horizon.

    ``now`` defaults to the database's clock, the one the ledger's rows are stamped with: the
    host that evaluates the checks may run fast or slow (docs/design.md, "One clock").
    """
    if now is None:
        with engine.connect() as conn:
            now = repository.database_clock(conn)
    return [check(engine, now) for check in CHECKS]
