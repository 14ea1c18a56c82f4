"""The jobs: ``reminder_dispatch`` (every minute) and ``reminder_catch_up`` over the same four ops,
plus ``reminder_health_checks`` (the asset checks on demand), ``reminder_poison_rows`` and
``outbox_retention``.

All run on the in-process executor (a 4-op run took ~26 s with a process per step, ~6 s in
process); correctness does not depend on it, the writing step re-reads under its own lock. The
default fs_io_manager keeps step outputs (plain values), so re-execution from the UI works. Only
the two dispatch jobs carry the dispatch concurrency tag (docs/design.md, "Concurrency"); a
health check must run while a dispatch run hangs, and the operator jobs are safe next to one.
"""

from dagster import AssetSelection, define_asset_job, graph, in_process_executor, job

from .assets import DISPATCH_ASSET_KEY
from .limits import CONCURRENCY_TAG
from .maintenance import poison_rows, purge_outbox
from .ops import relay_outbox, resolve_event_status, select_due_batch, transition_and_outbox
from .run_config import (
    CatchUpRunConfig,
    DispatchRunConfig,
    PoisonConfig,
    RetentionConfig,
    validated,
)

#: dagster.yaml's ``concurrency.runs.tag_concurrency_limits`` lets this many such runs go at once
#: (1: no overlapping cycles); the schedule follows the same limit. A run launched with another
#: value (or another dagster/max_runtime) refuses to act (limits.py).
CONCURRENCY_VALUE = "dispatch"
CONCURRENCY_TAGS = {CONCURRENCY_TAG: CONCURRENCY_VALUE}
KIND_TAG = "reminder_pipeline/kind"

DISPATCH_JOB_NAME = "reminder_dispatch"
CATCH_UP_JOB_NAME = "reminder_catch_up"
HEALTH_JOB_NAME = "reminder_health_checks"
POISON_JOB_NAME = "reminder_poison_rows"
RETENTION_JOB_NAME = "outbox_retention"

#: Run monitoring fails a run past its ``dagster/max_runtime``: a hung dispatch run is failed
#: after 2 minutes, well before the 5-minute liveness alert (its transaction rolls back). The
#: budgets' limits (config.py) keep a healthy run under it.
DISPATCH_MAX_RUNTIME_SECONDS = 120
CATCH_UP_MAX_RUNTIME_SECONDS = 285


@graph(description="select_due_batch → resolve_event_status → transition_and_outbox → relay_outbox")
def dispatch_cycle() -> None:
    """The design's cycle as four steps."""
    relay_outbox(transition_and_outbox(resolve_event_status(select_due_batch())))


reminder_dispatch = dispatch_cycle.to_job(
    name=DISPATCH_JOB_NAME,
    description="ReminderDispatchJob: every minute, the due reminders (oldest first) sent or "
    "skipped and published through the outbox, in batches of batch_size (each one transaction) "
    "until none is due or the 30 s budget is spent. Run config: batch_size, max_batches "
    "(1 = one batch a cycle), budget_seconds, as_of.",
    config=validated(DISPATCH_JOB_NAME, DispatchRunConfig, select_due_batch),
    executor_def=in_process_executor,
    tags={**CONCURRENCY_TAGS, "dagster/max_runtime": str(DISPATCH_MAX_RUNTIME_SECONDS)},
)

reminder_catch_up = dispatch_cycle.to_job(
    name=CATCH_UP_JOB_NAME,
    description="Catch-up after an outage: the same four steps, draining the backlog oldest "
    "first in as many batches as fit the time budget (each its own transaction, "
    "published as it goes). To re-publish messages a consumer lost, use the "
    "reminder_republish back-fill instead.",
    config=validated(CATCH_UP_JOB_NAME, CatchUpRunConfig, select_due_batch),
    executor_def=in_process_executor,
    tags={
        **CONCURRENCY_TAGS,
        KIND_TAG: "catch-up",
        "dagster/max_runtime": str(CATCH_UP_MAX_RUNTIME_SECONDS),
    },
)

reminder_health_checks = define_asset_job(
    name=HEALTH_JOB_NAME,
    selection=AssetSelection.checks_for_assets(DISPATCH_ASSET_KEY),
    description="The design's alerts as checks on calendar/reminder_dispatch, on demand "
    "(reminder_health_sensor evaluates them every minute without a run).",
    executor_def=in_process_executor,
    tags={KIND_TAG: "health-checks", "dagster/max_runtime": "60"},
)


@job(
    name=POISON_JOB_NAME,
    description="Poison rows (Pending after failed attempts, backing off): action = list | retry "
    "| skip, reminder_id (from list), force (a row that never failed), limit. Each "
    "action is logged; nothing changed fails the run saying why.",
    config=validated(POISON_JOB_NAME, PoisonConfig, poison_rows),
    executor_def=in_process_executor,
    tags={KIND_TAG: "operator", "dagster/max_runtime": "60"},
)
def reminder_poison_rows() -> None:
    """One step: the operator's action."""
    poison_rows()


@job(
    name=RETENTION_JOB_NAME,
    description="Outbox retention: published rows older than retention_hours (default 168) go, "
    "batch_size rows per short transaction; unpublished rows are never touched.",
    config=validated(RETENTION_JOB_NAME, RetentionConfig, purge_outbox),
    executor_def=in_process_executor,
    tags={KIND_TAG: "maintenance", "dagster/max_runtime": "300"},
)
def outbox_retention() -> None:
    """One step: the purge."""
    purge_outbox()
