"""The forecast's statements and reads: what falls due each coming minute, how fast runs drain.

Both on a Connection (the caller's transaction), both on the database's clock and indexes: the
per-minute counts walk the due query's partial index (Pending rows only, in ``due_at`` order) over
the coming window, the drain rate the ledger's ``finished_at`` index over its recent past.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import text
from sqlalchemy.engine import Connection

# The database's clock at the start of the transaction (the forecast's "now").
DATABASE_NOW = text("SELECT now()")

# Pending reminders per minute in [:start, :until), minutes with none left out: for each minute
# an index-only range scan of the partial index ix_event_reminders_status_due_at (status =
# 'Pending', (due_at, id)) that counts its entries, so it reads only the window's Pending rows
# however many Sent/Skipped rows the table holds, and nothing is sorted. At 10M rows (~167k
# Pending in the next 24 h) ~120 ms, half the time of one GROUP BY date_trunc over the same range,
# which sorts every row (docs/benchmarks.md, "The forecast query").
DUE_PER_MINUTE = text(
    """
    SELECT m.minute, c.due
      FROM generate_series(CAST(:start AS timestamptz),
                           CAST(:until AS timestamptz) - interval '1 minute',
                           interval '1 minute') AS m(minute)
     CROSS JOIN LATERAL (
           SELECT count(*) AS due
             FROM event_reminders
            WHERE status = 'Pending'
              AND due_at >= m.minute AND due_at < m.minute + interval '1 minute'
           ) AS c
     WHERE c.due > 0
     ORDER BY m.minute
    """
)


# The ledger's drain rate: rows moved out of Pending per second of cycle, over successful cycles
# since :since that drained at least :min_rows (idle cycles measure their overhead, not a drain).
DRAIN_RATE = text(
    """
    SELECT count(*)                                  AS cycles,
           coalesce(sum(sent + skipped + failed), 0) AS rows,
           coalesce(sum(duration_seconds), 0)        AS seconds
      FROM dispatch_cycles
     WHERE succeeded AND finished_at >= :since AND sent + skipped + failed >= :min_rows
    """
)


@dataclass(frozen=True)
class DrainRate:
    """What the ledger measured: cycles, rows drained and their seconds (None: no history)."""

    cycles: int
    rows: int
    seconds: float

    @property
    def rows_per_second(self) -> float | None:
        """Rows per second over those cycles, or None without any."""
        return self.rows / self.seconds if self.cycles and self.seconds > 0 else None


def transaction_start(conn: Connection) -> datetime:
    """The database's clock (``now()``: the transaction's start)."""
    now: datetime = conn.execute(DATABASE_NOW).scalar_one()
    return now


def due_per_minute(conn: Connection, start: datetime, hours: int) -> list[tuple[datetime, int]]:
    """(minute, Pending reminders due in it) for each minute of ``hours`` from ``start`` that has
    any, in order."""
    rows = conn.execute(DUE_PER_MINUTE, {"start": start, "until": start + timedelta(hours=hours)})
    return [(row.minute, int(row.due)) for row in rows]


def drain_rate(conn: Connection, since: datetime, min_rows: int) -> DrainRate:
    """The drain rate of successful cycles since ``since`` that moved ``min_rows`` or more."""
    row = conn.execute(DRAIN_RATE, {"since": since, "min_rows": min_rows}).one()
    return DrainRate(int(row.cycles), int(row.rows), float(row.seconds))
