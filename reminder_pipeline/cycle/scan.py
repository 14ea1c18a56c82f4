"""Where a cycle's due scan starts, and the floor it leaves the next (docs/design.md, "Where a
scan starts").

A row moved out of Pending leaves its entry in the due index until VACUUM removes it, and while
any snapshot older than the move is open (a report, a ``pg_dump``, a replica's
``hot_standby_feedback``) VACUUM cannot, nor can a scan mark it dead: a scan that starts at the
index's oldest end visits every row dispatched since that snapshot began. So a scan starts where
the live rows start: each batch where the batch before it stopped (:class:`DueScan`), each cycle
at the floor the last cycle left (every Pending row due before it that is not a poison row was
taken). Poison rows whose back-off ended are taken from their own small index, behind the start.

What only a scan from the oldest end finds (a row written already overdue behind the floor,
against the calendar's materialisation rule, or one whose transaction committed after the floor
was written) is taken by a *full sweep*: a cycle starts at the oldest end whenever no snapshot
older than the floor is open (the dead entries behind it can then be marked dead as the scan
passes, so it is cheap), and at least once every :data:`FULL_SWEEP_SECONDS` otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy.engine import Connection, Engine

from ..store import metrics_repository, repository
from ..store.repository import SCAN_START, ScanPosition, scan_position_at

#: While a snapshot older than the floor is open, a cycle still sweeps the due index from its
#: oldest end this often, paying for the dead entries behind the floor once, so a row that only a
#: full sweep finds waits at most this long (docs/design.md, "Where a scan starts").
FULL_SWEEP_SECONDS = 600.0


@dataclass
class DueScan:
    """A cycle's due scan: where it started, where its next batch starts, what it passed over.

    ``exhausted``: a batch came back short, so every row due from ``start`` on was taken or passed
    over. Filled in batch by batch (:func:`~reminder_pipeline.cycle.drain.drain`).
    """

    start: ScanPosition = SCAN_START
    #: The scan started at the oldest end (a full sweep).
    full_sweep: bool = True
    position: ScanPosition = SCAN_START
    exhausted: bool = False
    passed_over: int = 0

    @classmethod
    def starting_at(cls, start: ScanPosition, full_sweep: bool) -> DueScan:
        """A scan whose first batch starts at ``start``."""
        return cls(start, full_sweep, start)

    def advance(self, next_from: ScanPosition, taken: int, batch_size: int, passed: int) -> None:
        """Note a committed batch: where the next starts, whether it came back short."""
        self.position = next_from
        self.exhausted = taken < batch_size
        self.passed_over += passed


def scan_start(conn: Connection) -> DueScan:
    """Where a cycle's scan starts: the floor the last cycle left, or the oldest end (a full
    sweep) when there is none, when no snapshot older than it is open, or when the last full sweep
    is :data:`FULL_SWEEP_SECONDS` old."""
    floor = repository.due_scan_floor(conn)
    if floor is None:
        return DueScan.starting_at(SCAN_START, True)
    holders = metrics_repository.snapshot_holders(conn, limit=1)
    oldest = holders[0].xmin_age if holders else None
    # A holder whose xmin is older than the floor's write still sees the rows dispatched before
    # it: their entries cannot be cleaned up, a scan from the oldest end would visit each.
    held_back = oldest is not None and oldest > floor.xids_since
    sweep_due = floor.seconds_since_sweep is None or floor.seconds_since_sweep >= FULL_SWEEP_SECONDS
    if not held_back or sweep_due:
        return DueScan.starting_at(SCAN_START, True)
    return DueScan.starting_at(floor.position, False)


def start_of_scan(engine: Engine) -> DueScan:
    """:func:`scan_start` on a connection of its own."""
    with engine.connect() as conn:
        return scan_start(conn)


def leave_floor(engine: Engine, scan: DueScan, as_of: datetime) -> ScanPosition:
    """Write the floor the next cycle starts at, after this cycle's scan committed its batches.

    Nothing passed over and everything due taken: the floor is AsOf itself. Stopped with rows
    still due (budget, ``max_batches``) and nothing passed over: where the next batch would have
    started. Otherwise the first row still Pending from this cycle's start (one walk over the range
    the cycle read): a row another transaction held, or another run reserved, is where the next
    cycle starts, so it is taken as soon as it is free.
    """
    with engine.begin() as conn:
        if scan.passed_over:
            first = repository.first_pending_from(conn, scan.start, as_of)
            floor = first if first is not None else scan_position_at(as_of)
        elif scan.exhausted:
            floor = scan_position_at(as_of)
        else:
            floor = scan.position
        repository.set_due_scan_floor(conn, floor, swept=scan.full_sweep)
    return floor
