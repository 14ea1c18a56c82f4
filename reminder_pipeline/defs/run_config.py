"""The jobs' run configuration: the CLI's own validation (``config.check_*``) as Dagster config.

Each job's config is one block at the top of its run config, checked when the run is created (a
config mapping over the op's config class): a bad value is refused in one line, the same line
the CLI and the environment give, before a run exists (Launchpad, GraphQL, schedule).
"""

# No ``from __future__ import annotations``: Dagster reads the fields' annotations.

import uuid
from collections.abc import Callable, Mapping
from datetime import datetime
from functools import partial
from typing import Annotated, Any, Literal, Optional, TypeVar

import pydantic
from dagster import Config, ConfigMapping, DagsterInvalidConfigError, OpDefinition
from pydantic import BeforeValidator, Field, model_validator

from ..config import (
    CYCLE_MAX_BATCHES,
    DEFAULT_BATCH_SIZE,
    DEFAULT_CYCLE_BUDGET_SECONDS,
    DEFAULT_POISON_LIMIT,
    DEFAULT_PURGE_BATCH_SIZE,
    DEFAULT_RETENTION_HOURS,
    MAX_BATCHES,
    check_batch_size,
    check_budget_seconds,
    check_max_batches,
    check_poison_limit,
    check_purge_batch_size,
    check_retention_hours,
    parse_as_of,
    parse_range_start,
)


def checked_by(check: Callable[[Any], Any]) -> BeforeValidator:
    """``check`` (a plain ``config.check_*``) as a field's pydantic validator.

    It sees the value as given (the Launchpad's YAML, text or number, before pydantic's own
    coercion), as the CLI and the environment do, and returns what the field holds; ``None`` (an
    optional field left empty) is not checked. Its ``ConfigError`` is the one-line refusal.
    """
    return BeforeValidator(lambda value: value if value is None else check(value))


def describe_validation_error(error: pydantic.ValidationError) -> str:
    """One line per error, joined: our own messages as they are, else ``field=value: reason``."""
    parts = []
    for item in error.errors():
        name = ".".join(str(p) for p in item.get("loc", ()))
        message = str(item.get("msg", "invalid")).removeprefix("Value error, ")
        keep = not name or message.startswith(name)
        parts.append(message if keep else f"{name}={item.get('input')!r}: {message}")
    return "; ".join(parts)


C = TypeVar("C", bound=Config)

#: The longest budget a dispatch run takes (the catch-up's, its default too): it ends within the
#: 5-minute liveness window. The scheduled cycle's is shorter: its run may overlap the next tick.
CATCH_UP_BUDGET_SECONDS = 240.0
DISPATCH_MAX_BUDGET_SECONDS = 90.0


def _refused(job_name: str, reason: str, values: Mapping[str, Any]) -> DagsterInvalidConfigError:
    """The job's one-line refusal (Dagster leaves this error's constructor unannotated)."""
    return DagsterInvalidConfigError(  # type: ignore[no-untyped-call]
        f"{job_name} run config refused: {reason}", [], dict(values)
    )


def checked(job_name: str, config_cls: type[C], values: Mapping[str, Any]) -> C:
    """``values`` as ``config_cls`` (its validators run), or the job's one-line refusal."""
    try:
        return config_cls(**values)
    except pydantic.ValidationError as error:
        # A DagsterError crosses Dagster's user-code boundary unwrapped: the Launchpad shows this
        # line instead of "the config mapping function has thrown an unexpected error".
        raise _refused(job_name, describe_validation_error(error), values) from None


def validated(job_name: str, config_cls: type[Config], op_def: OpDefinition) -> ConfigMapping:
    """The job's run config: the fields of ``config_cls`` at the top level, checked by it."""

    def to_op_config(values: Mapping[str, Any]) -> dict[str, Any]:
        config = checked(job_name, config_cls, values)
        fields = {name: getattr(config, name) for name in type(config).model_fields}
        return {"ops": {op_def.name: {"config": fields}}}

    return ConfigMapping(config_fn=to_op_config, config_schema=config_cls.to_config_schema())


