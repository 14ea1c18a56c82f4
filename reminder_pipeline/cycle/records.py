"""The plain records a cycle hands from step to step (what Dagster steps store between ops)."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime
from typing import Any, Protocol

from ..config import DEFAULT_CYCLE_BUDGET_SECONDS, DEFAULT_MAX_BATCHES
from ..domain.lateness import Lateness
from ..domain.model import (
    ClaimedMessage,
    CycleCounts,
    DueReminder,
    PoisonRow,
)
from ..messaging.relay import OutboxSpans, RelayResult
from ..observability.ledger import CLOCK_SKEW_WARN_SECONDS
from ..store.repository import SCAN_START, ScanPosition
from .scan import DueScan

#: What a batch progress callback receives: the cycle's counts so far.
Progress = Callable[[CycleCounts], None]


@dataclass(frozen=True)
class Cycle:
    """One cycle's settings and start (wall clock: a re-executed step runs in another process)."""

    run_id: str
    as_of: datetime
    batch_size: int
    max_batches: int = DEFAULT_MAX_BATCHES
    budget_seconds: float = DEFAULT_CYCLE_BUDGET_SECONDS
    started_at: float = field(default_factory=time.time)
    #: How far the starting host's clock was ahead of the database's (seconds; + = fast).
    clock_skew_seconds: float = 0.0
    #: Where the cycle's due scan starts (docs/design.md, "Where a scan starts").
    scan_from: ScanPosition = SCAN_START
    #: The scan starts at the due index's oldest end (a full sweep).
    full_sweep: bool = True

    def plain(self) -> dict[str, Any]:
        """Builtins and AsOf's datetime: what a step hands the next (the IO manager stores it)."""
        return {**asdict(self), "scan_from": list(self.scan_from)}

    @classmethod
    def from_plain(cls, data: Mapping[str, Any]) -> Cycle:
        """From :meth:`plain`."""
        return cls(**{**data, "scan_from": ScanPosition(*data["scan_from"])})

    @property
    def scan(self) -> DueScan:
        """A new due scan from the cycle's start."""
        return DueScan.starting_at(self.scan_from, self.full_sweep)


@dataclass(frozen=True)
class Decisions:
    """Step 2's preview: which selected rows would be sent and which skipped."""

    send: list[str]
    skip: list[str]


@dataclass
class Written:
    """What step 3 did in run ``run_id``: its counts, what it already published, and its outbox
    rows (the ones step 4 must see out, or report a partial publish)."""

    run_id: str
    counts: CycleCounts
    relay: RelayResult = field(default_factory=RelayResult)
    outbox: OutboxSpans = field(default_factory=OutboxSpans)

    def plain(self) -> dict[str, Any]:
        """As builtins."""
        return {
            "run_id": self.run_id,
            "counts": asdict(self.counts),
            "relay": self.relay.plain(),
            "outbox": self.outbox.plain(),
        }

    @classmethod
    def from_plain(cls, data: Mapping[str, Any]) -> Written:
        """From :meth:`plain`."""
        return cls(
            data["run_id"],
            CycleCounts.from_plain(data["counts"]),
            RelayResult(**data["relay"]),
            OutboxSpans.from_plain(data["outbox"]),
        )


