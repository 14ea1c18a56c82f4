"""The forecast before a peak: what falls due each coming minute against what one run can move.

The per-minute counts come from the due query's partial index, on the database's clock
(:mod:`reminder_pipeline.store.forecast`); a run's capacity is its time budget at the drain rate
the metrics ledger measured over the last week (successful cycles that drained at least
:data:`MIN_DRAIN_ROWS`), or :data:`DEFAULT_DRAIN_ROWS_PER_SECOND` when it has no such history.
The same figures serve ``reminder-pipeline forecast``, the ``coming_peak`` asset check and the
exporter's peak gauge. Counts and times only: nothing about any one reminder.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy.engine import Connection, Engine

from ..config import DEFAULT_CYCLE_BUDGET_SECONDS
from ..store import forecast as store

#: The drain rate assumed without a history: one shipped ``reminder_dispatch`` run's measured
#: ~5.1k rows/s in the 50,000 burst (docs/scaling.md), rounded down.
DEFAULT_DRAIN_ROWS_PER_SECOND = 5_000.0
#: How far back the ledger's cycles count for the drain rate.
DRAIN_HISTORY = timedelta(days=7)
#: A cycle counts for the drain rate when it moved this many rows (smaller ones measure overhead).
MIN_DRAIN_ROWS = 1_000
#: The forecast's horizon: 24 hours by default, a week at most.
DEFAULT_HOURS = 24
MAX_HOURS = 168
#: The busiest minutes listed.
BUSIEST = 10


def _iso(moment: datetime) -> str:
    return moment.isoformat().replace("+00:00", "Z")


@dataclass(frozen=True)
class Forecast:
    """Pending reminders per coming minute, and one run's capacity."""

    as_of: datetime
    hours: int
    minutes: list[tuple[datetime, int]]
    budget_seconds: float
    drain_rows_per_second: float
    #: Successful cycles the drain rate was measured over; 0: the stated default was used.
    drain_cycles: int

    @property
    def capacity_per_run(self) -> int:
        """Rows one run moves within its budget at the drain rate."""
        return int(self.drain_rows_per_second * self.budget_seconds)

    @property
    def peak(self) -> tuple[datetime | None, int]:
        """The busiest coming minute and its count (the earliest of equals); (None, 0) if none."""
        if not self.minutes:
            return None, 0
        return max(self.minutes, key=lambda m: (m[1], -m[0].timestamp()))

    def busiest(self, count: int = BUSIEST) -> list[tuple[datetime, int]]:
        """The ``count`` busiest minutes, busiest first (earliest first among equals)."""
        return sorted(self.minutes, key=lambda m: (-m[1], m[0]))[:count]

    def over_capacity(self) -> list[tuple[datetime, int]]:
        """The coming minutes holding more than one run can move, in time order."""
        return [m for m in self.minutes if m[1] > self.capacity_per_run]

    def plain(self) -> dict[str, Any]:
        """As builtins (``--json``): times ISO-8601 in UTC."""
        minute, due = self.peak
        return {
            "as_of": _iso(self.as_of),
            "hours": self.hours,
            "total_due": sum(n for _, n in self.minutes),
            "peak": {"minute": None if minute is None else _iso(minute), "due": due},
            "capacity_per_run": self.capacity_per_run,
            "budget_seconds": self.budget_seconds,
            "drain_rows_per_second": round(self.drain_rows_per_second, 1),
            "drain_source": "ledger" if self.drain_cycles else "default",
            "drain_cycles": self.drain_cycles,
            "busiest": [{"minute": _iso(m), "due": n} for m, n in self.busiest()],
            "over_capacity": [{"minute": _iso(m), "due": n} for m, n in self.over_capacity()],
            "minutes": [{"minute": _iso(m), "due": n} for m, n in self.minutes],
        }


def read(
    conn: Connection,
    hours: int = DEFAULT_HOURS,
    budget_seconds: float = DEFAULT_CYCLE_BUDGET_SECONDS,
) -> Forecast:
    """The forecast over the next ``hours`` from the current minute, in the caller's transaction."""
    now = store.transaction_start(conn)
    start = now.replace(second=0, microsecond=0)
    minutes = store.due_per_minute(conn, start, hours)
    rate = store.drain_rate(conn, now - DRAIN_HISTORY, MIN_DRAIN_ROWS)
    measured = rate.rows_per_second
    return Forecast(
        as_of=now,
        hours=hours,
        minutes=minutes,
        budget_seconds=budget_seconds,
        drain_rows_per_second=measured or DEFAULT_DRAIN_ROWS_PER_SECOND,
        drain_cycles=rate.cycles if measured else 0,
    )


def forecast(
    engine: Engine,
    hours: int = DEFAULT_HOURS,
    budget_seconds: float = DEFAULT_CYCLE_BUDGET_SECONDS,
) -> Forecast:
    """:func:`read` in a short read-only transaction of its own."""
    with (
        engine.connect().execution_options(
            isolation_level="REPEATABLE READ", postgresql_readonly=True
        ) as conn,
        conn.begin(),
    ):
        return read(conn, hours, budget_seconds)
