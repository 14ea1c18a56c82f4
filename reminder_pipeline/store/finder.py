"""Support's finder (``reminder-pipeline reminders``, the ``reminder_find`` job): the ids of the
reminders a filter takes, newest due first, one page at a time.

One statement: the named conditions below, only those given, joined by AND (bind parameters
only, never a value in the text), ``ORDER BY r.due_at DESC, r.id DESC`` and a keyset
``(r.due_at, r.id) < (:after_due, :after_id)``. Each condition is one an index answers
(migration 0007; ``integration/test_finder_plans.py`` holds the plans at 10M reminders):

* no filter, a due range, a status, the page after a cursor: the partial indexes on
  ``(due_at, id)`` read backwards, ``ix_event_reminders_status_due_at`` (Pending) and
  ``ix_event_reminders_settled_due_at`` (Sent, Skipped), merged;
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
#: ``pending`` and ``settled`` are not filters: they say which of the two branches (below) the
#: statement reads, from the statuses asked for.
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
    "pending": "",
    "settled": "",
}
_EVENT_CONDITIONS = ("owner", "client", "tenant", "kind")
_BRANCH_MARKS = ("pending", "settled")
#: A person's events are few (thousands at most): read them first, whatever the planner guesses.
_PERSON_CONDITIONS = frozenset({"owner", "client"})

_SELECT = "SELECT r.id, r.due_at FROM event_reminders r"
_JOIN = " JOIN calendar_events e ON e.id = r.calendar_event_id"
_PERSON = "WITH e AS MATERIALIZED (SELECT e.id FROM calendar_events e WHERE {where}) "
_ORDER = " ORDER BY r.due_at DESC, r.id DESC LIMIT :limit"
#: The two branches: each walks its own partial index on (due_at, id) newest first, so the
#: dispatcher's due query keeps the Pending one to itself (a full index on (due_at, id) tempted
#: the planner into counting passed-over rows on it, reading every settled row due before AsOf).
_PENDING = "r.status = 'Pending'"
_SETTLED = "r.status <> 'Pending'"


def find_statement(given: Sequence[str]) -> str:
    """The finder's statement with the conditions named in ``given`` (keys of CONDITIONS).

    Pending reminders and settled ones (Sent, Skipped) are read in two branches, each newest
    first from its partial index (``ix_event_reminders_status_due_at``,
    ``ix_event_reminders_settled_due_at``), merged and cut to the page; ``pending`` alone or
    ``settled`` alone in ``given`` reads one branch (the statuses asked for need no other).
    With an owner or a client, that person's events are read first (a CTE kept MATERIALIZED):
    for a busy owner the planner otherwise walks the due index newest first, expecting to meet
    their reminders soon, and reads tens of thousands of rows to find a page (1.4 s at 10M
    reminders, against milliseconds this way). A tenant or a kind, shared by many events, is
    checked on each reminder met in due order instead.
    """
    unknown = set(given) - set(CONDITIONS)
    if unknown:
        raise ValueError(f"no finder condition named {sorted(unknown)}")
    names = [name for name in CONDITIONS if name in given and name not in _BRANCH_MARKS]
    on_event = [n for n in names if n in _EVENT_CONDITIONS]
    on_reminder = [CONDITIONS[n] for n in names if n not in _EVENT_CONDITIONS]
    prefix, join = "", ""
    if _PERSON_CONDITIONS & set(on_event):
        prefix = _PERSON.format(where=" AND ".join(CONDITIONS[n] for n in on_event))
        join = " JOIN e ON e.id = r.calendar_event_id"
    elif on_event:
        join = _JOIN
        on_reminder = [CONDITIONS[n] for n in on_event] + on_reminder
    statuses = CONDITIONS["statuses"]
    branches = []
    if "settled" not in given:  # the statuses filter is for the settled branch only
        pending = [_PENDING, *(c for c in on_reminder if c != statuses)]
        branches.append(f"{_SELECT}{join} WHERE {' AND '.join(pending)}{_ORDER}")
    if "pending" not in given:
        settled = [_SETTLED, *on_reminder]
        branches.append(f"{_SELECT}{join} WHERE {' AND '.join(settled)}{_ORDER}")
    if len(branches) == 1:
        return f"{prefix}{branches[0]}"
    merged = " UNION ALL ".join(f"({branch})" for branch in branches)
    page = f"SELECT id, due_at FROM ({merged}) AS page ORDER BY due_at DESC, id DESC LIMIT :limit"
    return f"{prefix}{page}"


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
    asked = set(statuses)
    settled = sorted(asked - {"Pending"})
    params: dict[str, Any] = {
        "owner": owner,
        "client": client,
        "tenant": tenant,
        "kind": kind,
        "event": event,
        # Only a part of the settled statuses needs a filter; the branch says the rest.
        "statuses": settled if settled and set(settled) != {"Sent", "Skipped"} else None,
        "due_from": due_from,
        "due_before": due_before,
        "pending": True if asked and not settled else None,
        "settled": True if asked and "Pending" not in asked else None,
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
    values = {k: v for k, v in params.items() if k not in ("after", *_BRANCH_MARKS)}
    rows = conn.execute(text(find_statement(given)), {**values, "limit": limit})
    return [(row.id, row.due_at) for row in rows]
