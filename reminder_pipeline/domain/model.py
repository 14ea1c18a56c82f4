"""Statuses and the plain records that move between the steps of a dispatch cycle."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field, fields
from datetime import datetime
from enum import StrEnum
from typing import Any, NamedTuple

from .lateness import Lateness


def parse_uuid(value: object) -> uuid.UUID:
    """An id typed by a person: a UUID in any form Python reads (hyphens or not, braces), with
    RFC 9562's ``urn:uuid:`` prefix in any case. ValueError if it is none of them."""
    if isinstance(value, uuid.UUID):
        return value
    text = str(value).strip()
    if text[:9].lower() == "urn:uuid:":
        text = text[9:]
    return uuid.UUID(text)


class ReminderStatus(StrEnum):
    """Lifecycle of an ``event_reminders`` row; Sent and Skipped are terminal."""

    PENDING = "Pending"
    SENT = "Sent"
    SKIPPED = "Skipped"


class EventStatus(StrEnum):
    """Status of the parent calendar event."""

    PLANNED = "Planned"
    IN_PROGRESS = "InProgress"
    COMPLETED = "Completed"
    CANCELLED = "Cancelled"


class EventKind(StrEnum):
    """Known kinds of calendar event; the contract is additive, so others may appear."""

    SHOWING = "Showing"
    CONSULTATION = "Consultation"
    MEETING = "Meeting"
    TASK = "Task"
    BOOKING_DEADLINE = "BookingDeadline"


class EventOrigin(StrEnum):
    """Where a calendar event came from."""

    MANUAL = "Manual"
    APPOINTMENT = "Appointment"


class DueReminder(NamedTuple):
    """A due reminder row as its batch locked and read it, with the fields of its event the
    message needs (no PII): the one type of that shape, read from the columns of its fields'
    names (store/repository.py). A tuple: a batch reads 1,000 of them.

    Ids are the canonical text of the database's uuid values (lower-case, hyphenated), as the
    payload carries them; ``start_at`` is None when it lies outside Python's range (the row is
    then poison).
    """

    reminder_id: str
    event_id: str
    tenant_id: str
    owner_user_id: str
    client_user_id: str | None
    appointment_id: str | None
    kind: str
    event_status: str
    start_at: datetime | None
    time_zone: str
    offset_minutes: int
    due_at: datetime
    attempts: int = 0


class Action(StrEnum):
    """What the dispatcher does with one due row."""

    SEND = "send"
    SKIP = "skip"


@dataclass(slots=True)
class ClaimedMessage:
    """An outbox row as the relay hands it to the producer (payload as stored, text)."""

    id: int
    topic: str
    message_key: str
    payload: str
    headers: dict[str, str]


@dataclass(frozen=True)
class PoisonRow:
    """A row whose payload cannot be built or breaks the contract: left Pending, logged, counted."""

    reminder_id: str
    event_id: str
    tenant_id: str | None
    error: str


def counter(
    description: str, *, figure: str | None = None, ledger: bool = True, totals: bool = True
) -> Any:
    """A field of :class:`CycleCounts` that is a counter: summed across batches, shown and recorded.

    ``figure``: its name in a run's asset metadata (the Dagster UI plots it); ``ledger``: kept
    per cycle in the metrics ledger (``dispatch_cycles``, a column); ``totals``: also summed
    into the ledger's totals row, which the exporter serves as a Prometheus counter. Everything
    else that lists the counters derives the list from these fields.
    """
    metadata = {"counter": True, "description": description, "figure": figure}
    return field(default=0, metadata={**metadata, "ledger": ledger, "totals": ledger and totals})


