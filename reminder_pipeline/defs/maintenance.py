"""Operator jobs' ops: poison rows (list / retry now / skip one) and outbox retention.

Thin wrappers over :mod:`reminder_pipeline.store.repository` and :mod:`reminder_pipeline.retention`,
the same calls as ``reminder-pipeline poison`` and the CLI's purge. Safe next to a running
dispatch: the repository statements change a row only while it is still Pending, and the purge
takes published rows with SKIP LOCKED in small batches, so neither needs the dispatch
concurrency limit.
"""

# No ``from __future__ import annotations``: Dagster reads the ops' annotations at definition time.

import logging
import time
import uuid
from datetime import timedelta
from typing import Any, Literal, Optional

from dagster import Config, Failure, MetadataValue, OpExecutionContext, Output, op
from pydantic import Field, ValidationInfo, field_validator

from .. import retention
from ..store import repository
from .event_log import DagsterJournal
from .resources import PostgresResource

MAX_POISON_LIST = 1000
MAX_RETENTION_HOURS = 24 * 366
MAX_PURGE_BATCH = 10_000


# --- poison rows ------------------------------------------------------------------------------


class PoisonConfig(Config):
    """What to do: list the poison rows, or retry / skip one by its reminder id."""

    action: Literal["list", "retry", "skip"] = Field(
        default="list",
        description=(
            "list: Pending rows with failed attempts, with their last error; retry: clear the "
            "row's back-off so the next cycle tries it; skip: move it to Skipped (never published)."
        ),
    )
    reminder_id: Optional[str] = Field(
        default=None, validate_default=True,
        description="The reminder's id (a UUID, from list); required for retry and skip.",
    )
    limit: int = Field(default=100, ge=1, le=MAX_POISON_LIST, description="Rows listed at most.")

    @field_validator("reminder_id")
    @classmethod
    def _reminder_id_fits_the_action(cls, value: Optional[str], info: ValidationInfo) -> Optional[str]:
        action = info.data.get("action", "list")
        text = (value or "").strip()
        if not text:
            if action != "list":
                raise ValueError(f"reminder_id is required for action {action!r}")
            return None
        try:
            return str(uuid.UUID(text))
        except ValueError:
            raise ValueError(f"reminder_id {text!r} is not a UUID") from None


def _plain(row: dict[str, Any]) -> dict[str, Any]:
    """A poison row with JSON-friendly values (ids, counts, the error line, times as ISO text)."""
    return {k: v if v is None or isinstance(v, int | str) else str(v) for k, v in row.items()}


def _poison_table(rows: list[dict[str, Any]]) -> str:
    """The rows as a Markdown table for the run's output metadata."""
    columns = ("id", "calendar_event_id", "attempts", "next_attempt_at", "due_at", "last_error")
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in rows:
        cells = (str(row.get(c) if row.get(c) is not None else "").replace("|", "\\|") for c in columns)
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


@op(description="List poison rows, or retry / skip one, in one transaction; each action logged.")
def poison_rows(context: OpExecutionContext, config: PoisonConfig, postgres: PostgresResource):
    """The operator's action on poison rows; its result is the output (and its metadata)."""
    with DagsterJournal(context.log) as journal:
        yield from _poison_action(context.run_id, config, postgres, journal)


def _poison_action(run_id: str, config: PoisonConfig, postgres: PostgresResource,
                   journal: DagsterJournal):
    """List, or retry / skip one row in its own transaction, then log it; yields the output."""
    if config.action == "list":
        with postgres.engine.connect() as conn:
            rows = [_plain(r) for r in repository.list_poison(conn, config.limit)]
        journal.event(logging.INFO, "poison rows listed", run_id=run_id, count=len(rows))
        yield Output(rows, metadata={
            "action": "list", "poison_count": MetadataValue.int(len(rows)),
            "poison_rows": MetadataValue.md(_poison_table(rows)),
        })
        return
    reminder_id = uuid.UUID(config.reminder_id)
    change = repository.retry_poison_now if config.action == "retry" else repository.skip_poison
    with postgres.engine.begin() as conn:
        changed = change(conn, reminder_id)
    # The same event as the CLI's, with the run id standing for the operator's session.
    journal.event(logging.WARNING if changed else logging.INFO, f"poison row {config.action}",
                  run_id=run_id, reminder_id=str(reminder_id), action=config.action,
                  changed=changed)
    outcome = {"action": config.action, "reminder_id": str(reminder_id), "changed": changed}
    if not changed:
        # Like the CLI's exit code 1: the row was sent, skipped or deleted since it was listed.
        raise Failure(description=f"poison {config.action}: reminder {reminder_id} is not Pending; "
                                  "nothing changed", metadata=outcome)
    yield Output(outcome, metadata=outcome)


# --- outbox retention -------------------------------------------------------------------------


class RetentionConfig(Config):
    """How old a published outbox row must be to go, and how many rows each short transaction deletes."""

    retention_hours: float = Field(
        default=retention.DEFAULT_RETENTION.total_seconds() / 3600, ge=1, le=MAX_RETENTION_HOURS,
        description="Published rows older than this many hours are deleted (default 168 = 7 days).",
    )
    batch_size: int = Field(
        default=1000, ge=1, le=MAX_PURGE_BATCH,
        description="Rows per DELETE transaction (small batches hold short locks).",
    )


@op(description="Delete published outbox rows older than the retention, in small batches; never unpublished ones.")
def purge_outbox(context, config: RetentionConfig, postgres: PostgresResource):
    """Outbox retention; ``deleted_count`` in the output metadata."""
    started = time.monotonic()
    deleted = retention.purge_outbox(postgres.engine, timedelta(hours=config.retention_hours),
                                     batch_size=config.batch_size)
    context.log.info(f"outbox purged deleted={deleted} retention_hours={config.retention_hours}")
    yield Output(deleted, metadata={
        "deleted_count": MetadataValue.int(deleted),
        "retention_hours": MetadataValue.float(float(config.retention_hours)),
        "batch_size": MetadataValue.int(config.batch_size),
        "duration_ms": MetadataValue.int(int((time.monotonic() - started) * 1000)),
    })
