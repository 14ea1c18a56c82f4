"""``forecast``: due reminders per coming minute, the busiest ones, and one run's capacity."""

from __future__ import annotations

from typing import Any

import click

from .context import database
from .exits import EXIT_OK
from .options import IntRange, env_option, json_option
from .output import print_json, print_table


@click.command("forecast")
@env_option(
    "--hours",
    type=IntRange(1, 168),
    default=24,
    envvar="REMINDER_FORECAST_HOURS",
    help="How far ahead, 1..168 hours.",
)
@json_option
def forecast_command(hours: int, as_json: bool) -> int:
    """Due reminders per minute over the coming hours (the partial Pending index, the database's
    clock), the busiest minutes, and what one run moves within its budget at the measured rate."""
    from ..observability.forecast import forecast as read_forecast

    with database(start=False) as engine:
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
    print_timeline(data["minutes"], data["busiest"])
    return EXIT_OK


#: The coming minutes ``forecast``'s text lists first (the busiest ones are always listed).
COMING = 15
COLUMNS = ("coming minute (UTC)", "due", "busiest")


def print_timeline(minutes: list[dict[str, Any]], busiest: list[dict[str, Any]]) -> None:
    """The coming minutes with reminders due, in time order: the next :data:`COMING` and every
    busiest one (marked ``peak``, ``#2``, ...); a ``...`` row stands for the minutes between."""
    if not minutes:
        print("nothing due in the window", flush=True)
        return
    rank = {row["minute"]: ("peak" if i == 0 else f"#{i + 1}") for i, row in enumerate(busiest)}
    shown = [i for i, row in enumerate(minutes) if i < COMING or row["minute"] in rank]
    rows: list[dict[str, Any]] = []
    for before, index in zip([-1, *shown], shown, strict=False):
        between = minutes[before + 1 : index]
        if between:
            rows.append(_gap(between))
        row = minutes[index]
        rows.append(
            {
                COLUMNS[0]: row["minute"],
                COLUMNS[1]: row["due"],
                COLUMNS[2]: rank.get(row["minute"], ""),
            }
        )
    after = minutes[shown[-1] + 1 :]
    if after:
        rows.append(_gap(after))
    print_table(rows, COLUMNS, empty="nothing due in the window")
    if len(shown) < len(minutes):
        print("(--json lists every minute)", flush=True)


def _gap(left_out: list[dict[str, Any]]) -> dict[str, Any]:
    """The row standing for minutes not listed: how many, and what falls due in them."""
    count = len(left_out)
    return {
        COLUMNS[0]: f"... {count} more minute{'s' if count > 1 else ''}",
        COLUMNS[1]: sum(row["due"] for row in left_out),
        COLUMNS[2]: "",
    }
