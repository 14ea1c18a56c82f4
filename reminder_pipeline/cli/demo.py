"""``demo``: seed demo events, cancel or move one (the embedded development database only)."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import click

from ..config import ConfigError
from .context import database, load_settings
from .exits import EXIT_OK
from .options import EVENT_ID_TYPE, IntRange, env_option, json_option
from .output import print_json

#: The most demo events one ``demo`` seeds of each kind, and the farthest ``demo move`` moves an
#: event (minutes, either way): a demo's bounds, not the dispatcher's batch bounds (config.py).
MAX_DEMO_EVENTS = 10_000
MAX_MOVE_MINUTES = 10_000


@click.group(invoke_without_command=True)
@env_option(
    "--overdue",
    type=IntRange(0, MAX_DEMO_EVENTS),
    default=None,
    envvar="REMINDER_DEMO_OVERDUE",
    show_default="0",
    help="Events whose reminders fell due up to 5 minutes ago: a catch-up to watch (the next "
    "cycle sends them late, and lateness_slo rightly reports it for 15 minutes).",
)
@env_option(
    "--upcoming",
    type=IntRange(0, MAX_DEMO_EVENTS),
    default=None,
    envvar="REMINDER_DEMO_UPCOMING",
    show_default="given neither option: a few due now and five minutes' worth upcoming",
    help="Events whose reminders fall due from a minute on, six a minute.",
)
@json_option
@click.pass_context
def demo(
    ctx: click.Context, overdue: int | None, upcoming: int | None, as_json: bool
) -> int | None:
    """Seed demo events, or cancel / move one (the embedded development database only).

    Alone, it seeds a few events due now and five minutes' worth falling due six a minute from
    a minute on; given --overdue or --upcoming, exactly those. It prints what it made, per kind.
    """
    _require_development_database()
    if ctx.invoked_subcommand is not None:
        return None
    from ..local import demo as demo_data

    asked = overdue is not None or upcoming is not None
    with database() as engine:
        made = demo_data.seed(engine, **demo_data.seed_plan(overdue, upcoming))
    if as_json:
        print_json(made)
    else:
        _print_made(made, asked)
    return EXIT_OK


def _print_made(made: dict[str, Any], asked: bool) -> None:
    """What ``demo`` made, one line per kind, and why a kind was made unasked."""
    from ..local.demo import SEED_KINDS

    why = "" if asked else " (demo alone: the default calendar; --overdue N for a catch-up)"
    print(
        f"demo made {made['events']} events{why}: {made['cancelled']} cancelled and "
        f"{made['completed']} completed at once, as people do (their reminders Skipped)",
        flush=True,
    )
    for kind, counts in made["kinds"].items():
        if counts["events"]:
            print(
                f"  {kind:<9}{counts['events']:>6} events, {counts['pending_reminders']} "
                f"reminders Pending, {SEED_KINDS[kind]}",
                flush=True,
            )


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
    type=IntRange(-MAX_MOVE_MINUTES, MAX_MOVE_MINUTES),
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
