"""``forecast``: due reminders per coming minute, the busiest ones, and one run's capacity."""

from __future__ import annotations

import click

from .context import database
from .exits import EXIT_OK
from .options import env_option, json_option
from .output import print_json, print_table


@click.command("forecast")
@env_option(
    "--hours",
    type=click.IntRange(1, 168),
    default=24,
    envvar="REMINDER_FORECAST_HOURS",
    help="How far ahead, 1..168 hours.",
)
@json_option
def forecast(hours: int, as_json: bool) -> int:
    """Due reminders per minute over the coming hours (the partial Pending index, the database's
    clock), the busiest minutes, and what one run moves within its budget at the measured rate."""
    from ..observability.forecast import forecast as read_forecast

    with database() as engine:
        ahead = read_forecast(engine, hours)
    data = ahead.plain()
    if as_json:
        print_json(data)
        return EXIT_OK
    source = (
        f"measured over {data['drain_cycles']} cycles of the last 7 days"
        if data["drain_source"] == "ledger"
        else "assumed: no drain in the ledger yet"
    )
    peak = data["peak"]
    print(
        f"forecast from {data['as_of']} for {hours} h: {data['total_due']} due; "
        f"peak {peak['due']} at {peak['minute'] or '-'}",
        flush=True,
    )
    print(
        f"one run moves {data['capacity_per_run']} in {data['budget_seconds']:g} s at "
        f"{data['drain_rows_per_second']:g} rows/s ({source})",
        flush=True,
    )
    over = data["over_capacity"]
    if over:
        print(
            f"WARNING: {len(over)} minute(s) hold more than one run moves; the first "
            f"{over[0]['minute']} ({over[0]['due']} due)",
            flush=True,
        )
    print_table(data["busiest"], ("minute", "due"), empty="nothing due in the window")
    return EXIT_OK
