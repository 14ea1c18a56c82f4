"""``reminders``: find reminders by who and when (owner, client, tenant, event, status, kind, due
range), newest due first, a page at a time; each line a reminder's ids, kind, due, status, whose
it is (owner, client and tenant ids) and why (the trace's reason, its first clause)."""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from typing import Any

import click

from .context import database, load_settings
from .exits import EXIT_OK
from .options import json_option
from .output import command_as_started, print_json, print_table

_COLUMNS = (
    "reminder_id",
    "event_id",
    "kind",
    "due_at",
    "status",
    "owner_user_id",
    "client_user_id",
    "tenant_id",
    "reason",
)


def _hint(options: Sequence[tuple[str, str]], cursor: str) -> str:
    """The next page's command, runnable as printed: the same filters and ``--after``."""
    words = [f"{name} {shlex.quote(value)}" for name, value in options]
    return " ".join([f"next page: {command_as_started()}", "reminders", *words, "--after", cursor])


@click.command("reminders")
@click.option("--owner", metavar="USER_ID", default=None, help="Reminders of this owner's events.")
@click.option(
    "--client", metavar="USER_ID", default=None, help="Reminders of events with this client."
)
@click.option("--tenant", metavar="TENANT_ID", default=None, help="Reminders of this tenant.")
@click.option("--event", metavar="EVENT_ID", default=None, help="Reminders of this event.")
@click.option(
    "--status",
    "statuses",
    metavar="STATUS",
    multiple=True,
    help="Pending, Sent or Skipped (repeat it for several; any case).",
)
@click.option(
    "--kind",
    metavar="KIND",
    default=None,
    help="The event's Kind: Showing, Consultation, Meeting, Task or BookingDeadline (any case).",
)
@click.option(
    "--due-from",
    metavar="ISO-8601",
    default=None,
    help="Due at or after: a time with a zone, or a day alone (its 00:00 UTC).",
)
@click.option(
    "--due-to",
    metavar="ISO-8601",
    default=None,
    help="Due at or before: a time with a zone, or a day alone (the whole UTC day).",
)
@click.option(
    "--limit", metavar="N", default=None, help="Reminders per page, 1..1,000 (default 50)."
)
@click.option(
    "--after",
    metavar="CURSOR",
    default=None,
    help="The page after this cursor (the previous page prints it at its end).",
)
@json_option
def reminders(
    owner: str | None,
    client: str | None,
    tenant: str | None,
    event: str | None,
    statuses: tuple[str, ...],
    kind: str | None,
    due_from: str | None,
    due_to: str | None,
    limit: str | None,
    after: str | None,
    as_json: bool,
) -> int:
    """Find reminders by who and when, newest due first (DueAt, then ReminderId, descending).

    Every filter given holds; none given lists every reminder. A day alone is that UTC day:
    --due-from 2026-12-01 starts at 2026-12-01T00:00Z, --due-to 2026-12-01 takes the whole day
    (up to 2026-12-02T00:00Z, excluded). One line per reminder: ReminderId, EventId, Kind, DueAt,
    status, the owner's, client's and tenant's ids and why (the first clause of `trace`'s
    reason); then, when more match, the command of the next page (--after CURSOR), whose cursor
    only this search takes. --json: {"reminders": [trace items], "next": CURSOR|null}.
    """
    from ..operator_jobs import finder

    options = [
        ("--owner", owner),
        ("--client", client),
        ("--tenant", tenant),
        ("--event", event),
        *(("--status", s) for s in statuses),
        ("--kind", kind),
        ("--due-from", due_from),
        ("--due-to", due_to),
        ("--limit", limit),
    ]
    given = [(name, value) for name, value in options if value is not None]
    due_start, due_end = finder.due_range(due_from, due_to, ("--due-from", "--due-to"))
    filters = finder.Filters(
        owner=None if owner is None else finder.check_id(owner, "--owner"),
        client=None if client is None else finder.check_id(client, "--client"),
        tenant=None if tenant is None else finder.check_id(tenant, "--tenant"),
        event=None if event is None else finder.check_id(event, "--event"),
        statuses=tuple(dict.fromkeys(finder.check_status(s, "--status") for s in statuses)),
        kind=None if kind is None else finder.check_kind(kind, "--kind"),
        due_from=due_start,
        due_before=due_end,
    )
    page_size = finder.DEFAULT_FIND_LIMIT if limit is None else finder.check_limit(limit, "--limit")
    cursor = None if after is None else finder.decode_cursor(after, filters, "--after")
    ui_url = load_settings().dagster_ui_url
    with database(start=False) as engine:
        items, following = finder.find(
            engine, filters, limit=page_size, after=cursor, ui_url=ui_url
        )
    if as_json:
        print_json({"reminders": items, "next": following})
        return EXIT_OK
    rows: list[dict[str, Any]] = [
        {**{name: item.get(name) for name in _COLUMNS}, "reason": finder.short_reason(item)}
        for item in items
    ]
    print_table(rows, _COLUMNS, empty="no reminder matches")
    if following is not None:
        print(_hint(given, following))
    print(end="", flush=True)
    return EXIT_OK
