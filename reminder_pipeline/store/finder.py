"""Support's finder (``reminder-pipeline reminders``, the ``reminder_find`` job): the ids of the
reminders a filter takes, newest due first, one page at a time.

One statement: the named conditions below, only those given, joined by AND (bind parameters
only, never a value in the text), ``ORDER BY r.due_at DESC, r.id DESC`` and a keyset
``(r.due_at, r.id) < (:after_due, :after_id)``. Each condition is one an index answers
(migration 0007; ``integration/test_finder_plans.py`` holds the plans at 10M reminders):

* no filter, a due range, a status, the page after a cursor: ``ix_event_reminders_due_at_id``
  read backwards (Pending alone: the partial ``ix_event_reminders_status_due_at``);
* ``--event``: ``ix_event_reminders_calendar_event_id``;
* ``--owner`` / ``--client``: ``ix_calendar_events_owner_user_id`` / ``_client_user_id``, then
  each of the person's events' reminders by ``ix_event_reminders_calendar_event_id``;
* ``--tenant`` / ``--kind`` (many events each): the due index read backwards, each reminder's
  event by its primary key, until a page is full.

``calendar_events`` is joined only when a condition is on it (the foreign key guarantees every
reminder an event). Ids, times and statuses only: no title, description or location.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import text
from sqlalchemy.engine import Connection

#: Each filter's condition, by its parameter's name; ``e.`` conditions need the event.
CONDITIONS: Mapping[str, str] = {
    "owner": "e.owner_user_id = CAST(:owner AS uuid)",
    "client": "e.client_user_id = CAST(:client AS uuid)",
    "tenant": "e.tenant_id = CAST(:tenant AS uuid)",
    "kind": "e.kind = CAST(:kind AS text)",
    "event": "r.calendar_event_id = CAST(:event AS uuid)",
    "statuses": "r.status = ANY(CAST(:statuses AS text[]))",
    "due_from": "r.due_at >= CAST(:due_from AS timestamptz)",
    "due_before": "r.due_at < CAST(:due_before AS timestamptz)",
    "after": "(r.due_at, r.id) < (CAST(:after_due AS timestamptz), CAST(:after_id AS uuid))",
}
_EVENT_CONDITIONS = ("owner", "client", "tenant", "kind")
#: A person's events are few (thousands at most): read them first, whatever the planner guesses.
_PERSON_CONDITIONS = frozenset({"owner", "client"})

_SELECT = "SELECT r.id, r.due_at FROM event_reminders r"
_JOIN = " JOIN calendar_events e ON e.id = r.calendar_event_id"
_PERSON = "WITH e AS MATERIALIZED (SELECT e.id FROM calendar_events e WHERE {where}) "
_ORDER = " ORDER BY r.due_at DESC, r.id DESC LIMIT :limit"


def find_statement(given: Sequence[str]) -> str:
    """The finder's statement with the conditions named in ``given`` (keys of CONDITIONS).

    With an owner or a client, that person's events are read first (a CTE kept MATERIALIZED):
    for a busy owner the planner otherwise walks the due index newest first, expecting to meet
    their reminders soon, and reads tens of thousands of rows to find a page (1.4 s at 10M
    reminders, against milliseconds this way). A tenant or a kind, shared by many events, is
    checked on each reminder met in due order instead.
    """
    unknown = set(given) - set(CONDITIONS)
    if unknown:
        raise ValueError(f"no finder condition named {sorted(unknown)}")
    names = [name for name in CONDITIONS if name in given]
    on_event = [n for n in names if n in _EVENT_CONDITIONS]
    on_reminder = [CONDITIONS[n] for n in names if n not in _EVENT_CONDITIONS]
    prefix, join = "", ""
    if _PERSON_CONDITIONS & set(on_event):
        prefix = _PERSON.format(where=" AND ".join(CONDITIONS[n] for n in on_event))
        join = " JOIN e ON e.id = r.calendar_event_id"
    elif on_event:
        join = _JOIN
        on_reminder = [CONDITIONS[n] for n in on_event] + on_reminder
    where = " WHERE " + " AND ".join(on_reminder) if on_reminder else ""
    return f"{prefix}{_SELECT}{join}{where}{_ORDER}"


def find_params(
    *,
    owner: uuid.UUID | None = None,
    client: uuid.UUID | None = None,
    tenant: uuid.UUID | None = None,
    kind: str | None = None,
    event: uuid.UUID | None = None,
    statuses: Sequence[str] = (),
    due_from: datetime | None = None,
    due_before: datetime | None = None,
    after: tuple[datetime, uuid.UUID] | None = None,
) -> dict[str, Any]:
    """The given filters as the statement's parameters (a key per condition to apply)."""
    params: dict[str, Any] = {
        "owner": owner,
        "client": client,
        "tenant": tenant,
        "kind": kind,
        "event": event,
        "statuses": list(statuses) or None,
        "due_from": due_from,
        "due_before": due_before,
    }
    params = {k: v for k, v in params.items() if v is not None}
    if after is not None:
        params.update(after=True, after_due=after[0], after_id=after[1])
    return params


def find_reminder_ids(
    conn: Connection, params: Mapping[str, Any], limit: int
) -> list[tuple[uuid.UUID, datetime]]:
    """(id, due_at) of up to ``limit`` reminders the filters take, newest due first."""
    given = [name for name in CONDITIONS if name in params]
    values = {k: v for k, v in params.items() if k != "after"}
    rows = conn.execute(text(find_statement(given)), {**values, "limit": limit})
    return [(row.id, row.due_at) for row in rows]
