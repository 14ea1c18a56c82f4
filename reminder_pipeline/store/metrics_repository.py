"""Repository functions of the metrics ledger, each on a Connection (the caller's transaction)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, fields
from datetime import datetime
from typing import Any

from sqlalchemy.engine import Connection

from ..domain.model import TOTALED_COUNTERS
from . import metrics_queries as q
from . import outbox_queries, repository
from .tables import event_reminders, outbox


@dataclass(frozen=True)
class CycleRecord:
    """One dispatch cycle as the ledger stores it: ids, counts and histogram bucket counts only.

    No moment of the writing host's: the database stamps the row's ``finished_at`` (and
    ``started_at``, that less ``duration_seconds``) when it writes it.
    """

    run_id: str
    as_of: datetime | None
    succeeded: bool
    sent: int
    skipped: int
    skipped_locked: int
    failed: int
    published: int
    publish_failed: int
    batches: int
    duration_seconds: float
    duration_buckets: list[int]
    lateness_sum: float
    lateness_count: int
    lateness_buckets: list[int]
    error_kind: str | None = None
    #: Reminders sent with the fallback zone (their event's TimeZone was not a canonical IANA name).
    time_zone_fallbacks: int = 0
    #: How far the starting host's clock was ahead of the database's (None: not measured).
    clock_skew_seconds: float | None = None


def insert_cycle(conn: Connection, record: CycleRecord) -> datetime:
    """Insert one ledger row at the database's clock; returns its ``finished_at``."""
    params = {f.name: getattr(record, f.name) for f in fields(record)}
    finished: datetime = conn.execute(q.INSERT_CYCLE, params).scalar_one()
    return finished


def set_local_timeouts(conn: Connection, statement_ms: int, lock_ms: int) -> None:
    """Bound this transaction's statements and lock waits (SET LOCAL)."""
    conn.execute(
        q.SET_LOCAL_TIMEOUTS, {"statement_ms": f"{statement_ms}ms", "lock_ms": f"{lock_ms}ms"}
    )


def fit(counts: Iterable[int] | None, size: int) -> list[int]:
    """Bucket counts padded with zeros (or cut) to ``size`` elements."""
    values = [int(c or 0) for c in (counts or [])][:size]
    return values + [0] * (size - len(values))


def add_counts(a: Sequence[int], b: Sequence[int]) -> list[int]:
    """Element-wise sum of two bucket-count arrays of the same length."""
    return [x + y for x, y in zip(a, b, strict=True)]


@dataclass
class LedgerTotals:
    """Everything ever recorded: the counters and histograms the exporter serves."""

    cycles: int = 0
    cycles_failed: int = 0
    sent: int = 0
    skipped: int = 0
    skipped_locked: int = 0
    failed: int = 0
    published: int = 0
    publish_failed: int = 0
    time_zone_fallbacks: int = 0
    duration_sum: float = 0.0
    duration_buckets: list[int] = field(default_factory=list)
    lateness_sum: float = 0.0
    lateness_count: int = 0
    lateness_buckets: list[int] = field(default_factory=list)
    last_success_at: datetime | None = None


#: The totals row's counters: cycles first (counted per row below), then the cycle's counters
#: kept in the totals (domain.model.CycleCounts) and the lateness observations.
_COUNTERS = ("cycles", "cycles_failed", *TOTALED_COUNTERS, "lateness_count")


def _later(a: datetime | None, b: datetime | None) -> datetime | None:
    if a is None or b is None:
        return a or b
    return max(a, b)


def _totals_row(conn: Connection, *, for_update: bool) -> dict[str, Any]:
    statement = q.SELECT_TOTALS_FOR_UPDATE if for_update else q.SELECT_TOTALS
    row = conn.execute(statement).one_or_none()
    if row is None:  # the migration inserts it; refuse to guess if someone deleted it
        raise LookupError(
            "dispatch_metric_totals has no row 1; re-run `reminder-pipeline db upgrade`"
        )
    return dict(row._mapping)


