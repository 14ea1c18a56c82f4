"""``dlq list|replay``: the consumer's dead letters, with why and whence; sent back when fixed."""

from __future__ import annotations

import click

from .context import broker_settings, operator_name
from .exits import EXIT_FAILURE, EXIT_OK
from .options import json_option
from .output import print_error, print_json, print_table

#: The text table of ``dlq list`` (``--json`` has every field).
LIST_COLUMNS = (
    "position",
    "topic",
    "partition",
    "offset",
    "key",
    "reason",
    "attempts",
    "size",
    "truncated",
    "replayed_at",
    "replay_of",
)


@click.group()
def dlq() -> None:
    """The notifications consumer's dead letters: list them, replay them once the cause is fixed."""


@dlq.command("list")
@json_option
def dlq_list(as_json: bool) -> int:
    """Every dead letter: its position, the original's topic/partition/offset/key, the reason,
    attempts, size, whether it was cut to fit, when it was last replayed and, for the dead
    letter of a replay, which dead letter it replayed (never the value)."""
    from ..operator_jobs.dead_letters import list_letters

    letters = list_letters(broker_settings(start=False))
    if as_json:
        print_json({"dead_letters": letters})
    else:
        rows = [{**d, "position": f"{d['dlq_partition']}:{d['dlq_offset']}"} for d in letters]
        print_table(
            rows,
            LIST_COLUMNS,
            empty="no dead letters",
        )
    return EXIT_OK


def _check_position(_ctx: click.Context, _param: click.Parameter, value: str | None) -> str | None:
    from ..operator_jobs.dead_letters import parse_position

    if value is not None:
        try:
            parse_position(value)
        except ValueError as error:
            raise click.BadParameter(str(error)) from None
    return value


@dlq.command("replay")
@click.argument("position", required=False, callback=_check_position, metavar="[PARTITION:OFFSET]")
@click.option("--all", "replay_all", is_flag=True, default=False, help="Every dead letter.")
@click.option(
    "--dry-run", is_flag=True, default=False, help="Print what would be replayed; send nothing."
)
@click.option(
    "--yes",
    is_flag=True,
    default=False,
    help="Confirm replaying --all. No environment variable: it must be typed each time.",
)
@json_option
def dlq_replay(
    position: str | None, replay_all: bool, dry_run: bool, yes: bool, as_json: bool
) -> int:
    """Put dead letters' original key, value and headers back on the contract's topic, marked
    with a replay-of-dlq header (logged with your OS user); a copy cut to fit is refused.

    --all sends each dead letter once: it leaves out those already replayed and the dead letters
    of replays (named by their position, they are sent again). Exit 0 when everything that can
    go went out (what --all left out is listed); 1 when the dead letter named cannot be replayed.
    """
    from ..operator_jobs.dead_letters import NoSuchDeadLetter, replay

    if (position is None) == (not replay_all):
        raise click.UsageError("name one dead letter as PARTITION:OFFSET, or give --all")
    if replay_all and not dry_run and not yes:
        raise click.UsageError("dlq replay --all sends every dead letter back: add --yes")
    try:
        done = replay(broker_settings(), position, actor=operator_name(), dry_run=dry_run)
    except NoSuchDeadLetter as error:
        print_error(f"dlq replay: {error}")
        return EXIT_FAILURE
    if as_json:
        print_json(done.plain())
    else:
        verb = "would replay" if dry_run else "replayed"
        count = len(done.replay) if dry_run else done.replayed
        positions = " ".join(letter.position for letter in done.replay)
        print(f"dlq replay: {verb} {count} ({positions or 'none'})", flush=True)
        if replay_all:  # the rest of --all's answer: what it left out, and why
            for _letter, why in [*done.skipped, *done.refused]:
                print(f"dlq replay: left out: {why}", flush=True)
    if replay_all:
        return EXIT_OK
    for _letter, why in done.refused:
        print_error(f"dlq replay: {why}")
    return EXIT_FAILURE if done.refused else EXIT_OK
