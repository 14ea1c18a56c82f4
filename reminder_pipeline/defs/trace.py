"""``reminder_trace``: a reminder's trace (or every reminder of an event's) from the Launchpad.

The same plain call as ``reminder-pipeline trace`` (:mod:`reminder_pipeline.operator_jobs.trace`):
the operator launches the job with the id as config; the run shows the answer as one short card
per reminder (the output's Markdown metadata, :mod:`.cards`: fields down the page, the run as a
link, the reason in words) and one log line per reminder. Read-only, so it never waits for the
dispatch limit.
"""

# No ``from __future__ import annotations``: Dagster reads the ops' and fields' annotations.

from collections.abc import Iterator
from typing import Annotated, Any, Optional

from dagster import (
    Config,
    Failure,
    MetadataValue,
    OpExecutionContext,
    Output,
    in_process_executor,
    job,
    op,
)
from pydantic import Field

from ..config import ConfigError, Settings
from ..domain.model import parse_uuid
from ..operator_jobs import trace as trace_lookup
from .cards import reminder_cards
from .jobs import KIND_TAG
from .resources import PostgresResource
from .run_config import checked_by, validated

TRACE_JOB_NAME = "reminder_trace"


def _id(value: str) -> str:
    try:
        return str(parse_uuid(value))
    except ValueError:
        raise ValueError(f"id {value.strip()!r} is not a reminder or event id (a UUID)") from None


class TraceConfig(Config):
    """The reminder (a ReminderId) or the event (an EventId, every reminder of it) to trace."""

    id: Annotated[str, checked_by(_id)] = Field(
        description="A ReminderId, or an EventId (every reminder of the event)."
    )
    dedup_url: Optional[str] = Field(
        default=None,
        description="PostgreSQL URL of the consumers' shared de-duplication table: say whether "
        "each reminder is delivered.",
    )
    dedup_path: Optional[str] = Field(
        default=None,
        description="The consumer's SQLite de-duplication file (on the run worker's host); "
        "given neither, the one `consume` writes there with the same settings, if any.",
    )


@op(description="The trace of a reminder or of an event's reminders: why each is in its state.")
def trace_reminders(
    context: OpExecutionContext, config: TraceConfig, postgres: PostgresResource
) -> Iterator[Output[dict[str, Any]]]:
    """The trace as the output, a card per reminder in its metadata, a log line per reminder."""
    # Here, not at the top: the consumer's modules (SQLite, its metrics server) are this op's
    # alone, and every process that loads the definitions (each run's) would import them.
    from ..consumer.dedup import DedupStoreError
    from ..consumer.delivered import delivered_check, found_store

    try:
        settings = Settings.from_env()
        dedup_path = config.dedup_path
        if not (config.dedup_url or dedup_path):  # the store `consume` writes here, if any
            found = found_store(settings)
            dedup_path = None if found is None else str(found)
        with delivered_check(config.dedup_url, dedup_path) as delivered:
            reminders = trace_lookup.trace(
                postgres.engine, config.id, ui_url=settings.dagster_ui_url, delivered=delivered
            )
    except (trace_lookup.UnknownId, ConfigError, DedupStoreError) as error:
        raise Failure(description=f"trace: {error}") from None
    for r in reminders:
        context.log.info(
            f"reminder {r['reminder_id']} event={r['event_id']} status={r['status']} "
            f"run_id={r['run_id']} partition={r['partition']} offset={r['offset']}: {r['reason']}"
        )
    yield Output(
        {"reminders": reminders},
        metadata={
            "count": len(reminders),
            "trace": MetadataValue.md(reminder_cards(reminders, title=f"Trace of {config.id}")),
        },
    )


@job(
    name=TRACE_JOB_NAME,
    description="Trace a reminder (id: a ReminderId) or every reminder of an event (id: an "
    "EventId): status, DueAt, SentAt, why, the run that wrote it, the outbox row and where "
    "its message landed, every re-publish; optional dedup_url/dedup_path: delivered or not.",
    config=validated(TRACE_JOB_NAME, TraceConfig, trace_reminders),
    executor_def=in_process_executor,
    tags={KIND_TAG: "operator", "dagster/max_runtime": "60"},
)
def reminder_trace() -> None:
    """One step: the trace."""
    trace_reminders()
