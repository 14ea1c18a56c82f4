"""Operator jobs' ops: poison rows (list / retry now / skip one or a filter's) and outbox retention.

The same plain calls as ``reminder-pipeline poison`` and ``outbox purge``
(:mod:`reminder_pipeline.operator_jobs.poison`,
:mod:`reminder_pipeline.operator_jobs.outbox_retention`). Safe next to a running
dispatch (status predicates, SKIP LOCKED, small batches), so neither waits for the dispatch limit.
"""

# No ``from __future__ import annotations``: Dagster reads the ops' annotations at definition time.

import logging
import time
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

from dagster import Failure, MetadataValue, OpExecutionContext, Output, op

from ..logs import FoldingJournal
from ..operator_jobs import outbox_retention as retention
from ..operator_jobs import poison
from .resources import PostgresResource
from .run_config import PoisonConfig, RetentionConfig

_COLUMNS = ("id", "calendar_event_id", "attempts", "next_attempt_at", "due_at", "last_error")
_BULK_COLUMNS = ("id", "calendar_event_id", "attempts", "last_failed_at", "next_attempt_at")


def markdown_table(rows: list[dict[str, Any]], columns: tuple[str, ...] = _COLUMNS) -> str:
    """Rows as a Markdown table for a run's output metadata."""
    cells = [
        [str(r.get(c) if r.get(c) is not None else "").replace("|", "\\|") for c in columns]
        for r in rows
    ]
    return "\n".join(
        ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
        + ["| " + " | ".join(row) + " |" for row in cells]
    )


def _change_many(
    context: OpExecutionContext, config: PoisonConfig, postgres: PostgresResource
) -> Output[dict[str, Any]]:
    """A filter's retry / skip (or its dry run): the rows as the output and a table."""
    selected = poison.PoisonFilter(
        event_id=uuid.UUID(config.event_id) if config.event_id else None,
        kind=config.kind,
        failed_since=datetime.fromisoformat(config.failed_since) if config.failed_since else None,
    )
    done = poison.change_many(
        postgres.engine,
        config.action,
        selected,
        actor=context.dagster_run.tags.get("user") or poison.os_user(),
        dry_run=config.dry_run,
        run_id=context.run_id,
        run_log=context.log,
    )
    verb = "would change" if done.dry_run else "changed"
    context.log.info(f"poison {done.action}: {done.count} rows {verb} ({done.selector})")
    return Output(
        done.plain(),
        metadata={
            "action": done.action,
            "dry_run": done.dry_run,
            "count": done.count,
            "rows": MetadataValue.md(markdown_table(done.rows, _BULK_COLUMNS)),
        },
    )


@op(
    description="List poison rows, or retry / skip one or those a filter takes (a dry run "
    "first), in one transaction; each action logged."
)
def poison_rows(
    context: OpExecutionContext, config: PoisonConfig, postgres: PostgresResource
) -> Iterator[Output[Any]]:
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
                    "poison_rows": MetadataValue.md(markdown_table(rows)),
                },
            )
            return
        if config.filtered:
            yield _change_many(context, config, postgres)
            return
        # PoisonConfig's validator: a retry or skip without a filter names its reminder.
        assert config.reminder_id is not None
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
def purge_outbox(
    context: OpExecutionContext, config: RetentionConfig, postgres: PostgresResource
) -> Iterator[Output[int]]:
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
