"""``demo``: seed demo events (a development database; needs the migrated schema)."""

from __future__ import annotations

import click

from .context import database
from .exits import EXIT_OK
from .options import env_option, json_option
from .output import print_fields, print_json


@click.command()
@env_option(
    "--overdue",
    type=click.IntRange(0, 10_000),
    default=12,
    envvar="REMINDER_DEMO_OVERDUE",
    help="Demo events whose reminders are already due.",
)
@env_option(
    "--upcoming",
    type=click.IntRange(0, 10_000),
    default=30,
    envvar="REMINDER_DEMO_UPCOMING",
    help="Demo events whose reminders fall due over the next minutes.",
)
@json_option
def demo(overdue: int, upcoming: int, as_json: bool) -> int:
    """Seed demo events (a development database; needs the migrated schema)."""
    from ..local import demo as demo_data

    with database() as engine:
        data = demo_data.seed(engine, overdue=overdue, upcoming=upcoming)
    if as_json:
        print_json(data)
    else:
        print_fields("demo data", data)
    return EXIT_OK
