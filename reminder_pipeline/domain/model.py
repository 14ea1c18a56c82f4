"""Statuses and the plain records that move between the steps of a dispatch cycle."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any


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


@dataclass(frozen=True)
class DueReminder:
    """A due reminder row joined with the fields of its event the payload needs (no PII).

    Ids are the canonical text of the database's uuid values (lower-case, hyphenated), as the
    payload carries them.
    """

    reminder_id: str
    event_id: str
    tenant_id: str
    owner_user_id: str
    client_user_id: str | None
    appointment_id: str | None
    kind: str
    event_status: str
    start_at: datetime
    time_zone: str
    offset_minutes: int
    due_at: datetime
    attempts: int = 0


class Action(StrEnum):
    """What the dispatcher does with one due row."""

    SEND = "send"
    SKIP = "skip"


@dataclass(frozen=True)
class Decision:
    """The outcome for one due row: send it, or skip it without publishing."""

    reminder: DueReminder
    action: Action

    @property
    def target_status(self) -> ReminderStatus:
        """The terminal status the row moves to."""
        return ReminderStatus.SENT if self.action is Action.SEND else ReminderStatus.SKIPPED


@dataclass(frozen=True)
class OutboxMessage:
    """What goes into the outbox for one Sent row: key (= EventId), contract payload, headers."""

    message_key: str
    payload: dict[str, Any]
    headers: dict[str, str]


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


@dataclass
class CycleCounts:
    """The design's cycle result plus what operators need to see; merged across batches."""

    selected: int = 0
    sent: int = 0
    skipped: int = 0
    skipped_locked: int = 0
    failed: int = 0
    published: int = 0
    publish_failed: int = 0
    batches: int = 0
    #: Reminders sent with the fallback zone (their event's TimeZone was not a canonical IANA name).
    time_zone_fallbacks: int = 0
    duration_ms: int = 0
    max_lateness_seconds: float | None = None
    #: SentAt - DueAt of every row sent, for the lateness histogram (the SLO); floats only, so
    #: a long drain keeps no per-row objects for the garbage collector to walk.
    lateness_seconds: list[float] = field(default_factory=list, repr=False)

    def add(self, other: CycleCounts) -> None:
        """Accumulate another batch's counts into this one (durations are set by the caller)."""
        self.selected += other.selected
        self.sent += other.sent
        self.skipped += other.skipped
        self.skipped_locked += other.skipped_locked
        self.failed += other.failed
        self.published += other.published
        self.publish_failed += other.publish_failed
        self.batches += other.batches
        self.time_zone_fallbacks += other.time_zone_fallbacks
        if other.max_lateness_seconds is not None:
            self.max_lateness_seconds = max(
                self.max_lateness_seconds or other.max_lateness_seconds, other.max_lateness_seconds
            )
        self.lateness_seconds.extend(other.lateness_seconds)

    def as_dict(self) -> dict[str, int | float | None]:
        """The counts as a plain dict (for logs, CLI output and metadata)."""
        return {
            "sent": self.sent,
            "skipped": self.skipped,
            "skipped_locked": self.skipped_locked,
            "failed": self.failed,
            "published": self.published,
            "publish_failed": self.publish_failed,
            "selected": self.selected,
            "batches": self.batches,
            "time_zone_fallbacks": self.time_zone_fallbacks,
            "duration_ms": self.duration_ms,
            "max_lateness_seconds": self.max_lateness_seconds,
        }
