"""Support's finder: the reminders of a person, a tenant, an event or a day, newest due first, a
page at a time; the same answer behind ``reminder-pipeline reminders`` and the ``reminder_find``
job.

The filters are checked here, once, for the command line and the run config alike (each bad
value is one line naming it and, for a status or a kind, listing the valid ones). A due bound
given as a day alone is that UTC day: ``due_from`` 2026-12-01 is 2026-12-01T00:00Z, ``due_to``
2026-12-01 takes the whole day (before 2026-12-02T00:00Z); a time is taken as given, ``due_to``
inclusive (``config.parse_range_start`` / ``parse_range_end``). Pages are keyset pages: the
cursor is the last reminder's (DueAt, ReminderId) with a check of the search it belongs to,
opaque (URL-safe base64), so a page never repeats or skips a row whatever was written meanwhile
before it, and a cursor of another search is refused. The items are the trace's
(:func:`.trace.trace_ids`): the same field names and reasons.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy.engine import Engine

from ..config import ConfigError, check_int, parse_range_end, parse_range_start
from ..domain.model import EventKind, ReminderStatus, parse_uuid
from ..store import finder as finder_store
from . import trace

#: Reminders per page: by default and at most.
DEFAULT_FIND_LIMIT = 50
MAX_FIND_LIMIT = 1000

STATUSES: tuple[str, ...] = tuple(s.value for s in ReminderStatus)
KINDS: tuple[str, ...] = tuple(k.value for k in EventKind)


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


def due_range(
    due_from: object | None,
    due_to: object | None,
    names: tuple[str, str] = ("due_from", "due_to"),
) -> tuple[datetime | None, datetime | None]:
    """The due range as the finder takes it, (first instant, the instant it ends before), from
    the bounds as given (``names``: the options or fields they were given as). A day alone is
    that UTC day; a ``due_to`` past the last instant is no bound; a ``due_from`` after the
    ``due_to`` is refused naming both as given (no reminder could match)."""
    start = None if due_from is None else parse_range_start(due_from, names[0])
    end = None if due_to is None else parse_range_end(due_to, names[1])
    if start is not None and end is not None and start >= end:
        raise ConfigError(
            f"{names[0]}={str(due_from).strip()!r} is after {names[1]}="
            f"{str(due_to).strip()!r}: no reminder could match"
        )
    return start, end


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
    #: The range ends before this instant (:func:`due_range` of what the operator gave).
    due_before: datetime | None = None

    def search(self) -> bytes:
        """The search these filters make, as canonical bytes: the same for every spelling of it
        (statuses in any order, a bound in any zone), different for any other search."""
        given = {
            "owner": self.owner,
            "client": self.client,
            "tenant": self.tenant,
            "event": self.event,
            "statuses": sorted(set(self.statuses)),
            "kind": self.kind,
            "due_from": self.due_from,
            "due_before": self.due_before,
        }
        plain = {
            k: v.astimezone(UTC).isoformat()
            if isinstance(v, datetime)
            else v
            if isinstance(v, list) or v is None
            else str(v)
            for k, v in given.items()
        }
        return json.dumps(plain, sort_keys=True).encode()


# --- cursors: a page's position, tied to its search ----------------------------------------------
# A cursor is URL-safe base64 of "<DueAt in UTC>|<ReminderId>|<check>", the check the first 16
# hex digits of SHA-256 over a label, the search (Filters.search) and the position. A cursor of
# another search, edited by hand or made from a position alone carries no matching check and is
# refused; the check is not a secret (whoever computes it names a position of the same search,
# which --due-to names anyway), it stops a mistake from reading as "no reminder matches".
_CURSOR_LABEL = b"reminder-pipeline reminders cursor 1\0"
_CHECK_DIGITS = 16


def _check(filters: Filters, position: str) -> str:
    digest = hashlib.sha256(_CURSOR_LABEL + filters.search() + b"\0" + position.encode())
    return digest.hexdigest()[:_CHECK_DIGITS]


def encode_cursor(filters: Filters, due_at: datetime, reminder_id: uuid.UUID) -> str:
    """The cursor of the page of ``filters``' search after the reminder (``due_at``,
    ``reminder_id``): opaque text."""
    position = f"{due_at.astimezone(UTC).isoformat()}|{reminder_id}"
    raw = f"{position}|{_check(filters, position)}".encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _shown(text: str) -> str:
    return text if len(text) <= 80 else f"{text[:77]}..."


def _cursor_parts(value: object, name: str) -> tuple[str, datetime, uuid.UUID, str]:
    """(position, DueAt, ReminderId, check) of a cursor's text; else one line naming it."""
    text = str(value).strip()
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)).decode()
        due, reminder_id, check = raw.split("|")
        when = datetime.fromisoformat(due)
        if when.tzinfo is None or len(check) != _CHECK_DIGITS:
            raise ValueError(due)
        return f"{due}|{reminder_id}", when, uuid.UUID(reminder_id), check
    except (ValueError, binascii.Error, UnicodeDecodeError):
        raise ConfigError(
            f"{name}={_shown(text)!r} is not a cursor (give the one the previous page printed)"
        ) from None


def check_cursor_form(value: object, name: str = "after") -> str:
    """A cursor's text when it has a cursor's form (whose search it belongs to is
    :func:`decode_cursor`'s, once the filters are known)."""
    _cursor_parts(value, name)
    return str(value).strip()


def decode_cursor(
    value: object, filters: Filters, name: str = "after"
) -> tuple[datetime, uuid.UUID]:
    """(DueAt, ReminderId) of a cursor a page of this very search printed; else one line naming
    it (another search's, or edited by hand)."""
    position, when, reminder_id, check = _cursor_parts(value, name)
    if not hmac.compare_digest(check, _check(filters, position)):
        raise ConfigError(
            f"{name}={_shown(str(value).strip())!r} is not a cursor of this search (another "
            "search printed it, or it was edited): give the one the previous page printed, "
            "with the same filters"
        )
    return when, reminder_id


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
    following = encode_cursor(filters, page[-1][1], page[-1][0]) if len(found) > limit else None
    items = trace.trace_ids(engine, [reminder_id for reminder_id, _ in page], ui_url=ui_url)
    return items, following


def short_reason(item: dict[str, Any]) -> str:
    """The first clause of a trace item's reason (what the text line shows)."""
    return str(item.get("reason") or "").split("; ")[0]
