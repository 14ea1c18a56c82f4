"""Support's finder: the reminders of a person, a tenant, an event or a day, newest due first, a
page at a time; the same answer behind ``reminder-pipeline reminders`` and the ``reminder_find``
job.

The filters are checked here, once, for the command line and the run config alike (each bad
value is one line naming it and, for a status or a kind, listing the valid ones). A due bound
given as a day alone is that UTC day: ``due_from`` 2026-12-01 is 2026-12-01T00:00Z, ``due_to``
2026-12-01 takes the whole day (before 2026-12-02T00:00Z); a time is taken as given, ``due_to``
inclusive. Pages are keyset pages: the cursor is the last reminder's (DueAt, ReminderId), opaque
(URL-safe base64), so a page never repeats or skips a row whatever was written meanwhile before
it. The items are the trace's (:func:`.trace.trace_ids`): the same field names and reasons.
"""

from __future__ import annotations

import base64
import binascii
import uuid
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from typing import Any

from sqlalchemy.engine import Engine

from ..config import ConfigError, check_int, parse_as_of
from ..domain.model import EventKind, ReminderStatus, parse_uuid
from ..store import finder as finder_store
from . import trace

#: Reminders per page: by default and at most.
DEFAULT_FIND_LIMIT = 50
MAX_FIND_LIMIT = 1000

STATUSES: tuple[str, ...] = tuple(s.value for s in ReminderStatus)
KINDS: tuple[str, ...] = tuple(k.value for k in EventKind)
_TICK = timedelta(microseconds=1)  # PostgreSQL's resolution: "< t + 1 µs" is "<= t"


def _choice(value: object, name: str, valid: tuple[str, ...], what: str) -> str:
    """``value`` as one of ``valid`` (any case in, the canonical spelling out)."""
    text = str(value).strip()
    for choice in valid:
        if text.lower() == choice.lower():
            return choice
    raise ConfigError(f"{name}={text!r} is not {what} (one of {', '.join(valid)})")


def check_status(value: object, name: str = "status") -> str:
    """A reminder status: Pending, Sent or Skipped."""
    return _choice(value, name, STATUSES, "a reminder status")


def check_kind(value: object, name: str = "kind") -> str:
    """An event Kind the contract names (``EventKind``)."""
    return _choice(value, name, KINDS, "an event kind")


def check_limit(value: object, name: str = "limit") -> int:
    """Reminders per page: 1..MAX_FIND_LIMIT."""
    return check_int(value, name, 1, MAX_FIND_LIMIT)


def check_id(value: object, name: str) -> uuid.UUID:
    """A user, tenant or event id: a UUID."""
    try:
        return parse_uuid(value)
    except ValueError:
        raise ConfigError(f"{name}={str(value)!r} is not an id (a UUID)") from None


def _day(value: object) -> date | None:
    """The day ``value`` names when it is a date alone (2026-12-01), else None."""
    if isinstance(value, datetime):
        return None
    if isinstance(value, date):
        return value
    text = str(value).strip()
    if len(text) != 10:
        return None
    try:
        return date.fromisoformat(text)
    except ValueError:
        return None


def _midnight(day: date) -> datetime:
    return datetime.combine(day, time(0), tzinfo=UTC)


def parse_due_from(value: object, name: str = "due_from") -> datetime:
    """The first instant taken: a day's 00:00Z, or the ISO-8601 time (with a zone) given."""
    day = _day(value)
    if day is not None:
        return _midnight(day)
    return _time(value, name)


def parse_due_to(value: object, name: str = "due_to") -> datetime:
    """The instant the range ends before: the next day's 00:00Z for a day, else just after the
    time given (``due_to`` is inclusive)."""
    day = _day(value)
    if day is not None:
        return _midnight(day + timedelta(days=1))
    return _time(value, name) + _TICK


def _time(value: object, name: str) -> datetime:
    when = parse_as_of(value, name)
    if when is None:
        raise ConfigError(f"{name} is empty (a day, 2026-12-01, or a time, 2026-12-01T10:00:00Z)")
    return when


def encode_cursor(due_at: datetime, reminder_id: uuid.UUID) -> str:
    """The cursor of the page after the reminder (``due_at``, ``reminder_id``): opaque text."""
    raw = f"{due_at.astimezone(UTC).isoformat()}|{reminder_id}".encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(value: object, name: str = "after") -> tuple[datetime, uuid.UUID]:
    """(DueAt, ReminderId) of a cursor :func:`encode_cursor` wrote; else one line naming it."""
    text = str(value).strip()
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)).decode()
        due, reminder_id = raw.split("|")
        when = datetime.fromisoformat(due)
        if when.tzinfo is None:
            raise ValueError(due)
        return when, uuid.UUID(reminder_id)
    except (ValueError, binascii.Error, UnicodeDecodeError):
        shown = text if len(text) <= 80 else f"{text[:77]}..."
        raise ConfigError(
            f"{name}={shown!r} is not a cursor (give the one the previous page printed)"
        ) from None


@dataclass(frozen=True)
class Filters:
    """What the reminders found have in common: every given condition holds (none: all)."""

    owner: uuid.UUID | None = None
    client: uuid.UUID | None = None
    tenant: uuid.UUID | None = None
    event: uuid.UUID | None = None
    statuses: tuple[str, ...] = ()
    kind: str | None = None
    due_from: datetime | None = None
    #: The range ends before this instant (``parse_due_to`` of what the operator gave).
    due_before: datetime | None = None

    def __post_init__(self) -> None:
        if (
            self.due_from is not None
            and self.due_before is not None
            and self.due_from >= self.due_before
        ):
            raise ConfigError(
                f"due_from ({self.due_from.isoformat()}) is not before due_to's end "
                f"({self.due_before.isoformat()}): no reminder could match"
            )

    def described(self) -> dict[str, Any]:
        """The given conditions as text (a log line, an output): ids, statuses, kind, times."""
        given = {
            "owner": self.owner,
            "client": self.client,
            "tenant": self.tenant,
            "event": self.event,
            "status": ",".join(self.statuses) or None,
            "kind": self.kind,
            "due_from": self.due_from,
            "due_before": self.due_before,
        }
        return {
            k: v.isoformat() if isinstance(v, datetime) else str(v)
            for k, v in given.items()
            if v is not None
        }


def find(
    engine: Engine,
    filters: Filters,
    *,
    limit: int = DEFAULT_FIND_LIMIT,
    after: tuple[datetime, uuid.UUID] | None = None,
    ui_url: str,
) -> tuple[list[dict[str, Any]], str | None]:
    """A page of the reminders ``filters`` takes, newest due first, after the cursor ``after``:
    their trace items and the next page's cursor (None on the last page)."""
    params = finder_store.find_params(
        owner=filters.owner,
        client=filters.client,
        tenant=filters.tenant,
        kind=filters.kind,
        event=filters.event,
        statuses=filters.statuses,
        due_from=filters.due_from,
        due_before=filters.due_before,
        after=after,
    )
    with engine.connect() as conn:
        found = finder_store.find_reminder_ids(conn, params, limit + 1)
    page = found[:limit]
    following = encode_cursor(page[-1][1], page[-1][0]) if len(found) > limit else None
    items = trace.trace_ids(engine, [reminder_id for reminder_id, _ in page], ui_url=ui_url)
    return items, following


def short_reason(item: dict[str, Any]) -> str:
    """The first clause of a trace item's reason (what the text line shows)."""
    return str(item.get("reason") or "").split("; ")[0]
