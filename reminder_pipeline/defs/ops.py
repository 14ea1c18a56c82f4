"""The four ops of a dispatch cycle, adapters over :mod:`reminder_pipeline.cycle`.

``select_due_batch → resolve_event_status → transition_and_outbox → relay_outbox``. Steps hand
each other plain values only (ids, AsOf, counts: what the fs_io_manager stores), so a step
re-executed from the UI after an upgrade still reads them. Only ``transition_and_outbox`` writes
reminder rows, after locking and re-reading them; a re-execution over an old selection writes
nothing for rows that were sent, skipped or cancelled since (docs/design.md).
"""

# No ``from __future__ import annotations``: Dagster reads the ops' annotations when defining them.

from collections.abc import Iterator
from typing import Any

from dagster import (
    AssetCheckEvaluation,
    AssetMaterialization,
    DagsterType,
    Failure,
    MetadataValue,
    OpExecutionContext,
    Out,
    Output,
    op,
)

from .. import cycle
from ..config import ConfigError
from ..logs import FoldingJournal
from .assets import DISPATCH_ASSET_KEY
from .checks import evaluate_all
from .limits import refuse_overridden_limits
from .resources import KafkaResource, PostgresResource
from .run_config import CycleConfig


def _step_record(name: str, keys: set[str], description: str) -> DagsterType:
    """What a step hands the next: a dict of builtins with these keys (what the UI shows)."""
    return DagsterType(
        name=name,
        description=description,
        typing_type=dict,
        type_check_fn=lambda _context, value: isinstance(value, dict) and keys <= value.keys(),
    )


DUE_SELECTION = _step_record(
    "DueSelection",
    {"cycle", "ids", "skipped_locked"},
    "The cycle (run id, AsOf, batch size, budget), the reserved reminder ids oldest first, and "
    "how many due rows another transaction held.",
)
DECIDED_SELECTION = _step_record(
    "DecidedSelection",
    {"cycle", "ids", "skipped_locked", "send", "skip"},
    "The selection plus the preview: which ids would be sent and which skipped.",
)
WRITTEN_CYCLE = _step_record(
    "WrittenCycle",
    {"cycle", "run_id", "counts", "relay"},
    "What the write step did: the cycle's counts and what its drain already published.",
)
CYCLE_REPORT = _step_record(
    "CycleReport",
    {"run_id", "as_of", "sent", "skipped", "published", "backlog_remaining"},
    "The whole cycle: counts, what was published, the backlog left (also the asset's metadata).",
)


@op(
    out=Out(DUE_SELECTION),
    description="Due Pending rows, oldest first, reserved for this run in a "
    "short transaction (FOR UPDATE SKIP LOCKED).",
)
def select_due_batch(
    context: OpExecutionContext, config: CycleConfig, postgres: PostgresResource
) -> dict[str, Any]:
    """Step 1: the due rows this run takes; concurrent runs take disjoint batches."""
    refuse_overridden_limits(context)
    with FoldingJournal(context.log) as journal:
        try:
            started = cycle.start(
                context.run_id,
                engine=postgres.engine,
                batch_size=config.batch_size,
                as_of=config.as_of_time(),
                max_batches=config.max_batches,
                budget_seconds=config.budget_seconds,
                journal=journal,
            )
        except ConfigError as error:
            # AsOf after the database's clock: the run config's one line, before any row is taken.
            raise Failure(description=f"{context.job_name} run config refused: {error}") from None
        reserved = cycle.reserve(postgres.engine, started, journal=journal)
    return {
        "cycle": started.plain(),
        "ids": reserved.ids,
        "skipped_locked": reserved.skipped_locked,
    }


