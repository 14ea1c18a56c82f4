"""The four ops of a dispatch cycle, each a thin wrapper over :mod:`reminder_pipeline.cycle`.

``select_due_batch → resolve_event_status → transition_and_outbox → relay_outbox``

Why this stays correct whatever runs the steps (and whenever): only ``transition_and_outbox``
writes, and it locks the candidates again and re-reads them under that lock in its own
transaction (see :mod:`reminder_pipeline.cycle`). The selection is a stale preview by design; a
re-execution from the UI that loads an old selection from the IO manager writes nothing for rows
that were sent, skipped, cancelled or taken by another dispatcher since. The outbox's unique
reminder id makes a second message for a reminder impossible, and the relay only publishes rows
not yet marked published.

The run id is the correlation id: it goes into every log line and every message header, and it
names the run's cycle span and its row in the metrics ledger. ``relay_outbox`` writes that row
(succeeded, or failed when Kafka refused); a run that fails before it is recorded by the
``reminder_dispatch_failure_ledger`` sensor (:mod:`reminder_pipeline.defs.sensors`).
"""

# No ``from __future__ import annotations`` here: Dagster reads the ops' parameter annotations
# (config class, resources, input types) at definition time.

import logging
import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Optional

from dagster import (
    AssetMaterialization,
    Config,
    Failure,
    MetadataValue,
    OpExecutionContext,
    Out,
    Output,
    op,
)
from pydantic import Field, field_validator

from .. import cycle
from ..config import DEFAULT_BATCH_SIZE, MAX_BATCH_SIZE
from ..domain.model import Action, CycleCounts, Decision
from ..logs import event
from ..messaging.relay import RelayResult
from ..messaging.relay import relay_outbox as relay_pending_outbox
from ..observability import ledger, tracing
from ..store import repository
from .assets import DISPATCH_ASSET_KEY
from .event_log import fields_in_event_log
from .resources import KafkaResource, PostgresResource

log = logging.getLogger("reminder_pipeline.dagster")

MAX_BATCHES = 10_000
#: The widest time budget any job accepts; each job narrows it (see jobs.py).
MAX_BUDGET_SECONDS = 240.0
#: The relay always gets at least this long, even when the drain spent the budget: a few seconds
#: past the budget beat a spurious "publish failed" for messages the broker was about to ack.
MIN_RELAY_SECONDS = 5.0
#: The ledger's error kind of a cycle whose messages Kafka did not take (the run fails too).
PUBLISH_FAILED = "KafkaPublishFailed"


# --- run configuration --------------------------------------------------------------------------


def parse_as_of(value: str) -> datetime:
    """An ISO-8601 timestamp with a zone, not in the future (the seed: AsOf never ahead of the clock)."""
    text = value.strip()
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(
            f"as_of {text!r} is not an ISO-8601 timestamp (e.g. 2026-11-30T10:00:00Z)"
        ) from None
    return cycle.check_as_of(parsed)


class CycleConfig(Config):
    """One dispatch cycle: the seed's BatchSize, how many batches to drain, the time budget, AsOf."""

    batch_size: int = Field(
        default=DEFAULT_BATCH_SIZE, ge=1, le=MAX_BATCH_SIZE,
        description=f"Rows per batch (each batch is one transaction), 1..{MAX_BATCH_SIZE}.",
    )
    max_batches: int = Field(
        default=1, ge=1, le=MAX_BATCHES,
        description=(
            "Batches per run (1 = the seed's cycle). More drains a backlog in several batches, "
            "each its own transaction, publishing as it goes, until the time budget is spent."
        ),
    )
    budget_seconds: float = Field(
        default=30.0, ge=1.0, le=MAX_BUDGET_SECONDS,
        description="The cycle's time budget: no new batch starts after it is spent.",
    )
    as_of: Optional[str] = Field(
        default=None,
        description="AsOf, ISO-8601 with a zone (e.g. 2026-11-30T10:00:00Z). Default: now. Never in the future.",
    )

    @field_validator("as_of")
    @classmethod
    def _as_of_is_past(cls, value: Optional[str]) -> Optional[str]:
        if value is None or not value.strip():
            return None
        parse_as_of(value)
        return value.strip()

    def resolved_as_of(self) -> datetime:
        """``as_of`` checked again against the clock now (a queued run may start later), or now."""
        return parse_as_of(self.as_of) if self.as_of else cycle.now_utc()


# --- what flows between the steps ---------------------------------------------------------------


@dataclass(frozen=True)
class CycleOptions:
    """The run's drain settings, handed from the first step to the writing step."""

    run_id: str
    max_batches: int
    budget_seconds: float
    #: Wall clock (epoch seconds) when the cycle started; wall, not monotonic, because a
    #: re-execution runs in another process.
    started_at: float


