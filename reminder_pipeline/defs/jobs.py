"""The jobs: ``reminder_dispatch`` (every minute) and ``reminder_catch_up`` over the same four ops,
plus ``reminder_health_checks`` (the asset checks on demand), ``reminder_poison_rows`` and
``outbox_retention``.

All run on the in-process executor (a 4-op run took ~26 s with a process per step, ~6 s in
process); correctness does not depend on it, the writing step re-reads under its own lock. The
default fs_io_manager keeps step outputs (plain values), so re-execution from the UI works.
Run config is one block at the top, validated when the run is created (a config mapping over
the op's pydantic config class): a bad value is refused in one line before a run exists. Only
the two dispatch jobs carry the dispatch concurrency tag (docs/design.md, "Concurrency").
"""

from collections.abc import Mapping
from typing import Any

import pydantic
from dagster import (
    AssetSelection,
    Config,
    ConfigMapping,
    DagsterInvalidConfigError,
    OpDefinition,
    define_asset_job,
    graph,
    in_process_executor,
    job,
)
from pydantic import Field

from .assets import DISPATCH_ASSET_KEY
from .maintenance import PoisonConfig, RetentionConfig, poison_rows, purge_outbox
from .ops import (
    MAX_BATCHES,
    CycleConfig,
    relay_outbox,
    resolve_event_status,
    select_due_batch,
    transition_and_outbox,
)

#: Both jobs carry this tag; dagster.yaml's ``concurrency.runs.tag_concurrency_limits`` lets one
#: such run go at a time, so a manual launch or a catch-up never overlaps a scheduled cycle.
CONCURRENCY_TAG = "reminder_pipeline/concurrency"
CONCURRENCY_VALUE = "dispatch"
CONCURRENCY_TAGS = {CONCURRENCY_TAG: CONCURRENCY_VALUE}

DISPATCH_JOB_NAME = "reminder_dispatch"
CATCH_UP_JOB_NAME = "reminder_catch_up"
HEALTH_JOB_NAME = "reminder_health_checks"
POISON_JOB_NAME = "reminder_poison_rows"
RETENTION_JOB_NAME = "outbox_retention"
KIND_TAG = "reminder_pipeline/kind"

#: Run monitoring fails a run that exceeds its ``dagster/max_runtime``: a hung dispatch run (30 s
#: budget) is failed after 2 min, well before the 5-minute liveness alert, and its transaction
#: rolls back when the worker is terminated. The budget limits keep a healthy run under it.
DISPATCH_MAX_BUDGET_SECONDS = 90.0
DISPATCH_MAX_RUNTIME_SECONDS = 120
CATCH_UP_BUDGET_SECONDS = 240.0
CATCH_UP_MAX_RUNTIME_SECONDS = 285


class DispatchRunConfig(CycleConfig):
    """Run config of ``reminder_dispatch``: the design's cycle (one batch of 200, 30 s budget)."""

    budget_seconds: float = Field(
        default=30.0, ge=1.0, le=DISPATCH_MAX_BUDGET_SECONDS,
        description=(
            f"The cycle's time budget, at most {DISPATCH_MAX_BUDGET_SECONDS:.0f} s "
            f"(the run is failed after {DISPATCH_MAX_RUNTIME_SECONDS} s); "
            f"longer drains: {CATCH_UP_JOB_NAME}."
        ),
    )


class CatchUpRunConfig(CycleConfig):
    """Run config of ``reminder_catch_up``: drain the whole backlog, batch after batch, in one run."""

    max_batches: int = Field(
        default=MAX_BATCHES, ge=1, le=MAX_BATCHES,
        description="Batches at most; the run stops earlier when nothing due is left or the budget is spent.",
    )
    budget_seconds: float = Field(
        default=CATCH_UP_BUDGET_SECONDS, ge=1.0, le=CATCH_UP_BUDGET_SECONDS,
        description=(
            f"Time budget, at most {CATCH_UP_BUDGET_SECONDS:.0f} s so a catch-up ends within the "
            "5-minute liveness window; launch it again if the backlog is larger."
        ),
    )


def describe_validation_error(error: pydantic.ValidationError) -> str:
    """One line per pydantic error, joined: ``field=value: reason``."""
    parts = []
    for item in error.errors():
        name = ".".join(str(p) for p in item.get("loc", ())) or "config"
        message = str(item.get("msg", "invalid")).removeprefix("Value error, ")
        if message.startswith(name):  # our own messages already name the field and value
            parts.append(message)
        else:
            parts.append(f"{name}={item.get('input')!r}: {message}")
    return "; ".join(parts)


