"""``demo``: seed demo events, cancel or move one (the embedded development database only)."""

from __future__ import annotations

import uuid
from datetime import timedelta

import click

from ..config import ConfigError
from .context import database, load_settings
from .exits import EXIT_OK
from .options import EVENT_ID_TYPE, env_option, json_option
from .output import print_fields, print_json

#: The most demo events one ``demo`` seeds of each kind, and the farthest ``demo move`` moves an
#: event (minutes, either way): a demo's bounds, not the dispatcher's batch bounds (config.py).
MAX_DEMO_EVENTS = 10_000
MAX_MOVE_MINUTES = 10_000


@click.group(invoke_without_command=True)
@env_option(
    "--overdue",
    type=click.IntRange(0, MAX_DEMO_EVENTS),
    default=0,
    envvar="REMINDER_DEMO_OVERDUE",
    help="Also events whose reminders fell due up to 5 minutes ago: a catch-up to watch (the "
    "next cycle sends them late, and lateness_slo rightly reports it for 15 minutes).",
)
@env_option(
    "--upcoming",
    type=click.IntRange(0, MAX_DEMO_EVENTS),
    default=30,
    envvar="REMINDER_DEMO_UPCOMING",
    help="Demo events whose reminders fall due from a minute on, six a minute.",
)
@json_option
@click.pass_context
def demo(ctx: click.Context, overdue: int, upcoming: int, as_json: bool) -> int | None:
    """Seed demo events, or cancel / move one (the embedded development database only)."""
    _require_development_database()
    if ctx.invoked_subcommand is not None:
        return None
    from ..local import demo as demo_data

    with database() as engine:
        data = demo_data.seed(engine, overdue=overdue, upcoming=upcoming)
    if as_json:
        print_json(data)
    else:
        print_fields("demo data", data)
    return EXIT_OK


def _as_json() -> bool:
    """Whether ``demo --json`` (or REMINDER_JSON) asked a subcommand for JSON."""
    parent = click.get_current_context().parent
    return bool(parent is not None and parent.params.get("as_json"))


def _require_development_database() -> None:
    """Refuse, in one line, any database but the embedded one ``up`` and ``services`` start."""
    from ..local.endpoints import require_embedded

    require_embedded()
    if load_settings().database_url is not None:
        raise ConfigError("demo changes only the embedded development database: unset DATABASE_URL")


@demo.command("cancel")
@click.argument("event_id", type=EVENT_ID_TYPE)
def demo_cancel(event_id: uuid.UUID) -> int:
    """Cancel an event as the calendar does: its Pending reminders go Skipped."""
    from ..local.calendar import CalendarError, cancel_event

    with database() as engine:
        try:
            skipped = cancel_event(engine, event_id)
        except CalendarError as error:  # an unknown id: one line, exit 1
            raise click.ClickException(str(error)) from None
    if _as_json():
        print_json({"event_id": str(event_id), "cancelled": True, "skipped": skipped})
    else:
        print(f"event {event_id} cancelled: {skipped} pending reminder(s) skipped", flush=True)
    return EXIT_OK


@demo.command("move")
@click.argument("event_id", type=EVENT_ID_TYPE)
@env_option(
    "--minutes",
    type=click.IntRange(-MAX_MOVE_MINUTES, MAX_MOVE_MINUTES),
    required=True,
    envvar="REMINDER_DEMO_MOVE_MINUTES",
    help="How far to move the event's start (negative: earlier).",
)
def demo_move(event_id: uuid.UUID, minutes: int) -> int:
    """Move an event as the calendar does: its Pending reminders are re-materialised."""
    from ..local.calendar import CalendarError, move_event_by

    with database() as engine:
        try:
            created = move_event_by(engine, event_id, timedelta(minutes=minutes))
        except CalendarError as error:
            raise click.ClickException(str(error)) from None
    if _as_json():
        print_json(
            {
                "event_id": str(event_id),
                "minutes": minutes,
                "reminders": [str(reminder_id) for reminder_id in created],
            }
        )
    else:
        print(
            f"event {event_id} moved by {minutes} min: {len(created)} reminder(s) re-materialised",
            flush=True,
        )
    return EXIT_OK