@op(
    out=Out(DECIDED_SELECTION),
    description="Send for a Planned/InProgress event, skip for Cancelled/"
    "Completed, from the events' status now (a preview).",
)
def resolve_event_status(
    context: OpExecutionContext, selection: dict[str, Any], postgres: PostgresResource
) -> dict[str, Any]:
    """Step 2: the decision per row; the writing step decides again on what it reads under lock."""
    decided = cycle.preview(postgres.engine, selection["ids"])
    context.log.info(
        f"preview: {len(decided.send)} to send, {len(decided.skip)} to skip "
        "(decided again under lock by transition_and_outbox)"
    )
    return {**selection, "send": decided.send, "skip": decided.skip}


@op(
    out=Out(WRITTEN_CYCLE),
    description="Lock and re-read the rows, move them Sent/Skipped with one "
    "outbox row per Sent, in one transaction; drain on if configured.",
)
def transition_and_outbox(
    context: OpExecutionContext,
    decisions: dict[str, Any],
    postgres: PostgresResource,
    kafka: KafkaResource,
) -> dict[str, Any]:
    """Step 3: write the batch; with ``max_batches`` > 1 keep draining, publishing as it goes."""
    refuse_overridden_limits(context)
    with FoldingJournal(context.log) as journal:
        written = cycle.write(
            postgres.engine,
            cycle.Cycle.from_plain(decisions["cycle"]),
            decisions["ids"],
            run_id=context.run_id,
            skipped_locked=decisions["skipped_locked"],
            publisher=kafka.ready_publisher(),
            journal=journal,
            writer=cycle.WRITER_DAGSTER,
        )
    return {"cycle": decisions["cycle"], **written.plain()}


@op(
    out=Out(CYCLE_REPORT),
    description="Publish unpublished outbox rows to Kafka, measure the backlog, "
    "record the run's figures on the asset and evaluate its checks.",
)
def relay_outbox(
    context: OpExecutionContext,
    written: dict[str, Any],
    postgres: PostgresResource,
    kafka: KafkaResource,
) -> Iterator[AssetCheckEvaluation | AssetMaterialization | Output[dict[str, Any]]]:
    """Step 4: relay, then one materialization of the dispatcher and its checks; Failure if
    Kafka failed."""
    refuse_overridden_limits(context)
    with FoldingJournal(context.log) as journal:
        report = cycle.finish(
            postgres.engine,
            cycle.Cycle.from_plain(written["cycle"]),
            cycle.Written.from_plain(written),
            run_id=context.run_id,
            publisher=kafka.ready_publisher(),
            publisher_error=kafka.topic_error(),
            journal=journal,
        )
    # The checks first, then the materialization, back to back: a check logged by the
    # materializing run targets its materialization whatever the order (Dagster's
    # targets_latest_materialization), and logged before it they also target the previous one
    # until it lands, so the UI never shows them "Not evaluated" (docs/operations.md). Yielded,
    # not logged: they are stored before a Failure below ends the step.
    try:
        yield from evaluate_all(postgres.engine, report.relay.left, report.relay.holder)
    except Exception as exc:  # noqa: BLE001 - the cycle is done: record it; the sensor checks
        context.log.warning(f"checks not evaluated by this run ({type(exc).__name__})")
    left = report.relay.left
    holder = {"relay_lock_holder": report.relay.holder} if left and report.relay.holder else {}
    yield AssetMaterialization(
        asset_key=DISPATCH_ASSET_KEY,
        metadata={**report.figures(), "as_of": MetadataValue.timestamp(report.as_of), **holder},
        description=f"{report.counts.sent} sent, {report.counts.skipped} skipped, "
        f"{report.relay.published} published in {report.counts.batches} batch(es); "
        f"{report.backlog_remaining} due left"
        + (f"; partial publish: {left} of this run's outbox rows stay unpublished" if left else ""),
    )
    if report.relay.failed:
        raise Failure(
            description=f"Kafka publish failed: {report.relay.failed} outbox rows stay unpublished "
            f"and go out with the next cycle ({report.relay.last_error})",
            metadata={
                "publish_failed_count": report.relay.failed,
                "outbox_unpublished": report.outbox_unpublished,
            },
        )
    yield Output(report.plain())
