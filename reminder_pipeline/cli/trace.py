"""``trace ID``: everything about one reminder, or every reminder of one event (ids, times,
statuses and counts only)."""

from __future__ import annotations

import uuid
from typing import Any

import click

from ..config import ConfigError
from ..domain.model import parse_uuid
from .context import database, load_settings
from .exits import EXIT_FAILURE, EXIT_OK
from .options import Checked, json_option
from .output import print_error, print_json


def _check_id(value: object, name: str) -> uuid.UUID:
    try:
        return parse_uuid(value)
    except ValueError:
        raise ConfigError(f"{name}={value!r} is not a reminder or event id (a UUID)") from None


def _print_text(reminders: list[dict[str, Any]]) -> None:
    def line(label: str, text: Any) -> None:
        print(f"  {label:<13}{'-' if text is None else text}")

    for r in reminders:
        print(f"reminder {r['reminder_id']} (event {r['event_id']}, {r['kind']}): {r['status']}")
        line("due_at", r["due_at"])
        line("sent_at", r["sent_at"])
        line("reason", r["reason"])
        line("moved by", r["moved_by"])
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
            line("delivered", "yes" if r["delivered"] else "no")
    print(end="", flush=True)


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
    type=click.Path(dir_okay=False),
    default=None,
    help="The consumer's SQLite de-duplication file: say whether each reminder is delivered.",
)
@json_option
def trace_command(
    reminder_or_event_id: uuid.UUID, dedup_url: str | None, dedup_path: str | None, as_json: bool
) -> int:
    """Everything about a reminder (ID a ReminderId), or every reminder of an event (an EventId).

    Status, DueAt, SentAt, why it is in that state, the run that wrote it, its outbox row and
    where its message landed (partition, offset), every re-publish, and with --dedup-url or
    --dedup-path whether the consumer has it as delivered. An unknown ID is exit 1.
    """
    from ..consumer.dedup import DedupStoreError
    from ..consumer.delivered import delivered_check
    from ..operator_jobs import trace as trace_lookup

    ui_url = load_settings().dagster_ui_url
    try:
        with delivered_check(dedup_url, dedup_path) as delivered, database() as engine:
            reminders = trace_lookup.trace(
                engine, reminder_or_event_id, ui_url=ui_url, delivered=delivered
            )
    except (trace_lookup.UnknownId, DedupStoreError) as error:
        print_error(f"trace: {error}")
        return EXIT_FAILURE
    if as_json:
        print_json({"reminders": reminders})
    else:
        _print_text(reminders)
    return EXIT_OK