@dataclass
class CycleReport:
    """A whole cycle: counts, the relay's result, and what is left behind."""

    run_id: str
    as_of: datetime
    batch_size: int
    counts: CycleCounts
    relay: RelayResult
    backlog_remaining: int
    oldest_due_age_seconds: float | None
    outbox_unpublished: int = 0
    #: How far the host that started the cycle was ahead of the database's clock (seconds).
    clock_skew_seconds: float = 0.0
    #: A step re-executed from the UI that only relayed: the sends were the parent run's.
    reexecuted_relay_only: bool = False
    #: The cycle's due scan started at the due index's oldest end (docs/design.md, "Where a scan
    #: starts"); otherwise at the floor the cycle before it left.
    full_sweep: bool = False

    def figures(self) -> dict[str, int | float | bool]:
        """The cycle's figures as numbers, never None (what the asset plots over runs)."""
        c = self.counts
        return {
            **c.figures(),
            "duration_ms": c.duration_ms,
            "backlog_remaining": self.backlog_remaining,
            "oldest_due_age_seconds": float(self.oldest_due_age_seconds or 0),
            "max_lateness_seconds": float(c.max_lateness_seconds or 0),
            "outbox_unpublished": self.outbox_unpublished,
            "batch_size": self.batch_size,
            "clock_skew_seconds": round(self.clock_skew_seconds, 3),
            "clock_skewed": abs(self.clock_skew_seconds) > CLOCK_SKEW_WARN_SECONDS,
            "reexecuted_relay_only": self.reexecuted_relay_only,
            "full_sweep": self.full_sweep,
            "unpublished_of_run": self.relay.left,
            "partial_publish": self.relay.partial,
        }

    def plain(self) -> dict[str, Any]:
        """:meth:`as_dict` with AsOf's datetime: the last step's output (the IO manager stores
        it)."""
        return {**self.as_dict(), "as_of": self.as_of}

    def as_dict(self) -> dict[str, Any]:
        """Flat dict for the CLI, logs and metadata (AsOf as ISO-8601 text)."""
        data: dict[str, Any] = self.counts.as_dict()
        data.update(
            run_id=self.run_id,
            as_of=self.as_of.isoformat(),
            batch_size=self.batch_size,
            backlog_remaining=self.backlog_remaining,
            oldest_due_age_seconds=self.oldest_due_age_seconds,
            outbox_unpublished=self.outbox_unpublished,
            unpublished_of_run=self.relay.left,
            clock_skew_seconds=round(self.clock_skew_seconds, 3),
            full_sweep=self.full_sweep,
        )
        return data


@dataclass(frozen=True)
class Selection:
    """A batch's selection in the caller's transaction: the rows locked and read once, oldest
    first, how many due rows others held, and where the next batch's scan starts."""

    as_of: datetime
    batch_size: int
    rows: list[DueReminder]
    skipped_locked: int = 0
    next_from: ScanPosition = SCAN_START
    #: Candidates no longer Pending or due (sent, skipped or deleted since they were reserved).
    gone: int = 0


class Moved(Protocol):
    """A reminder a batch moved out of Pending, as its log lines name it (ids, no PII)."""

    @property
    def reminder_id(self) -> str: ...
    @property
    def event_id(self) -> str: ...
    @property
    def tenant_id(self) -> str: ...
    @property
    def offset_minutes(self) -> int: ...
    @property
    def event_status(self) -> str: ...


@dataclass
class BatchOutcome:
    """What one batch's write (:func:`~reminder_pipeline.cycle.batch.write_rows`) did."""

    sent: list[Moved] = field(default_factory=list)
    skipped: list[Moved] = field(default_factory=list)
    poison: list[PoisonRow] = field(default_factory=list)
    time_zone_fallbacks: list[DueReminder] = field(default_factory=list)
    #: Candidates still Pending that another transaction (or another run's reservation) holds.
    skipped_locked: int = 0
    #: Candidates no longer Pending or due (sent, skipped or deleted since they were selected).
    gone: int = 0
    #: Rows the selection of this batch took (a short batch ends a drain).
    selected: int = 0
    outbox_rows: int = 0
    #: SentAt - DueAt of the rows sent, summarised (count, sum, largest, histogram).
    lateness: Lateness = field(default_factory=Lateness)
    #: The outbox rows written, as the relay publishes them (a drain hands them to its relay).
    messages: list[ClaimedMessage] = field(default_factory=list, repr=False)
    #: Where the next batch's scan starts (a drain's batch; None for a run's reserved batch).
    next_from: ScanPosition | None = None

    def counts(self) -> CycleCounts:
        """This batch as cycle counts."""
        return CycleCounts(
            selected=len(self.sent) + len(self.skipped) + len(self.poison),
            sent=len(self.sent),
            skipped=len(self.skipped),
            skipped_locked=self.skipped_locked,
            failed=len(self.poison),
            batches=1,
            time_zone_fallbacks=len(self.time_zone_fallbacks),
            lateness=replace(self.lateness, buckets=list(self.lateness.buckets)),
        )