@dataclass
class CycleCounts:
    """The design's cycle result plus what operators need to see; merged across batches.

    Adding a counter is adding a field here with :func:`counter` (and its description): the
    sums across batches, the CLI's output and the asset's metadata derive from these fields
    (``COUNTERS``, ``FIGURES``, ``LEDGER_COUNTERS`` below); a ledger counter also needs its
    column in a migration and its name in the ledger's statements, which are written whole
    (store/metrics_queries.py; packaging/test_statements.py says which miss it).
    """

    sent: int = counter("reminders moved Pending → Sent, one outbox row each", figure="sent_count")
    skipped: int = counter(
        "reminders moved Pending → Skipped (event cancelled or completed)", figure="skipped_count"
    )
    skipped_locked: int = counter(
        "due rows passed over because another transaction held them", figure="skipped_locked_count"
    )
    failed: int = counter("poison rows left Pending with a back-off", figure="failed_count")
    published: int = counter("outbox rows the relay published", figure="published_count")
    publish_failed: int = counter(
        "outbox rows the relay could not publish (they stay for the next cycle)",
        figure="publish_failed_count",
    )
    batches: int = counter("batches written, each one transaction", figure="batches", totals=False)
    selected: int = counter("rows the batches' selections took", ledger=False)
    time_zone_fallbacks: int = counter(
        "reminders sent with the fallback zone (their event's TimeZone is not canonical IANA)",
        figure="time_zone_fallback_count",
    )
    duration_ms: int = 0
    #: SentAt - DueAt of the rows sent, for the lateness histogram (the SLO): a fixed-size
    #: summary, so a long drain's counts stay a few hundred bytes (a Dagster step's output).
    lateness: Lateness = field(default_factory=Lateness, repr=False)

    @property
    def max_lateness_seconds(self) -> float | None:
        """The largest lateness of the rows sent (None when none was sent)."""
        return self.lateness.largest

    def add(self, other: CycleCounts) -> None:
        """Accumulate another batch's counts into this one (durations are set by the caller)."""
        for name in COUNTERS:
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.lateness.add(other.lateness)

    @classmethod
    def from_plain(cls, data: dict[str, Any]) -> CycleCounts:
        """From ``dataclasses.asdict`` of one."""
        data = dict(data)
        data.pop("max_lateness_seconds", None)
        lateness = Lateness.from_plain(data.pop("lateness"))
        return cls(**data, lateness=lateness)

    def as_dict(self) -> dict[str, int | float | None]:
        """The counts as a plain dict (for logs, CLI output and metadata)."""
        return {
            **self.counters(),
            "duration_ms": self.duration_ms,
            "max_lateness_seconds": self.max_lateness_seconds,
        }

    def counters(self) -> dict[str, int]:
        """Every counter by its name (log lines, the CLI)."""
        return {name: getattr(self, name) for name in COUNTERS}

    def figures(self) -> dict[str, int]:
        """The counters that are asset metadata, by their metadata name."""
        return {figure: getattr(self, name) for name, figure in FIGURES.items()}


_COUNTER_FIELDS = [f for f in fields(CycleCounts) if f.metadata.get("counter")]
#: Every counter of a cycle, in the record's order.
COUNTERS: tuple[str, ...] = tuple(f.name for f in _COUNTER_FIELDS)
#: Each counter's one-line description (the CLI's help, the metrics' help, docs).
COUNTER_DESCRIPTIONS: dict[str, str] = {f.name: f.metadata["description"] for f in _COUNTER_FIELDS}
#: Counter → its name in a run's asset metadata.
FIGURES: dict[str, str] = {
    f.name: f.metadata["figure"] for f in _COUNTER_FIELDS if f.metadata["figure"]
}
#: The counters the metrics ledger keeps per cycle (a column each in ``dispatch_cycles``).
LEDGER_COUNTERS: tuple[str, ...] = tuple(f.name for f in _COUNTER_FIELDS if f.metadata["ledger"])
#: The ledger counters summed into its totals row (the exporter's Prometheus counters).
TOTALED_COUNTERS: tuple[str, ...] = tuple(f.name for f in _COUNTER_FIELDS if f.metadata["totals"])
