"""What the dispatch job's steps hand each other: typed records, stored as plain values.

``select_due_batch`` → :class:`DueSelection` → ``resolve_event_status`` →
:class:`DecidedSelection` → ``transition_and_outbox`` → :class:`WrittenCycle` → ``relay_outbox``
(its output: the cycle's :class:`~reminder_pipeline.cycle.CycleReport`).

The fs_io_manager pickles each step's output, and a step re-executed from the UI, maybe after an
upgrade, loads its parent run's. So a record pickles as its :meth:`plain` builtins (ids, counts,
AsOf's datetime) and is rebuilt by ``from_plain``: a stored output names no field layout, only
the loader. An output stored by an older version is read too, here and only here (the core's
records know only their own plain form): a dict with the same keys (:meth:`_StepRecord.read`),
AsOf as ISO-8601 text, reminder ids as UUIDs, lateness as one float per row, no outbox spans, no
scan start (:func:`_cycle`, :func:`_counts`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any, Self

from dagster import DagsterType

from ..cycle import Cycle, Decisions, Written
from ..domain.lateness import Lateness
from ..store.repository import SCAN_START, ScanPosition


def _cycle(data: Mapping[str, Any]) -> Cycle:
    """A stored cycle, as an older version may have stored it: AsOf as ISO-8601 text (before
    the records), no scan start (before issue 41: its scan starts at the oldest end)."""
    as_of = data["as_of"]
    if not isinstance(as_of, datetime):
        as_of = datetime.fromisoformat(as_of)
    scan = {"scan_from": list(data.get("scan_from", SCAN_START))}
    return Cycle.from_plain({**data, "as_of": as_of, **scan})


def _counts(data: Mapping[str, Any]) -> dict[str, Any]:
    """Stored counts, as an older version may have stored them: lateness as one float per row
    (before its summary)."""
    data = dict(data)
    if "lateness" not in data:
        data["lateness"] = asdict(Lateness.of(data.pop("lateness_seconds", None) or ()))
    return data


class _StepRecord:
    """Pickled as ``from_plain(plain())``; read from the record or an older version's dict."""

    #: The keys an older version's dict output holds (what :meth:`read` accepts instead).
    KEYS: frozenset[str] = frozenset()

    def plain(self) -> dict[str, Any]:
        raise NotImplementedError

    @classmethod
    def from_plain(cls, data: Mapping[str, Any]) -> Self:
        raise NotImplementedError

    def __reduce__(self) -> tuple[Any, tuple[dict[str, Any]]]:
        return (type(self).from_plain, (self.plain(),))

    @classmethod
    def read(cls, value: Self | Mapping[str, Any]) -> Self:
        """The record a step received: itself, or rebuilt from an older version's dict."""
        return value if isinstance(value, cls) else cls.from_plain(value)  # type: ignore[arg-type]

    @classmethod
    def dagster_type(cls, description: str) -> DagsterType:
        """Its Dagster type (the UI's name and text): the record, or an older version's dict."""
        return DagsterType(
            name=cls.__name__,
            description=description,
            typing_type=cls,
            type_check_fn=lambda _context, value: (
                isinstance(value, cls) or (isinstance(value, Mapping) and value.keys() >= cls.KEYS)
            ),
        )


@dataclass(frozen=True)
class DueSelection(_StepRecord):
    """Step 1: the cycle, the reminder ids reserved for the run (oldest first), how many due rows
    another transaction held, and where the scan continues past them."""

    KEYS = frozenset({"cycle", "ids", "skipped_locked"})

    cycle: Cycle
    ids: list[str]
    skipped_locked: int
    #: Where the write step's drain continues the due scan (None: at the cycle's start, as an
    #: older version's selection is read).
    after: ScanPosition | None = None

    def plain(self) -> dict[str, Any]:
        return {
            "cycle": self.cycle.plain(),
            "ids": list(self.ids),
            "skipped_locked": self.skipped_locked,
            "after": None if self.after is None else list(self.after),
        }

    @classmethod
    def from_plain(cls, data: Mapping[str, Any]) -> Self:
        after = data.get("after")
        return cls(
            _cycle(data["cycle"]),
            [str(i) for i in data["ids"]],  # an older version stored UUIDs
            int(data["skipped_locked"]),
            None if after is None else ScanPosition(*after),
        )


@dataclass(frozen=True)
class DecidedSelection(_StepRecord):
    """Step 2: the selection plus the preview (which ids would be sent, which skipped)."""

    KEYS = DueSelection.KEYS | {"send", "skip"}

    selection: DueSelection
    decisions: Decisions

    def plain(self) -> dict[str, Any]:
        preview = {"send": list(self.decisions.send), "skip": list(self.decisions.skip)}
        return {**self.selection.plain(), **preview}

    @classmethod
    def from_plain(cls, data: Mapping[str, Any]) -> Self:
        decisions = Decisions(list(data["send"]), list(data["skip"]))
        return cls(DueSelection.from_plain(data), decisions)


@dataclass(frozen=True)
class WrittenCycle(_StepRecord):
    """Step 3: the cycle and what its write did (counts, what its drain already published, its
    outbox rows)."""

    KEYS = frozenset({"cycle", "run_id", "counts", "relay"})

    cycle: Cycle
    written: Written

    def plain(self) -> dict[str, Any]:
        return {"cycle": self.cycle.plain(), **self.written.plain()}

    @classmethod
    def from_plain(cls, data: Mapping[str, Any]) -> Self:
        written = {**data, "counts": _counts(data["counts"]), "outbox": data.get("outbox", [])}
        return cls(_cycle(data["cycle"]), Written.from_plain(written))


DUE_SELECTION = DueSelection.dagster_type(
    "The cycle (run id, AsOf, batch size, budget), the reserved reminder ids oldest first, and "
    "how many due rows another transaction held."
)
DECIDED_SELECTION = DecidedSelection.dagster_type(
    "The selection plus the preview: which ids would be sent and which skipped."
)
WRITTEN_CYCLE = WrittenCycle.dagster_type(
    "What the write step did: the cycle's counts and what its drain already published."
)
