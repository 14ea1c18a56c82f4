"""Operator jobs' ops: poison rows (list / retry now / skip one) and outbox retention.

The same plain calls as ``reminder-pipeline poison`` and ``outbox purge``
(:mod:`reminder_pipeline.operator_jobs.poison`,
:mod:`reminder_pipeline.operator_jobs.outbox_retention`). Safe next to a running
dispatch (status predicates, SKIP LOCKED, small batches), so neither waits for the dispatch limit.
"""

# No ``from __future__ import annotations``: Dagster reads the ops' annotations at definition time.

import logging
import time
from datetime import timedelta
from typing import Any

from dagster import Failure, MetadataValue, Output, op

from ..logs import FoldingJournal
from ..operator_jobs import outbox_retention as retention
from ..operator_jobs import poison
from .config import PoisonConfig, RetentionConfig
from .resources import PostgresResource

_COLUMNS = ("id", "calendar_event_id", "attempts", "next_attempt_at", "due_at", "last_error")


def _table(rows: list[dict[str, Any]]) -> str:
    """Poison rows as a Markdown table for the run's output metadata."""
    cells = [
        [str(r.get(c) if r.get(c) is not None else "").replace("|", "\\|") for c in _COLUMNS]
        for r in rows
    ]
    return "\n".join(
        ["| " + " | ".join(_COLUMNS) + " |", "|" + "---|" * len(_COLUMNS)]
        + ["| " + " | ".join(row) + " |" for row in cells]
    )


@op(description="List poison rows, or retry / skip one, in one transaction; each action logged.")
def poison_rows(context, config: PoisonConfig, postgres: PostgresResource):
    """The operator's action; its result is the output (and its metadata)."""
    with FoldingJournal(context.log) as journal:
        if config.action == "list":
            rows = poison.list_rows(postgres.engine, config.limit)
            journal.event(
                logging.INFO, "poison rows listed", run_id=context.run_id, count=len(rows)
            )
            yield Output(
                rows,
                metadata={
                    "action": "list",
                    "poison_count": len(rows),
                    "poison_rows": MetadataValue.md(_table(rows)),
                },
            )
            return
        # The run's launcher is not known to the run worker: the run id (and its tags) say who.
        done = poison.change(
            postgres.engine,
            config.action,
            config.reminder_id,
            actor=context.dagster_run.tags.get("user") or poison.os_user(),
            force=config.force,
            run_id=context.run_id,
            run_log=context.log,
        )
    if not done.changed:
        raise Failure(
            description=f"poison {done.action}: reminder {done.reminder_id}: nothing "
            f"changed: {done.reason}",
            metadata=done.plain(),
        )
    yield Output(done.plain(), metadata=done.plain())


@op(
    description="Delete published outbox rows older than the retention, in small batches; "
    "never unpublished ones."
)
def purge_outbox(context, config: RetentionConfig, postgres: PostgresResource):
    """Outbox retention; ``deleted_count`` in the output metadata."""
    started = time.monotonic()
    deleted = retention.purge_published(
        postgres.engine,
        timedelta(hours=config.retention_hours),
        batch_size=config.batch_size,
        operator=context.dagster_run.tags.get("user") or poison.os_user(),
        run_log=context.log,
    )
    context.log.info(f"outbox purged deleted={deleted} retention_hours={config.retention_hours}")
    yield Output(
        deleted,
        metadata={
            "deleted_count": deleted,
            "retention_hours": float(config.retention_hours),
            "batch_size": config.batch_size,
            "duration_ms": int((time.monotonic() - started) * 1000),
        },
    )