def ledger_totals(conn: Connection, duration_size: int, lateness_size: int) -> LedgerTotals:
    """Totals row + sums over the detail rows. Run it in one snapshot (REPEATABLE READ)."""
    base = _totals_row(conn, for_update=False)
    detail = conn.execute(q.SUM_DETAIL).one()._mapping
    totals = LedgerTotals(
        duration_sum=float(base["duration_sum"]) + float(detail["duration_sum"]),
        lateness_sum=float(base["lateness_sum"]) + float(detail["lateness_sum"]),
        duration_buckets=fit(base["duration_buckets"], duration_size),
        lateness_buckets=fit(base["lateness_buckets"], lateness_size),
        last_success_at=_later(base["last_success_at"], detail["last_success_at"]),
    )
    for name in _COUNTERS:
        setattr(totals, name, int(base[name]) + int(detail[name]))
    by_histogram: dict[str, dict[int, int]] = {"duration": {}, "lateness": {}}
    for row in conn.execute(q.SUM_DETAIL_BUCKETS):
        by_histogram[row.histogram][int(row.i)] = int(row.n)
    for name, size in (("duration", duration_size), ("lateness", lateness_size)):
        detail_counts = [by_histogram[name].get(i + 1, 0) for i in range(size)]
        attr = f"{name}_buckets"
        setattr(totals, attr, add_counts(getattr(totals, attr), detail_counts))
    return totals


def roll_up_detail(
    conn: Connection,
    retention_seconds: float,
    duration_size: int,
    lateness_size: int,
    limit: int = 5000,
) -> int:
    """Move detail rows finished over ``retention_seconds`` ago (the database's clock) into the
    totals row; returns how many moved.

    Call it in its own transaction; it does nothing (returns 0) when another roll-up holds the
    lock. Totals + detail stay the same before and after, so no served counter steps back.
    """
    if not conn.execute(q.TRY_ROLL_UP_LOCK, {"key": q.ROLL_UP_LOCK_KEY}).scalar_one():
        return 0
    totals = _totals_row(conn, for_update=True)
    moved = conn.execute(
        q.DELETE_ROLL_UP_CANDIDATES, {"retention_seconds": retention_seconds, "limit": limit}
    ).all()
    if not moved:
        return 0
    new: dict[str, Any] = {name: int(totals[name]) for name in _COUNTERS}
    new["duration_sum"] = float(totals["duration_sum"])
    new["lateness_sum"] = float(totals["lateness_sum"])
    duration = fit(totals["duration_buckets"], duration_size)
    lateness = fit(totals["lateness_buckets"], lateness_size)
    last_success = totals["last_success_at"]
    rolled_until = totals["rolled_up_until"]
    for row in moved:
        new["cycles"] += 1
        new["cycles_failed"] += 0 if row.succeeded else 1
        for name in _COUNTERS[2:]:  # the per-row counts (cycles and failed cycles: above)
            new[name] += int(getattr(row, name))
        new["duration_sum"] += float(row.duration_seconds)
        new["lateness_sum"] += float(row.lateness_sum)
        duration = add_counts(duration, fit(row.duration_buckets, duration_size))
        lateness = add_counts(lateness, fit(row.lateness_buckets, lateness_size))
        if row.succeeded:
            last_success = _later(last_success, row.finished_at)
        rolled_until = _later(rolled_until, row.finished_at)
    conn.execute(
        q.UPDATE_TOTALS,
        {
            **new,
            "duration_buckets": duration,
            "lateness_buckets": lateness,
            "last_success_at": last_success,
            "rolled_up_until": rolled_until,
        },
    )
    return len(moved)


def last_success_at(conn: Connection) -> datetime | None:
    """When the newest successful cycle finished, or None if there never was one."""
    last: datetime | None = conn.execute(q.LAST_SUCCESS_AT).scalar_one()
    return last


@dataclass(frozen=True)
class CycleWindow:
    """Cycles recorded since a moment, and their errors."""

    cycles: int
    cycles_failed: int
    cycles_with_errors: int
    failed: int
    publish_failed: int
    sent: int


def cycles_since(conn: Connection, since: datetime) -> CycleWindow:
    """Cycle and error counts of the cycles finished at or after ``since``."""
    row = conn.execute(q.CYCLES_SINCE, {"since": since}).one()
    return CycleWindow(*(int(v) for v in row))


