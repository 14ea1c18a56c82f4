"""``poison list|retry|skip``: rows that keep failing (retry and skip logged with the OS user);
retry and skip take one REMINDER_ID or a filter (``--all``, ``--event``, ``--kind``,
``--failed-since``) with ``--dry-run`` or ``--yes``."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import TYPE_CHECKING, Any

import click

from ..config import (
    DEFAULT_POISON_LIMIT,
    DEFAULT_POISON_LOCK_TIMEOUT_SECONDS,
    ConfigError,
    check_number,
    parse_range_start,
)
from .context import database, operator_name
from .exits import EXIT_FAILURE, EXIT_OK
from .options import (
    EVENT_ID_TYPE,
    KIND_TYPE,
    POISON_LIMIT_TYPE,
    REMINDER_ID_TYPE,
    Checked,
    F,
    env_option,
    force_option,
    json_option,
)
from .output import print_error, print_json, print_table

if TYPE_CHECKING:
    from ..operator_jobs.poison import PoisonFilter

#: ``--failed-since``: a time with its zone, or a day alone (its 00:00 UTC), as ``reminders``'
#: ``--due-from`` takes it.
FAILED_SINCE_TYPE = Checked(parse_range_start, "ISO-8601")
LOCK_TIMEOUT_TYPE = Checked(lambda value, name: check_number(value, name, 0.1, 600.0), "SECONDS")


@click.group()
def poison() -> None:
    """Rows that keep failing: list them, retry one now, or skip one for good."""


@poison.command("list")
@env_option(
    "--limit",
    type=POISON_LIMIT_TYPE,
    default=DEFAULT_POISON_LIMIT,
    envvar="REMINDER_POISON_LIMIT",
    help="Rows listed at most, 1..1,000.",
)
@json_option
def poison_list(limit: int, as_json: bool) -> int:
    """Pending rows with failed attempts, oldest due first, with their last error."""
    from ..operator_jobs import poison

    with database(start=False) as engine:
        rows = poison.list_rows(engine, limit)
    if as_json:
        print_json(rows)
    else:
        print_table(
            rows,
            ("id", "attempts", "next_attempt_at", "due_at", "last_error"),
            empty="no poison rows",
        )
    return EXIT_OK


def _poison_change(
    action: str, reminder_id: uuid.UUID, force: bool, as_json: bool, lock_timeout: float
) -> int:
    """Retry or skip one row in its own transaction; refuse a row that has not failed, and give
    up on a row another session holds past ``lock_timeout`` (both exit 1, the action object
    printed with --json all the same)."""
    from ..operator_jobs import poison

    with database() as engine:
        done = poison.change(
            engine,
            action,
            reminder_id,
            actor=operator_name(),
            force=force,
            lock_timeout_seconds=lock_timeout,
        )
    reason = (done.reason or "").replace("force acts", "--force acts")
    if as_json:
        print_json({**done.plain(), "forced": done.forced, "reason": reason or None})
    elif done.changed:
        print(f"poison {action}: done ({reminder_id})", flush=True)
    if done.changed:
        return EXIT_OK
    print_error(f"poison {action} {reminder_id}: nothing changed: {reason}")
    return EXIT_FAILURE


_FILTERS = "--all, --event, --kind, --failed-since"


def _poison_filter(
    action: str,
    *,
    all_rows: bool,
    event_id: uuid.UUID | None,
    kind: str | None,
    failed_since: datetime | None,
    force: bool,
    dry_run: bool,
    yes: bool,
) -> PoisonFilter:
    """The filter the options give, or the one-line refusal of a bad combination (exit 2)."""
    from ..operator_jobs.poison import PoisonFilter

    kind = kind.strip() if kind is not None else None
    if kind == "":
        raise ConfigError("--kind is empty")
    conditions = event_id is not None or kind is not None or failed_since is not None
    if not (all_rows or conditions):
        raise ConfigError(f"poison {action} needs a REMINDER_ID or a filter ({_FILTERS})")
    if all_rows and conditions:
        raise ConfigError(
            f"poison {action}: --all takes every poison row; drop it or the other filters"
        )
    if force:
        raise ConfigError(
            f"poison {action}: --force acts on one REMINDER_ID only; a filter takes poison "
            "rows only"
        )
    if not (dry_run or yes):
        raise ConfigError(
            f"poison {action} with a filter changes every row it takes: add --dry-run to list "
            "them, or --yes to confirm"
        )
    return PoisonFilter(event_id=event_id, kind=kind, failed_since=failed_since)


def _poison_action(
    action: str,
    reminder_id: uuid.UUID | None,
    force: bool,
    *,
    as_json: bool,
    dry_run: bool,
    lock_timeout: float,
    **filters: Any,
) -> int:
    """One row by id, or every poison row a filter takes (a dry run first)."""
    from ..operator_jobs import poison

    given = filters["all_rows"] or any(
        filters[k] is not None for k in ("event_id", "kind", "failed_since")
    )
    if reminder_id is not None:
        if given or dry_run or filters["yes"]:
            raise ConfigError(
                f"poison {action}: give a REMINDER_ID or a filter ({_FILTERS}), not both "
                "(--dry-run and --yes go with a filter)"
            )
        return _poison_change(action, reminder_id, force, as_json, lock_timeout)
    selected = _poison_filter(action, force=force, dry_run=dry_run, **filters)
    with database() as engine:
        try:
            done = poison.change_many(
                engine,
                action,
                selected,
                actor=operator_name(),
                dry_run=dry_run,
                lock_timeout_seconds=lock_timeout,
            )
        except poison.RowsLocked as error:
            if as_json:  # the action object, also when nothing changed
                refused = poison.BulkChange(action, False, selected.described(), []).plain()
                print_json({**refused, "locked": error.locked, "reason": str(error)})
            print_error(str(error))
            return EXIT_FAILURE
    if as_json:
        print_json(done.plain())
        return EXIT_OK
    verb = "would change" if dry_run else "changed"
    dry = " --dry-run" if dry_run else ""
    print(f"poison {action}{dry}: {done.count} rows {verb}", flush=True)
    if dry_run:
        print_table(done.rows, _BULK_COLUMNS, empty="(no poison row matches)")
    return EXIT_OK


_BULK_COLUMNS = ("id", "calendar_event_id", "attempts", "last_failed_at", "next_attempt_at")


def _bulk_options(command: F) -> F:
    """The filter of a bulk retry / skip, its dry run and its confirmation."""
    for option in reversed(
        (
            click.option(
                "--all", "all_rows", is_flag=True, default=False, help="Every poison row."
            ),
            click.option(
                "--event",
                "event_id",
                type=EVENT_ID_TYPE,
                default=None,
                help="The poison rows of this event (an EventId).",
            ),
            click.option(
                "--kind",
                type=KIND_TYPE,
                default=None,
                help="The poison rows of events of this Kind (one of the contract's kinds).",
            ),
            click.option(
                "--failed-since",
                type=FAILED_SINCE_TYPE,
                default=None,
                help="The poison rows whose last failure is at or after this time (a day alone: "
                "its 00:00 UTC).",
            ),
            click.option(
                "--dry-run",
                is_flag=True,
                default=False,
                help="Print how many rows and which would change; change nothing.",
            ),
            click.option(
                "--yes",
                is_flag=True,
                default=False,
                help="Confirm a filter's action. No environment variable: typed each time.",
            ),
            env_option(
                "--lock-timeout",
                type=LOCK_TIMEOUT_TYPE,
                default=DEFAULT_POISON_LOCK_TIMEOUT_SECONDS,
                envvar="REMINDER_POISON_LOCK_TIMEOUT",
                help="Seconds to wait for rows another session holds (one REMINDER_ID's or a "
                "filter's); then change nothing and name them (0.1..600).",
            ),
            json_option,
        )
    ):
        command = option(command)
    return command


@poison.command("retry")
@click.argument("reminder_id", type=REMINDER_ID_TYPE, required=False)
@force_option
@_bulk_options
def poison_retry(reminder_id: uuid.UUID | None, force: bool, **options: Any) -> int:
    """Clear the back-off of a poison row, or of those a filter takes, so the next cycle tries
    them (logged with your OS user)."""
    return _poison_action("retry", reminder_id, force, **options)


@poison.command("skip")
@click.argument("reminder_id", type=REMINDER_ID_TYPE, required=False)
@force_option
@_bulk_options
def poison_skip(reminder_id: uuid.UUID | None, force: bool, **options: Any) -> int:
    """Move a poison row, or those a filter takes, to Skipped: never published (logged with
    your OS user)."""
    return _poison_action("skip", reminder_id, force, **options)