def _as_of(value: str) -> Optional[str]:
    # Its form only: whether it is in the future is checked when the run starts, against the
    # database's clock (select_due_batch), never against the clock of the host that creates it.
    return None if parse_as_of(value) is None else value.strip()


class CycleConfig(Config):
    """One dispatch cycle: the batch size, how many batches to drain, the time budget, AsOf."""

    batch_size: Annotated[int, checked_by(check_batch_size)] = Field(
        default=DEFAULT_BATCH_SIZE,
        description="Rows per batch (each one transaction), 1..10,000.",
    )
    max_batches: Annotated[int, checked_by(check_max_batches)] = Field(
        default=CYCLE_MAX_BATCHES,
        description="Batches per run (1 = the design's cycle); more drains a "
        "backlog, publishing as it goes, until the budget ends.",
    )
    budget_seconds: Annotated[
        float, checked_by(partial(check_budget_seconds, high=CATCH_UP_BUDGET_SECONDS))
    ] = Field(
        default=DEFAULT_CYCLE_BUDGET_SECONDS,
        description="No new batch starts after this many seconds.",
    )
    as_of: Annotated[Optional[str], checked_by(_as_of)] = Field(
        default=None,
        description="AsOf, ISO-8601 with a zone (2026-11-30T10:00:00Z); "
        "default now; never in the future.",
    )

    def as_of_time(self) -> Optional[datetime]:
        """AsOf as the cycle takes it: a timezone-aware datetime (None: the database's now).

        Run config is text (the Launchpad's YAML); this is where it becomes a datetime, with
        the validator's rule (:func:`config.parse_as_of`); the step outputs carry the datetime.
        """
        return parse_as_of(self.as_of)


class DispatchRunConfig(CycleConfig):
    """``reminder_dispatch``: the design's cycle (batches of 200 while due rows remain, 30 s)."""

    budget_seconds: Annotated[
        float, checked_by(partial(check_budget_seconds, high=DISPATCH_MAX_BUDGET_SECONDS))
    ] = Field(
        default=DEFAULT_CYCLE_BUDGET_SECONDS,
        description="No new batch starts after this many seconds (at most "
        f"{DISPATCH_MAX_BUDGET_SECONDS:g}).",
    )
    max_batches: Annotated[int, checked_by(check_max_batches)] = Field(
        default=CYCLE_MAX_BATCHES,
        description="Batches at most (each one transaction); the run stops "
        "earlier when nothing due is left or the budget is spent. 1 = one batch a cycle.",
    )


class CatchUpRunConfig(CycleConfig):
    """``reminder_catch_up``: drain the backlog, batch after batch, in one run (at most 240 s)."""

    max_batches: Annotated[int, checked_by(check_max_batches)] = Field(
        default=MAX_BATCHES,
        description="Batches at most; the run stops earlier when nothing due "
        "is left or the budget is spent.",
    )
    budget_seconds: Annotated[
        float, checked_by(partial(check_budget_seconds, high=CATCH_UP_BUDGET_SECONDS))
    ] = Field(
        default=CATCH_UP_BUDGET_SECONDS,
        description=f"At most {CATCH_UP_BUDGET_SECONDS:g} s, so a catch-up ends within the "
        "5-minute liveness window; launch it again if needed.",
    )


def _reminder_id(value: str) -> str:
    try:
        return str(uuid.UUID(value.strip()))
    except ValueError:
        raise ValueError(f"reminder_id {value.strip()!r} is not a UUID") from None


def _event_id(value: str) -> str:
    try:
        return str(uuid.UUID(value.strip()))
    except ValueError:
        raise ValueError(f"event_id {value.strip()!r} is not a UUID") from None


