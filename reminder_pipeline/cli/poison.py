"""``poison list|retry|skip``: rows that keep failing (retry and skip logged with the OS user)."""

from __future__ import annotations

import uuid

import click

from ..config import DEFAULT_POISON_LIMIT
from .context import database, operator_name
from .exits import EXIT_FAILURE, EXIT_OK
from .options import POISON_LIMIT, env_option, force_option, json_option, reminder_id_argument
from .output import print_error, print_json, print_table


@click.group()
def poison() -> None:
    """Rows that keep failing: list them, retry one now, or skip one for good."""


@poison.command("list")
@env_option(
    "--limit",
    type=POISON_LIMIT,
    default=DEFAULT_POISON_LIMIT,
    envvar="REMINDER_POISON_LIMIT",
    help="Rows listed at most, 1..1,000.",
)
@json_option
def poison_list(limit: int, as_json: bool) -> int:
    """Pending rows with failed attempts, oldest due first, with their last error."""
    from ..operator_jobs import poison as poison_rows

    with database() as engine:
        rows = poison_rows.list_rows(engine, limit)
    if as_json:
        print_json(rows)
    else:
        print_table(
            rows,
            ("id", "attempts", "next_attempt_at", "due_at", "last_error"),
            empty="no poison rows",
        )
    return EXIT_OK


def _poison_change(action: str, reminder_id: uuid.UUID, force: bool) -> int:
    """Retry or skip one row in its own transaction; refuse a row that has not failed."""
    from ..operator_jobs import poison as poison_rows

    with database() as engine:
        done = poison_rows.change(engine, action, reminder_id, actor=operator_name(), force=force)
    if done.changed:
        print(f"poison {action}: done ({reminder_id})", flush=True)
        return EXIT_OK
    reason = (done.reason or "").replace("force acts", "--force acts")
    print_error(f"poison {action} {reminder_id}: nothing changed: {reason}")
    return EXIT_FAILURE


@poison.command("retry")
@reminder_id_argument
@force_option
def poison_retry(reminder_id: uuid.UUID, force: bool) -> int:
    """Clear a poison row's back-off so the next cycle tries it (logged with your OS user)."""
    return _poison_change("retry", reminder_id, force)


@poison.command("skip")
@reminder_id_argument
@force_option
def poison_skip(reminder_id: uuid.UUID, force: bool) -> int:
    """Move a poison row to Skipped: it is never published (logged with your OS user)."""
    return _poison_change("skip", reminder_id, force)