@dataclass
class DispatchOutcome:
    """What ``transition_and_outbox`` did in run ``run_id``: counts and what it already published."""

    run_id: str
    as_of: datetime
    batch_size: int
    budget_seconds: float
    started_at: float
    counts: CycleCounts = field(default_factory=CycleCounts)
    relay: RelayResult = field(default_factory=RelayResult)


# --- the ops --------------------------------------------------------------------------------------


@op(
    out={"selection": Out(cycle.Selection), "options": Out(CycleOptions)},
    description="Due Pending rows, oldest first, read under FOR UPDATE SKIP LOCKED in a short transaction of its own.",
)
def select_due_batch(context: OpExecutionContext, config: CycleConfig, postgres: PostgresResource):
    """Step 1: the candidates (a preview: the writing step locks and re-reads them)."""
    with fields_in_event_log():
        started_at = time.time()
        as_of = config.resolved_as_of()  # refuses a future/garbled AsOf before anything is written
        event(log, logging.INFO, "cycle started", run_id=context.run_id, as_of=as_of.isoformat(),
              batch_size=config.batch_size, max_batches=config.max_batches)
        # The locks end with this transaction; that is fine, transition_and_outbox re-locks.
        with postgres.engine.begin() as conn:
            selection = cycle.select_due_batch(conn, as_of, config.batch_size)
        event(log, logging.INFO, "batch selected", run_id=context.run_id,
              count=len(selection.candidates), skipped_locked=selection.skipped_locked)
    return selection, CycleOptions(context.run_id, config.max_batches, config.budget_seconds, started_at)


@op(description="Send for a Planned/InProgress event, skip for Cancelled/Completed (pure; a preview).")
def resolve_event_status(context: OpExecutionContext, selection: cycle.Selection) -> list[Decision]:
    """Step 2: the decisions on the selection's snapshot; the writing step decides again under lock."""
    decisions = cycle.resolve_event_status(selection.candidates)
    to_send = sum(1 for d in decisions if d.action is Action.SEND)
    context.log.info(
        f"preview: {to_send} to send, {len(decisions) - to_send} to skip "
        "(decided again under lock by transition_and_outbox)"
    )
    return decisions


@op(description="Lock and re-read the candidates, move them Sent/Skipped with one outbox row per Sent, in one transaction.")
def transition_and_outbox(
    context: OpExecutionContext,
    selection: cycle.Selection,
    decisions: list[Decision],
    options: CycleOptions,
    postgres: PostgresResource,
    kafka: KafkaResource,
) -> DispatchOutcome:
    """Steps 3-4: write the batch; with ``max_batches`` > 1 keep draining, publishing as it goes."""
    run_id = context.run_id
    # A step re-executed from the UI (another run, maybe days later) gets a fresh budget.
    started_at = options.started_at if options.run_id == run_id else time.time()
    # The cycle span is current while the outbox rows are written: their headers get its
    # traceparent (cycle.transition_and_outbox reads it), so a consumer continues this trace.
    with fields_in_event_log(), tracing.cycle_span(
        run_id, as_of=selection.as_of.isoformat(), batch_size=selection.batch_size,
        max_batches=options.max_batches,
    ):
        with postgres.engine.begin() as conn:
            batch = cycle.transition_and_outbox(conn, selection.ids, selection.as_of,
                                                correlation_id=run_id)
        batch.skipped_locked += selection.skipped_locked
        counts = batch.counts()
        previewed = sum(1 for d in decisions if d.action is Action.SEND)
        if len(batch.sent) != previewed or batch.gone or batch.skipped_locked:
            context.log.info(
                f"under lock: {len(batch.sent)} sent (preview said {previewed}), "
                f"{batch.gone} gone since selection, {batch.skipped_locked} held by another dispatcher"
            )
        relay = RelayResult()
        full = len(selection.candidates) + selection.skipped_locked >= selection.batch_size
        elapsed = time.time() - started_at
        if options.max_batches > 1 and full and elapsed < options.budget_seconds:
            more, relay = cycle.drain(
                postgres.engine, selection.as_of, selection.batch_size,
                max_batches=options.max_batches - 1, budget_seconds=options.budget_seconds,
                correlation_id=run_id, publisher=kafka.ready_publisher(),
                started=time.monotonic() - elapsed,
            )
            counts.add(more)
        tracing.set_attributes(**counts.as_dict())
    return DispatchOutcome(run_id, selection.as_of, selection.batch_size, options.budget_seconds,
                           started_at, counts, relay)


