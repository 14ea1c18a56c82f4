"""The jobs' run configuration: the CLI's own validation (``config.check_*``) as Dagster config.

Each job's config is one block at the top of its run config, checked when the run is created (a
config mapping over the op's config class): a bad value is refused in one line, the same line
the CLI and the environment give, before a run exists (Launchpad, GraphQL, schedule).
"""

# No ``from __future__ import annotations``: Dagster reads the fields' annotations.

import uuid
from collections.abc import Mapping
from typing import Any, ClassVar, Literal, Optional

import pydantic
from dagster import Config, ConfigMapping, DagsterInvalidConfigError, OpDefinition
from pydantic import Field, ValidationInfo, field_validator

from .. import config as settings


def describe_validation_error(error: pydantic.ValidationError) -> str:
    """One line per error, joined: ``field=value: reason`` (our own messages as they are)."""
    parts = []
    for item in error.errors():
        name = ".".join(str(p) for p in item.get("loc", ())) or "config"
        message = str(item.get("msg", "invalid")).removeprefix("Value error, ")
        parts.append(
            message if message.startswith(name) else f"{name}={item.get('input')!r}: {message}"
        )
    return "; ".join(parts)


def validated(job_name: str, config_cls: type[Config], op_def: OpDefinition) -> ConfigMapping:
    """The job's run config: the fields of ``config_cls`` at the top level, checked by it."""

    def to_op_config(values: Mapping[str, Any]) -> dict[str, Any]:
        try:
            checked = config_cls(**values)
        except pydantic.ValidationError as error:
            # A DagsterError crosses Dagster's user-code boundary unwrapped: the Launchpad shows
            # this line instead of "the config mapping function has thrown an unexpected error".
            raise DagsterInvalidConfigError(
                f"{job_name} run config refused: {describe_validation_error(error)}",
                [],
                dict(values),
            ) from None
        op_config = {name: getattr(checked, name) for name in type(checked).model_fields}
        return {"ops": {op_def.name: {"config": op_config}}}

    return ConfigMapping(config_fn=to_op_config, config_schema=config_cls.to_config_schema())


class CycleConfig(Config):
    """One dispatch cycle: the batch size, how many batches to drain, the time budget, AsOf."""

    #: The widest budget the job accepts (the run is failed at its ``dagster/max_runtime``).
    max_budget_seconds: ClassVar[float] = 240.0

    batch_size: int = Field(
        default=settings.DEFAULT_BATCH_SIZE,
        description="Rows per batch (each batch one transaction), 1..10,000.",
    )
    max_batches: int = Field(
        default=settings.DEFAULT_MAX_BATCHES,
        description="Batches per run (1 = the design's cycle); more drains a "
        "backlog, publishing as it goes, until the budget is spent.",
    )
    budget_seconds: float = Field(
        default=settings.DEFAULT_CYCLE_BUDGET_SECONDS,
        description="No new batch starts after this many seconds.",
    )
    as_of: Optional[str] = Field(
        default=None,
        description="AsOf, ISO-8601 with a zone (2026-11-30T10:00:00Z); "
        "default now; never in the future.",
    )

    @field_validator("batch_size")
    @classmethod
    def _batch_size(cls, value: int) -> int:
        return settings.check_batch_size(value)

    @field_validator("max_batches")
    @classmethod
    def _max_batches(cls, value: int) -> int:
        return settings.check_max_batches(value)

    @field_validator("budget_seconds")
    @classmethod
    def _budget(cls, value: float) -> float:
        return settings.check_budget_seconds(value, high=cls.max_budget_seconds)

    @field_validator("as_of")
    @classmethod
    def _as_of(cls, value: Optional[str]) -> Optional[str]:
        # Checked again when the run starts: a queued run may start later.
        return None if settings.check_as_of(value) is None else value.strip()


class DispatchRunConfig(CycleConfig):
    """``reminder_dispatch``: the design's cycle (one batch of 200, 30 s, at most 90 s)."""

    max_budget_seconds: ClassVar[float] = 90.0


class CatchUpRunConfig(CycleConfig):
    """``reminder_catch_up``: drain the backlog, batch after batch, in one run (at most 240 s)."""

    max_budget_seconds: ClassVar[float] = 240.0
    max_batches: int = Field(
        default=settings.MAX_BATCHES,
        description="Batches at most; the run stops earlier when nothing due "
        "is left or the budget is spent.",
    )
    budget_seconds: float = Field(
        default=240.0,
        description="At most 240 s, so a catch-up ends within the "
        "5-minute liveness window; launch it again if needed.",
    )


class PoisonConfig(Config):
    """List the poison rows, or retry / skip one by its reminder id."""

    action: Literal["list", "retry", "skip"] = Field(
        default="list",
        description="list: rows with failed attempts and their last error; "
        "retry: clear the back-off; skip: Skipped, never published.",
    )
    reminder_id: Optional[str] = Field(
        default=None,
        validate_default=True,
        description="The reminder's id (from list); for retry/skip.",
    )
    force: bool = Field(default=False, description="Retry/skip a Pending row that never failed.")
    limit: int = Field(default=settings.DEFAULT_POISON_LIMIT, description="Rows listed, 1..1,000.")

    @field_validator("limit")
    @classmethod
    def _limit(cls, value: int) -> int:
        return settings.check_poison_limit(value)

    @field_validator("reminder_id")
    @classmethod
    def _reminder_id(cls, value: Optional[str], info: ValidationInfo) -> Optional[str]:
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


class RetentionConfig(Config):
    """Published outbox rows older than ``retention_hours`` go, ``batch_size`` per transaction."""

    retention_hours: float = Field(
        default=settings.DEFAULT_RETENTION_HOURS,
        description="At least 1 hour (default 168 = 7 days).",
    )
    batch_size: int = Field(
        default=settings.DEFAULT_PURGE_BATCH_SIZE,
        description="Rows per DELETE transaction, 1..10,000.",
    )

    @field_validator("retention_hours")
    @classmethod
    def _retention(cls, value: float) -> float:
        return settings.check_retention_hours(value)

    @field_validator("batch_size")
    @classmethod
    def _batch_size(cls, value: int) -> int:
        return settings.check_purge_batch_size(value)
