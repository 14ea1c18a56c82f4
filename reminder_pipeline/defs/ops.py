"""The four ops of a dispatch cycle, adapters over :mod:`reminder_pipeline.cycle`.

``select_due_batch → resolve_event_status → transition_and_outbox → relay_outbox``. Steps hand
each other typed records (:mod:`.step_records`) that the fs_io_manager stores as plain values
(ids, AsOf, counts), so a step re-executed from the UI after an upgrade still reads them. Only
``transition_and_outbox`` writes reminder rows, after locking and re-reading them; a
re-execution over an old selection writes nothing for rows that were sent, skipped or cancelled
since (docs/design.md).
"""

# No ``from __future__ import annotations``: Dagster reads the ops' annotations when defining them.

from collections.abc import Iterator

from dagster import (
    AssetCheckEvaluation,
    AssetMaterialization,
    DagsterType,
    Failure,
    In,
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
from .step_records import (
    DECIDED_SELECTION,
    DUE_SELECTION,
    WRITTEN_CYCLE,
    DecidedSelection,
    DueSelection,
    WrittenCycle,
)

CYCLE_REPORT = DagsterType(
    name="CycleReport",
    description="The whole cycle: counts, what was published, the backlog left (also the asset's "
    "metadata).",
    typing_type=cycle.CycleReport,
    type_check_fn=lambda _context, value: isinstance(value, cycle.CycleReport),
)


@op(
    out=Out(DUE_SELECTION),
    description="Due Pending rows, oldest first, reserved for this run in a "
    "short transaction (FOR UPDATE SKIP LOCKED).",
)
def select_due_batch(
    context: OpExecutionContext, config: CycleConfig, postgres: PostgresResource
) -> DueSelection:
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
        reserved = cycle.select(postgres.engine, started, journal=journal)
    return DueSelection(started, reserved.ids, reserved.skipped_locked, reserved.next_from)


@op(
    ins={"selection": In(DUE_SELECTION)},
    out=Out(DECIDED_SELECTION),
    description="Send for a Planned/InProgress event, skip for Cancelled/"
    "Completed, from the events' status now (a preview).",
)
def resolve_event_status(
    context: OpExecutionContext, selection: DueSelection, postgres: PostgresResource
) -> DecidedSelection:
    """Step 2: the decision per row; the writing step decides again on what it reads under lock."""
    selection = DueSelection.read(selection)
    decided = cycle.decide(postgres.engine, selection.ids)
    context.log.info(
        f"preview: {len(decided.send)} to send, {len(decided.skip)} to skip "
        "(decided again under lock by transition_and_outbox)"
    )
    return DecidedSelection(selection, decided)


@op(
    ins={"decisions": In(DECIDED_SELECTION)},
    out=Out(WRITTEN_CYCLE),
    description="Lock and re-read the rows, move them Sent/Skipped with one "
    "outbox row per Sent, in one transaction; drain on if configured.",
)
def transition_and_outbox(
    context: OpExecutionContext,
    decisions: DecidedSelection,
    postgres: PostgresResource,
    kafka: KafkaResource,
) -> WrittenCycle:
    """Step 3: write the batch; with ``max_batches`` > 1 keep draining, publishing as it goes."""
    refuse_overridden_limits(context)
    selection = DecidedSelection.read(decisions).selection
    with FoldingJournal(context.log) as journal:
        written = cycle.write(
            postgres.engine,
            selection.cycle,
            selection.ids,
            run_id=context.run_id,
            skipped_locked=selection.skipped_locked,
            after=selection.after,
            publisher=kafka.ready_publisher(),
            journal=journal,
            writer=cycle.WRITER_DAGSTER,
        )
    return WrittenCycle(selection.cycle, written)


@op(
    ins={"written": In(WRITTEN_CYCLE)},
    out=Out(CYCLE_REPORT),
    description="Publish unpublished outbox rows to Kafka, measure the backlog, "
    "record the run's figures on the asset and evaluate its checks.",
)
def relay_outbox(
    context: OpExecutionContext,
    written: WrittenCycle,
    postgres: PostgresResource,
    kafka: KafkaResource,
) -> Iterator[AssetCheckEvaluation | AssetMaterialization | Output[cycle.CycleReport]]:
    """Step 4: relay, then one materialization of the dispatcher and its checks; Failure if
    Kafka failed."""
    refuse_overridden_limits(context)
    step = WrittenCycle.read(written)
    with FoldingJournal(context.log) as journal:
        report = cycle.relay(
            postgres.engine,
            step.cycle,
            step.written,
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
    yield Output(report)