@op(
    out=Out(cycle.CycleReport),
    description="Publish unpublished outbox rows to Kafka, measure the backlog, record the run's figures on the asset.",
)
def relay_outbox(
    context: OpExecutionContext,
    outcome: DispatchOutcome,
    postgres: PostgresResource,
    kafka: KafkaResource,
):
    """Relay the outbox, then one materialization of ``calendar/reminder_dispatch``; Failure if Kafka failed."""
    # Counts belong to the run that wrote them: a relay re-executed on its own reports only what
    # it published, so the plotted sent_count never counts a batch twice.
    own = outcome.run_id == context.run_id
    relay_started = time.time()
    with fields_in_event_log():
        report, final, unpublished = _relay_and_measure(context.run_id, outcome, own, postgres, kafka)
    # The ledger row the exporter and dispatch_liveness read: this run's counts (a relay-only
    # re-execution: what it published), failed when Kafka refused. Before the materialization:
    # the failure sensor takes a run with one as already recorded.
    ledger.record_cycle(postgres.engine, context.run_id, report.counts,
                        started_at=outcome.started_at if own else relay_started,
                        as_of=report.as_of, error=PUBLISH_FAILED if final.failed else None)
    # Yielded (not context.log_event) so it is stored before a Failure below ends the step.
    yield AssetMaterialization(
        asset_key=DISPATCH_ASSET_KEY,
        description=(
            f"{report.counts.sent} sent, {report.counts.skipped} skipped, "
            f"{report.relay.published} published"
        ),
        metadata=materialization_metadata(report, unpublished, reexecuted_relay=not own),
    )
    if final.failed:
        raise Failure(
            description=(
                f"Kafka publish failed: {final.failed} outbox rows stay unpublished and go out "
                f"with the next cycle ({final.last_error})"
            ),
            metadata={"publish_failed_count": final.failed, "outbox_unpublished": unpublished},
        )
    yield Output(report)


def _relay_and_measure(
    run_id: str, outcome: DispatchOutcome, own: bool, postgres: PostgresResource, kafka: KafkaResource
) -> tuple[cycle.CycleReport, RelayResult, int]:
    """Publish what the outbox holds, then measure: (report, this relay's result, rows still unpublished)."""
    started_at = outcome.started_at if own else time.time()
    counts = outcome.counts if own else CycleCounts()
    relay = RelayResult().merge(outcome.relay) if own else RelayResult()
    engine = postgres.engine
    topic_error = kafka.topic_error()
    if topic_error is None:
        remaining = max(outcome.budget_seconds - (time.time() - started_at), MIN_RELAY_SECONDS)
        final = relay_pending_outbox(engine, kafka.publisher, budget_seconds=remaining,
                                     correlation_id=run_id)
    else:
        with engine.connect() as conn:
            waiting = repository.outbox_lag(conn).unpublished
        final = RelayResult(failed=waiting, last_error=topic_error)
        event(log, logging.ERROR, "outbox publish failed; rows stay unpublished", run_id=run_id,
              failed=waiting, published=0, error=topic_error)
    relay.merge(final)

    with engine.connect() as conn:
        left = repository.backlog(conn, cycle.now_utc())
        lag = repository.outbox_lag(conn)
    counts.published = relay.published
    counts.publish_failed = relay.failed
    counts.duration_ms = int((time.time() - started_at) * 1000)
    event(log, logging.INFO, "cycle completed", run_id=run_id, sent=counts.sent,
          skipped=counts.skipped, skipped_locked=counts.skipped_locked, failed=counts.failed,
          published=relay.published, publish_failed=relay.failed,
          duration_ms=counts.duration_ms, backlog_remaining=left.count)
    report = cycle.CycleReport(run_id, outcome.as_of, outcome.batch_size, counts, relay,
                               left.count, left.oldest_due_age_seconds)
    return report, final, lag.unpublished


def materialization_metadata(report: cycle.CycleReport, outbox_unpublished: int,
                             reexecuted_relay: bool = False) -> dict:
    """The run's figures as asset metadata; numbers never None, so the UI plots every point."""
    c = report.counts
    return {
        "sent_count": MetadataValue.int(c.sent),
        "skipped_count": MetadataValue.int(c.skipped),
        "skipped_locked_count": MetadataValue.int(c.skipped_locked),
        "failed_count": MetadataValue.int(c.failed),
        "published_count": MetadataValue.int(report.relay.published),
        "publish_failed_count": MetadataValue.int(report.relay.failed),
        "duration_ms": MetadataValue.int(c.duration_ms),
        "backlog_remaining": MetadataValue.int(report.backlog_remaining),
        "oldest_due_age_seconds": MetadataValue.float(float(report.oldest_due_age_seconds or 0.0)),
        "max_lateness_seconds": MetadataValue.float(float(c.max_lateness_seconds or 0.0)),
        "outbox_unpublished": MetadataValue.int(outbox_unpublished),
        "batch_size": MetadataValue.int(report.batch_size),
        "batches": MetadataValue.int(c.batches),
        "as_of": MetadataValue.timestamp(report.as_of),
        "reexecuted_relay_only": MetadataValue.bool(reexecuted_relay),
    }