@dataclass(frozen=True)
class ClockSkew:
    """Recent cycles' host clock skew: the largest (absolute), and how many were off."""

    max_abs_seconds: float | None
    skewed_cycles: int
    measured_cycles: int


def clock_skew_since(conn: Connection, since: datetime, threshold: float) -> ClockSkew:
    """The clock skew of the cycles finished at or after ``since``."""
    row = conn.execute(q.CLOCK_SKEW_SINCE, {"since": since, "threshold": threshold}).one()
    top = row.max_abs_skew
    return ClockSkew(None if top is None else float(top), int(row.skewed), int(row.measured))


def lateness_buckets_since(conn: Connection, since: datetime, size: int) -> list[int]:
    """Per-bucket lateness counts of the cycles finished at or after ``since``."""
    counts = {int(r.i): int(r.n) for r in conn.execute(q.LATENESS_BUCKETS_SINCE, {"since": since})}
    return [counts.get(i + 1, 0) for i in range(size)]


def count_overdue(conn: Connection, cutoff: datetime, now: datetime) -> repository.Backlog:
    """Pending rows with ``due_at`` before ``cutoff``, the oldest one's age at ``now`` (the
    backlog's statement, with its own bound)."""
    return repository.backlog(conn, now, due_before=cutoff)


def error_cycle_times_since(conn: Connection, since: datetime) -> list[datetime]:
    """When each cycle with errors finished at or after ``since``, newest first."""
    return list(conn.execute(q.ERROR_CYCLE_TIMES_SINCE, {"since": since}).scalars())


#: A Pending row counts as held back by repeated failures from its second failed attempt. The
#: first failure may be a one-off: the row is retried 30 s later (the next cycle) and goes out if
#: the event was fixed in between. A second failure means the cause persists; from then on the
#: back-off grows towards an hour and the row does not go out by itself. The second attempt comes
#: about a minute after the first, well inside the 5-minute overdue limit.
POISON_MIN_ATTEMPTS = 2


@dataclass(frozen=True)
class PoisonRows:
    """Due Pending rows held back by repeated failures (poison rows), and the oldest one's age."""

    count: int
    oldest_due_age_seconds: float | None


def poison_summary(
    conn: Connection, now: datetime, min_attempts: int = POISON_MIN_ATTEMPTS
) -> PoisonRows:
    """Due Pending rows with at least ``min_attempts`` failed attempts, read live."""
    row = conn.execute(q.POISON_ROWS, {"now": now, "min_attempts": min_attempts}).one()
    age = row.oldest_due_age_seconds
    return PoisonRows(int(row.poison_rows), None if age is None else float(age))


@dataclass(frozen=True)
class RelayLockHolder:
    """The session holding the relay lock, as pg_locks and pg_stat_activity show it."""

    pid: int
    application_name: str | None
    client_addr: str | None
    client_port: int | None
    backend_start: datetime | None
    state: str | None
    state_change: datetime | None
    wait_event_type: str | None
    wait_event: str | None
    query_start: datetime | None
    #: Seconds it has sent nothing the server waits for (idle, or waiting on its client); 0
    #: while it works.
    silent_seconds: float
    #: Seconds in its current state (None: the session is another role's and hidden).
    state_seconds: float | None

    def describe(self) -> str:
        """``pid N (application_name 'x', client 10.0.0.5:5123, state idle for 45 s)``."""
        parts = []
        if self.application_name is not None:
            parts.append(f"application_name '{self.application_name}'")
        if self.client_addr is not None:
            parts.append(f"client {self.client_addr}:{self.client_port}")
        if self.state is None:
            parts.append("state hidden (no pg_read_all_stats)")
        else:
            state = self.state
            if self.wait_event is not None and self.state == "active":
                state += f" waiting on {self.wait_event}"
            if self.state_seconds is not None:
                state += f" for {self.state_seconds:.0f} s"
            parts.append(f"state {state}")
        return f"pid {self.pid} ({', '.join(parts)})"


