"""``outbox purge``: published outbox rows past the retention, in small batches."""

from __future__ import annotations

from datetime import timedelta

import click

from ..config import DEFAULT_PURGE_BATCH_SIZE, DEFAULT_RETENTION_HOURS
from .context import database, operator_name
from .exits import EXIT_OK
from .options import (
    PURGE_BATCH_SIZE_TYPE,
    RETENTION_HOURS_TYPE,
    batch_size_option,
    env_option,
    json_option,
)
from .output import print_json


@click.group("outbox")
def outbox_group() -> None:
    """Outbox maintenance."""


@outbox_group.command("purge")
@env_option(
    "--retention-hours",
    type=RETENTION_HOURS_TYPE,
    default=DEFAULT_RETENTION_HOURS,
    envvar="REMINDER_OUTBOX_RETENTION_HOURS",
    help="Delete published rows older than this; at least 1 hour, at most 366 days.",
)
@batch_size_option(
    type=PURGE_BATCH_SIZE_TYPE,
    default=DEFAULT_PURGE_BATCH_SIZE,
    envvar="REMINDER_PURGE_BATCH_SIZE",
    help="Rows per DELETE transaction, 1..10,000.",
)
@json_option
def outbox_purge(retention_hours: float, batch_size: int, as_json: bool) -> int:
    """Delete published outbox rows past the retention, in small batches; never unpublished ones."""
    from ..operator_jobs.outbox_retention import purge_published

    with database() as engine:
        deleted = purge_published(
            engine,
            timedelta(hours=retention_hours),
            batch_size=batch_size,
            operator=operator_name(),
        )
    if as_json:
        print_json({"deleted": deleted, "retention_hours": retention_hours})
    else:
        print(
            f"purged {deleted} published outbox rows older than {retention_hours:g} h", flush=True
        )
    return EXIT_OK
