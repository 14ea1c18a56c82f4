"""``trace ID``: everything about one reminder, or every reminder of one event (ids, times,
statuses and counts only), and whether the consumer delivered it."""

from __future__ import annotations

import uuid
from typing import Any

import click

from ..config import ConfigError, mask_url
from ..domain.model import parse_uuid
from ..domain.writers import WRITER_CALENDAR
from .context import database, load_settings
from .exits import EXIT_FAILURE, EXIT_OK
from .options import Checked, json_option
from .output import print_error, print_json


def _check_id(value: object, name: str) -> uuid.UUID:
    try:
        return parse_uuid(value)
    except ValueError:
        raise ConfigError(f"{name}={value!r} is not a reminder or event id (a UUID)") from None


def _print_text(reminders: list[dict[str, Any]], store: str | None) -> None:
    def line(label: str, text: Any) -> None:
        print(f"  {label:<15}{'-' if text is None else text}")

    for r in reminders:
        print(f"reminder {r['reminder_id']} (event {r['event_id']}, {r['kind']}): {r['status']}")
        for name in ("owner_user_id", "client_user_id", "tenant_id", "due_at", "sent_at"):
            line(name, r[name])
        line("reason", r["reason"])
        line("moved by", _writer(r["moved_by"]))
        line("run", r["run_id"] and " ".join(filter(None, (r["run_id"], r["run_url"]))))
        if r["outbox_id"] is not None:
            line(
                "published",
                f"{r['published_at'] or 'not yet'}  partition={r['partition']}"
                f" offset={r['offset']}  failed publish attempts: {r['failed_publish_attempts']}",
            )
        for c in r["republishes"]:
            line(
                "republished",
                f"{c['republished_at']} by run {c['run_id']}  partition={c['partition']}"
                f" offset={c['offset']}  {c['run_url']}",
            )
        if "delivered" in r:
            line("delivered", f"{'yes' if r['delivered'] else 'no'} (store: {store})")
    print(end="", flush=True)


def _writer(moved_by: str | None) -> str | None:
    """``moved_by`` in words where the value alone would read as a recorded name."""
    if moved_by == WRITER_CALENDAR:
        return "the calendar (it records no writer: told from the row and its event)"
    return moved_by


@click.command("trace")
@click.argument("reminder_or_event_id", metavar="ID", type=Checked(_check_id, "ID"))
@click.option(
    "--dedup-url",
    default=None,
    help="PostgreSQL URL of the consumers' shared de-duplication table: say whether each "
    "reminder is delivered.",
)
@click.option(
    "--dedup-path",
    default=None,
    show_default="the file `consume` writes here, when it is there",
    help="The consumer's SQLite de-duplication file: say whether each reminder is delivered.",
)
@json_option
def trace_command(
    reminder_or_event_id: uuid.UUID, dedup_url: str | None, dedup_path: str | None, as_json: bool
) -> int:
    """Everything about a reminder (ID a ReminderId), or every reminder of an event (an EventId).

    Status, whose it is (owner, client and tenant ids), DueAt, SentAt, why it is in that state,
    who moved it, the run that wrote it, its outbox row and where its message landed
    (partition, offset), every re-publish, and whether the consumer has it as delivered: with
    --dedup-url or --dedup-path, or given neither, the SQLite store `consume` writes with the
    same settings when it is there (the local stack's). An unknown ID is exit 1.
    """
    from ..consumer.dedup import DedupStoreError
    from ..consumer.delivered import delivered_check, found_store
    from ..operator_jobs import trace as trace_lookup

    settings = load_settings()
    if not (dedup_url or dedup_path):
        found = found_store(settings)
        dedup_path = None if found is None else str(found)
    store = mask_url(dedup_url) if dedup_url else dedup_path
    try:
        with (
            delivered_check(dedup_url, dedup_path) as delivered,
            database(start=False) as engine,
        ):
            reminders = trace_lookup.trace(
                engine, reminder_or_event_id, ui_url=settings.dagster_ui_url, delivered=delivered
            )
    except (trace_lookup.UnknownId, DedupStoreError) as error:
        print_error(f"trace: {error}")
        return EXIT_FAILURE
    if as_json:
        print_json({"reminders": reminders, "dedup_store": store})
    else:
        _print_text(reminders, store)
    return EXIT_OK