def relay_lock_holder(conn: Connection) -> RelayLockHolder | None:
    """Who holds the relay lock in this database, None when nobody does."""
    key = outbox_queries.RELAY_LOCK_KEY
    row = conn.execute(
        outbox_queries.RELAY_LOCK_HOLDER, {"classid": key >> 32, "objid": key & 0xFFFFFFFF}
    ).first()
    if row is None:
        return None
    return RelayLockHolder(
        pid=int(row.pid),
        application_name=row.application_name,
        client_addr=row.client_addr,
        client_port=row.client_port,
        backend_start=row.backend_start,
        state=row.state,
        state_change=row.state_change,
        wait_event_type=row.wait_event_type,
        wait_event=row.wait_event,
        query_start=row.query_start,
        silent_seconds=float(row.silent_seconds or 0),
        state_seconds=None if row.state_seconds is None else float(row.state_seconds),
    )


@dataclass(frozen=True)
class SnapshotHolder:
    """A session, walsender, prepared transaction or replication slot that holds back the
    database's xmin horizon (metrics_queries.SNAPSHOT_HOLDERS)."""

    #: ``session``, ``walsender``, ``prepared transaction`` or ``replication slot``.
    kind: str
    pid: int | None
    #: The session's application name (a prepared transaction's gid, a slot's name).
    application_name: str | None
    client_addr: str | None
    #: None: another role's session, hidden without pg_read_all_stats.
    state: str | None
    xact_start: datetime | None
    query_start: datetime | None
    #: How many transactions old its xmin is (``age()``).
    xmin_age: int | None
    #: Seconds since its transaction began (None: not known, or hidden).
    age_seconds: float | None

    def describe(self) -> str:
        """``session pid 4711 ('nightly-report', client 10.0.0.7, idle in transaction, 1,234 s,
        xmin 5,678 transactions old)``."""
        parts = [f"'{self.application_name}'" if self.application_name is not None else "no name"]
        if self.client_addr is not None:
            parts.append(f"client {self.client_addr}")
        if self.state is not None:
            parts.append(self.state)
        elif self.kind == "session":
            parts.append("state hidden (no pg_read_all_stats)")
        if self.age_seconds is not None:
            parts.append(f"{self.age_seconds:,.0f} s")
        if self.xmin_age is not None:
            parts.append(f"xmin {self.xmin_age:,} transactions old")
        pid = "" if self.pid is None else f" pid {self.pid}"
        return f"{self.kind}{pid} ({', '.join(parts)})"


def snapshot_holders(
    conn: Connection, limit: int = 5, now: datetime | None = None
) -> list[SnapshotHolder]:
    """Who holds back this database's xmin horizon, the oldest first (at most ``limit``); ages
    in seconds up to ``now`` (by default the database's clock as the statement runs)."""
    rows = conn.execute(q.SNAPSHOT_HOLDERS, {"now": now, "limit": limit}).all()
    return [
        SnapshotHolder(
            kind=r.kind,
            pid=None if r.pid is None else int(r.pid),
            application_name=r.application_name,
            client_addr=r.client_addr,
            state=r.state,
            xact_start=r.xact_start,
            query_start=r.query_start,
            xmin_age=None if r.xmin_age is None else int(r.xmin_age),
            # A transaction begun after :now was read: 0, not a negative age.
            age_seconds=None if r.age_seconds is None else max(float(r.age_seconds), 0.0),
        )
        for r in rows
    ]


@dataclass(frozen=True)
class VacuumHorizon:
    """The database's xmin horizon: who holds it back, oldest first, and since when."""

    holders: list[SnapshotHolder]
    #: A moment the horizon already held, dated by the metrics ledger (None: no ledger row is
    #: younger than it): LEDGER_ROW_AFTER_XMIN.
    held_by: datetime | None
    #: The database's clock the ages are measured to.
    now: datetime

    @property
    def oldest(self) -> SnapshotHolder | None:
        """The holder with the oldest xmin (None: nothing holds the horizon back)."""
        return self.holders[0] if self.holders else None

    @property
    def xmin_age(self) -> int:
        """How many transactions old the horizon is (0 when nothing holds it back)."""
        oldest = self.oldest
        return 0 if oldest is None or oldest.xmin_age is None else max(oldest.xmin_age, 0)

    @property
    def age_seconds(self) -> float:
        """How long the horizon has been held back: the oldest holder's transaction age where
        pg_stat_activity shows it, and at least since the ledger row that dates the horizon
        (whichever is longer); 0 when nothing holds it back or neither is known."""
        oldest = self.oldest
        if oldest is None:
            return 0.0
        ages = [] if oldest.age_seconds is None else [oldest.age_seconds]
        if self.held_by is not None:
            ages.append(max((self.now - self.held_by).total_seconds(), 0.0))
        return max(ages, default=0.0)


