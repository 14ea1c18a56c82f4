"""``dispatch`` (one cycle now) and ``relay`` (the outbox now): exit 3 on a partial publish."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

import click

from ..config import CYCLE_MAX_BATCHES, CYCLE_MAX_BATCHES_ENV, DEFAULT_BATCH_SIZE
from ..domain.model import COUNTERS
from .context import load_settings, open_publisher, open_servers, progress_line, require_schema
from .exits import relay_exit
from .options import (
    AS_OF_TYPE,
    BATCH_SIZE_TYPE,
    MAX_BATCHES_TYPE,
    batch_size_option,
    budget_option,
    env_option,
    flag,
    given_as,
    json_option,
)
from .output import print_fields, print_json

if TYPE_CHECKING:
    from ..domain.model import CycleCounts


@click.command()
@batch_size_option(
    type=BATCH_SIZE_TYPE,
    default=DEFAULT_BATCH_SIZE,
    envvar="REMINDER_BATCH_SIZE",
    help="Rows per batch (each batch one transaction), 1..10,000.",
)
@env_option(
    "--max-batches",
    type=MAX_BATCHES_TYPE,
    default=CYCLE_MAX_BATCHES,
    envvar=CYCLE_MAX_BATCHES_ENV,
    help="Batches at most, as a scheduled run: the cycle stops earlier when nothing due is "
    "left or the budget is spent (1 = the literal one-batch cycle), 1..10,000.",
)
@budget_option(help="No new batch starts after this many seconds, 1..600.")
@env_option(
    "--as-of",
    type=AS_OF_TYPE,
    default=None,
    envvar="REMINDER_AS_OF",
    show_default="now",
    help="AsOf: ISO-8601 with a zone (2026-11-30T10:00:00Z), never in the future.",
)
@flag(
    "--no-relay",
    envvar="REMINDER_NO_RELAY",
    help="Write Sent rows and their outbox rows, publish nothing.",
)
@json_option
def dispatch(
    batch_size: int,
    max_batches: int,
    budget_seconds: float,
    as_of: datetime | None,
    no_relay: bool,
    as_json: bool,
) -> int:
    """Run one dispatch cycle now (select, decide, transition + outbox, relay); print its counts.

    Never migrates: run `db upgrade` first. Exit 3 when some of the cycle's outbox rows are
    still unpublished at its end (a failed delivery, or the relay lock held by another relay
    that did not publish them within the budget).
    """
    from .. import cycle

    settings = load_settings()
    endpoints, engine = open_servers(settings, broker=not no_relay)
    try:
        require_schema(engine)
        # Not after the database's clock (this host's may be off): the same one line, exit 2.
        as_of = cycle.check_as_of_on_database(engine, as_of, given_as("as_of"))
        publisher = None if no_relay else open_publisher(settings, endpoints.bootstrap_servers)
        line = progress_line()

        def progress(counts: CycleCounts) -> None:
            # The backlog is counted only when a line is due (every few seconds of a drain).
            if line.due():
                line.rows(counts.selected, cycle.backlog_left(engine))

        try:
            report = cycle.run_cycle(
                engine,
                publisher,
                as_of=as_of,
                batch_size=batch_size,
                max_batches=max_batches,
                budget_seconds=budget_seconds,
                progress=progress,
                writer=cycle.cli_writer("dispatch"),
            )
        finally:
            if publisher is not None:
                publisher.close()
    finally:
        engine.dispose()
    counts = report.as_dict()
    if as_json:
        print_json(counts)
    else:
        partial = (
            {"unpublished_of_run": report.relay.left, "relay_lock_holder": report.relay.holder}
            if report.relay.left
            else {}
        )
        print_fields(
            "dispatch cycle",
            {
                **{k: counts.get(k) for k in (*COUNTERS, "duration_ms", "backlog_remaining")},
                **partial,
                "run_id": counts.get("run_id"),
            },
        )
    return relay_exit(report.relay.failed, report.relay.left)


@click.command("relay")
@budget_option(help="Stop publishing after this many seconds, 1..600.")
@json_option
def relay_command(budget_seconds: float, as_json: bool) -> int:
    """Publish unpublished outbox rows now. Exit 3 when some of those unpublished when it
    started are still unpublished at its end (a failed delivery, the budget spent, or the relay
    lock held past the budget by a relay that did not publish them)."""
    from ..messaging.relay import publish_all

    settings = load_settings()
    endpoints, engine = open_servers(settings, broker=True)
    try:
        require_schema(engine)
        publisher = open_publisher(settings, endpoints.bootstrap_servers)
        try:
            result = publish_all(engine, publisher, budget_seconds=budget_seconds)
        finally:
            publisher.close()
    finally:
        engine.dispose()
    data = {
        "published": result.published,
        "failed": result.failed,
        "batches": result.batches,
        "busy": result.busy,
        "left": result.left,
        "holder": result.holder,
        "last_error": result.last_error,
    }
    if as_json:
        print_json(data)
    else:
        print_fields("relay", data)
    return relay_exit(result.failed, result.left)