def _failed_since(value: Any) -> Optional[str]:
    """A time with its zone, or a day alone (its 00:00 UTC): the CLI's ``--failed-since``."""
    if isinstance(value, str) and not value.strip():
        return None
    return parse_range_start(value, "failed_since").isoformat()


def _or_none(check: Callable[[str], Any]) -> Callable[[str], Any]:
    """``check`` for a text field that may be left blank (blank: ``None``)."""
    return lambda value: check(value) if value.strip() else None


def _kind(value: str) -> str:
    """An event Kind of the contract (the finder's check: another is refused listing them)."""
    from ..operator_jobs.finder import check_kind

    return check_kind(value, "kind")


class PoisonConfig(Config):
    """List the poison rows, or retry / skip one by its reminder id, or those a filter takes."""

    action: Literal["list", "retry", "skip"] = Field(
        default="list",
        description="list: rows with failed attempts and their last error; "
        "retry: clear the back-off; skip: Skipped, never published.",
    )
    reminder_id: Annotated[Optional[str], checked_by(_or_none(_reminder_id))] = Field(
        default=None, description="The reminder's id (from list); for retry/skip."
    )
    force: bool = Field(default=False, description="Retry/skip a Pending row that never failed.")
    all: bool = Field(default=False, description="Retry/skip every poison row (a filter).")
    event_id: Annotated[Optional[str], checked_by(_or_none(_event_id))] = Field(
        default=None, description="Retry/skip the poison rows of this event (a filter)."
    )
    kind: Annotated[Optional[str], checked_by(_or_none(_kind))] = Field(
        default=None,
        description="Retry/skip the poison rows of events of this Kind (a filter): Showing, "
        "Consultation, Meeting, Task or BookingDeadline.",
    )
    failed_since: Annotated[Optional[str], checked_by(_failed_since)] = Field(
        default=None,
        description="Retry/skip the poison rows whose last failure is at or after this "
        "ISO-8601 time (a filter).",
    )
    dry_run: bool = Field(
        default=False, description="With a filter: list the rows that would change; change none."
    )
    limit: Annotated[int, checked_by(check_poison_limit)] = Field(
        default=DEFAULT_POISON_LIMIT, description="Rows listed, 1..1,000."
    )

    @property
    def filtered(self) -> bool:
        """Whether a filter selects the rows (not one reminder_id)."""
        return self.all or any(v is not None for v in (self.event_id, self.kind, self.failed_since))

    @model_validator(mode="after")
    def _needs_a_row(self) -> "PoisonConfig":
        conditions = any(v is not None for v in (self.event_id, self.kind, self.failed_since))
        if self.action == "list":
            if self.filtered or self.dry_run:
                raise ValueError("all/event_id/kind/failed_since/dry_run go with retry or skip")
            return self
        if self.reminder_id is not None and self.filtered:
            raise ValueError(
                f"{self.action}: give reminder_id or a filter (all, event_id, kind, "
                "failed_since), not both"
            )
        if self.reminder_id is None and not self.filtered:
            raise ValueError(
                f"{self.action} needs reminder_id or a filter (all, event_id, kind, failed_since)"
            )
        if self.all and conditions:
            raise ValueError("all takes every poison row; drop it or the other filters")
        if self.filtered and self.force:
            raise ValueError("force acts on one reminder_id only; a filter takes poison rows only")
        if self.dry_run and not self.filtered:
            raise ValueError("dry_run goes with a filter (all, event_id, kind, failed_since)")
        return self


class RetentionConfig(Config):
    """Published outbox rows older than ``retention_hours`` go, ``batch_size`` per transaction."""

    retention_hours: Annotated[float, checked_by(check_retention_hours)] = Field(
        default=DEFAULT_RETENTION_HOURS,
        description="At least 1 hour (default 168 = 7 days).",
    )
    batch_size: Annotated[int, checked_by(check_purge_batch_size)] = Field(
        default=DEFAULT_PURGE_BATCH_SIZE,
        description="Rows per DELETE transaction, 1..10,000.",
    )