def read_vacuum_horizon(conn: Connection, now: datetime, limit: int = 5) -> VacuumHorizon:
    """Who holds back the xmin horizon and since when (run both reads in one transaction: the
    ages in transactions are counted from the same latest transaction id)."""
    holders = snapshot_holders(conn, limit, now)
    oldest = holders[0].xmin_age if holders else None
    held_by = None
    if oldest is not None and oldest > 0:
        held_by = conn.execute(q.LEDGER_ROW_AFTER_XMIN, {"xmin_age": oldest}).scalar_one()
    return VacuumHorizon(holders, held_by, now)


#: The due scan's index and the relay's (store/tables.py): while a snapshot is held, both keep an
#: entry for every row dispatched (published) since it began, and a scan from their oldest end
#: reads each one. Their tables are watched for dead rows and vacuum.
DUE_INDEX = "ix_event_reminders_status_due_at"
UNPUBLISHED_INDEX = "ix_outbox_unpublished"
WATCHED_INDEXES = (DUE_INDEX, UNPUBLISHED_INDEX)
WATCHED_TABLES = (event_reminders.name, outbox.name)


@dataclass(frozen=True)
class IndexReads:
    """One index's cumulative read statistics (pg_stat_user_indexes) and its size."""

    index: str
    table: str
    #: Index scans started on it.
    scans: int
    #: Index entries those scans returned (``idx_tup_read``).
    entries_read: int
    #: Live rows fetched through it (``idx_tup_fetch``): read and not fetched is, on these
    #: partial indexes, mostly a dead entry stepped over.
    entries_fetched: int
    size_bytes: int

    @property
    def entries_per_scan(self) -> float | None:
        """Entries read per scan since the statistics were reset (None: no scan)."""
        return self.entries_read / self.scans if self.scans else None


def index_reads(conn: Connection, names: Sequence[str] = WATCHED_INDEXES) -> list[IndexReads]:
    """The watched indexes' read statistics, by name."""
    rows = conn.execute(q.INDEX_READS, {"names": list(names)}).all()
    return [
        IndexReads(
            index=r.index_name,
            table=r.table_name,
            scans=int(r.idx_scan or 0),
            entries_read=int(r.idx_tup_read or 0),
            entries_fetched=int(r.idx_tup_fetch or 0),
            size_bytes=int(r.size_bytes or 0),
        )
        for r in rows
    ]


@dataclass(frozen=True)
class TableDeadRows:
    """One table's live and dead row versions (pg_stat_user_tables) and its last vacuum."""

    table: str
    live_rows: int
    dead_rows: int
    #: The last VACUUM, by hand or autovacuum (None: never since the statistics were reset).
    last_vacuum_at: datetime | None


def table_dead_rows(conn: Connection, names: Sequence[str] = WATCHED_TABLES) -> list[TableDeadRows]:
    """The watched tables' row counts and last vacuum, by name."""
    rows = conn.execute(q.TABLE_DEAD_ROWS, {"names": list(names)}).all()
    return [
        TableDeadRows(
            table=r.table_name,
            live_rows=int(r.n_live_tup or 0),
            dead_rows=int(r.n_dead_tup or 0),
            last_vacuum_at=r.last_vacuum_at,
        )
        for r in rows
    ]


def duration_buckets_since(conn: Connection, since: datetime, size: int) -> list[int]:
    """Per-bucket cycle-duration counts of the cycles finished at or after ``since``."""
    counts = {int(r.i): int(r.n) for r in conn.execute(q.DURATION_BUCKETS_SINCE, {"since": since})}
    return [counts.get(i + 1, 0) for i in range(size)]