def _validated_config(
    job_name: str, config_cls: type[Config], op_def: OpDefinition = select_due_batch
) -> ConfigMapping:
    """The job's run config: the fields of ``config_cls`` at the top level, checked by its validators."""

    def to_op_config(values: Mapping[str, Any]) -> dict[str, Any]:
        try:
            checked = config_cls(**values)
        except pydantic.ValidationError as error:
            # A DagsterError crosses Dagster's user-code boundary unwrapped: the Launchpad shows
            # this line instead of "the config mapping function has thrown an unexpected error".
            raise DagsterInvalidConfigError(
                f"{job_name} run config refused: {describe_validation_error(error)}", [], dict(values)
            ) from None
        # The op's schema is the same class (a subclass's narrower limits were checked above).
        op_config = {name: getattr(checked, name) for name in type(checked).model_fields}
        return {"ops": {op_def.name: {"config": op_config}}}

    return ConfigMapping(config_fn=to_op_config, config_schema=config_cls.to_config_schema())


@graph(description="select_due_batch → resolve_event_status → transition_and_outbox → relay_outbox")
def dispatch_cycle():
    """The design's cycle as four steps."""
    relay_outbox(transition_and_outbox(resolve_event_status(select_due_batch())))


reminder_dispatch = dispatch_cycle.to_job(
    name=DISPATCH_JOB_NAME,
    description=(
        "ReminderDispatchJob: every minute, one batch of due reminders (oldest first) sent or "
        "skipped and published through the outbox. Run config: batch_size, max_batches, "
        "budget_seconds, as_of."
    ),
    config=_validated_config(DISPATCH_JOB_NAME, DispatchRunConfig),
    executor_def=in_process_executor,
    tags={**CONCURRENCY_TAGS, "dagster/max_runtime": str(DISPATCH_MAX_RUNTIME_SECONDS)},
)

reminder_catch_up = dispatch_cycle.to_job(
    name=CATCH_UP_JOB_NAME,
    description=(
        "Catch-up after an outage, launched from the Launchpad: the same four steps, draining the "
        "backlog oldest first in as many batches as fit the time budget (each batch its own "
        "transaction, published as it goes); its materialization shows what was caught up and "
        "what is left. To re-publish messages a consumer lost, use the back-fill instead."
    ),
    config=_validated_config(CATCH_UP_JOB_NAME, CatchUpRunConfig),
    executor_def=in_process_executor,
    tags={
        **CONCURRENCY_TAGS,
        "reminder_pipeline/kind": "catch-up",
        "dagster/max_runtime": str(CATCH_UP_MAX_RUNTIME_SECONDS),
    },
)


reminder_health_checks = define_asset_job(
    name=HEALTH_JOB_NAME,
    selection=AssetSelection.checks_for_assets(DISPATCH_ASSET_KEY),
    description=(
        "The design's alerts as asset checks on calendar/reminder_dispatch (dispatch_liveness, "
        "no_overdue_reminders, dispatch_errors, outbox_backlog, lateness_slo), read from the "
        "database. On demand (Execute in the UI); reminder_health_sensor evaluates the same "
        "checks every minute without a run. Never limited by, nor blocking, the dispatch runs."
    ),
    executor_def=in_process_executor,
    # A minute's evaluation takes well under a second; a hung one is failed before the next pile up.
    tags={KIND_TAG: "health-checks", "dagster/max_runtime": "60"},
)


@job(
    name=POISON_JOB_NAME,
    description=(
        "Poison rows (reminders whose message cannot be built; they stay Pending with a back-off "
        "and count as errors), from the Launchpad. Run config: action = list | retry | skip, "
        "reminder_id (a UUID from list; required for retry and skip), limit. retry clears the "
        "row's back-off so the next cycle tries it again; skip moves it to Skipped (never "
        "published). Each action is logged with the reminder id and run id; a row no longer "
        "Pending fails the run with 'nothing changed'."
    ),
    config=_validated_config(POISON_JOB_NAME, PoisonConfig, poison_rows),
    executor_def=in_process_executor,
    tags={KIND_TAG: "operator", "dagster/max_runtime": "60"},
)
def reminder_poison_rows():
    """One step: the operator's action."""
    poison_rows()


@job(
    name=RETENTION_JOB_NAME,
    description=(
        "Outbox retention: deletes published outbox rows older than retention_hours (default "
        "168) in batches of batch_size (default 1000), each its own short transaction; "
        "unpublished rows are never touched. Daily from outbox_retention_schedule."
    ),
    config=_validated_config(RETENTION_JOB_NAME, RetentionConfig, purge_outbox),
    executor_def=in_process_executor,
    tags={KIND_TAG: "maintenance", "dagster/max_runtime": "300"},
)
def outbox_retention():
    """One step: the purge."""
    purge_outbox()
