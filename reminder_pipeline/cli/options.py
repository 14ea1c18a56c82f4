"""The commands' values and the options more than one command uses, each defined once.

Every value is checked by the validators in :mod:`reminder_pipeline.config`, the ones the
environment and the Dagster run config use, so a bad value is the same one line wherever it comes
from, naming it as the operator gave it (``--batch-size`` or ``REMINDER_BATCH_SIZE``).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import click
from click.core import ParameterSource

from ..config import (
    DEFAULT_CYCLE_BUDGET_SECONDS,
    ConfigError,
    check_batch_size,
    check_budget_seconds,
    check_max_batches,
    check_number,
    check_poison_limit,
    check_port,
    check_purge_batch_size,
    check_retention_hours,
    is_integer_text,
    parse_as_of,
)
from ..domain.model import parse_uuid

F = TypeVar("F", bound=Callable[..., Any])

# --- values: the shared validators behind click -----------------------------------------------


def _given_as(param: click.Parameter, ctx: click.Context | None) -> str:
    """The name the operator used for a value: its environment variable or its option."""
    if (
        ctx is not None
        and param.name is not None
        and isinstance(param.envvar, str)
        and ctx.get_parameter_source(param.name) is ParameterSource.ENVIRONMENT
    ):
        return param.envvar
    if isinstance(param, click.Option):
        return max(param.opts, key=len)
    return param.human_readable_name


def given_as(name: str) -> str:
    """How the operator gave the running command's value ``name``: its option or its variable."""
    ctx = click.get_current_context()
    [param] = [p for p in ctx.command.params if p.name == name]
    return _given_as(param, ctx)


if TYPE_CHECKING:
    _ParamType = click.ParamType[Any, Any]  # generic in click 8.5's types, not before at runtime
else:
    _ParamType = click.ParamType


class IntRange(click.IntRange):
    """click's ``IntRange`` over ASCII digits only: Python's ``int()`` behind it also takes
    another script's digits (``٣``) and ``1_000``, which no operator types as a number."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        """The integer, refused in click's words unless written in ASCII digits."""
        if isinstance(value, str) and not is_integer_text(value):
            self.fail(f"{value!r} is not a valid integer.", param, ctx)
        return super().convert(value, param, ctx)


class Checked(_ParamType):
    """A click type that converts through one of :mod:`reminder_pipeline.config`'s validators."""

    def __init__(self, check: Callable[[object, str], Any], metavar: str) -> None:
        self.check = check
        self.metavar = metavar
        self.name = metavar.lower()

    def get_metavar(self, param: click.Parameter, ctx: click.Context | None = None) -> str:
        """The placeholder shown in ``--help``."""
        return self.metavar

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        """The checked value; a bad one raises the validator's one-line ConfigError (exit 2)."""
        name = _given_as(param, ctx) if param is not None else "value"
        return self.check(value, name)


BATCH_SIZE_TYPE = Checked(check_batch_size, "ROWS")
MAX_BATCHES_TYPE = Checked(check_max_batches, "N")
BUDGET_SECONDS_TYPE = Checked(check_budget_seconds, "SECONDS")
#: AsOf's form only: whether it is in the future is checked against the database's clock, once the
#: command is connected (``cycle.check_as_of_on_database``), never against this host's.
AS_OF_TYPE = Checked(parse_as_of, "ISO-8601")
RETENTION_HOURS_TYPE = Checked(check_retention_hours, "HOURS")
PURGE_BATCH_SIZE_TYPE = Checked(check_purge_batch_size, "ROWS")
POISON_LIMIT_TYPE = Checked(check_poison_limit, "ROWS")
PORT_TYPE = Checked(check_port, "PORT")
PROGRESS_SECONDS_TYPE = Checked(
    lambda value, name: check_number(value, name, 0.0, 3600.0), "SECONDS"
)


def _uuid_check(what: str) -> Callable[[object, str], uuid.UUID]:
    def check(value: object, name: str) -> uuid.UUID:
        try:
            return parse_uuid(value)  # RFC 9562's URN form too, in any case
        except ValueError:
            raise ConfigError(f"{name}={value!r} is not {what} (a UUID)") from None

    return check


REMINDER_ID_TYPE = Checked(_uuid_check("a reminder id"), "REMINDER_ID")
EVENT_ID_TYPE = Checked(_uuid_check("an event id"), "EVENT_ID")


def _check_kind(value: object, name: str) -> str:
    """The finder's check (:func:`..operator_jobs.finder.check_kind`), imported when used."""
    from ..operator_jobs.finder import check_kind

    return check_kind(value, name)


#: ``--kind``: one of the contract's event kinds (a misspelt one would quietly match nothing).
KIND_TYPE = Checked(_check_kind, "KIND")


# --- options: the shape every command's options share ------------------------------------------


class EnvOption(click.Option):
    """An option that may come from an environment variable: a bad value is reported under the
    name it was given by (click names both, ``'--hours' (env var: ...)``, wherever it came from)."""

    def get_error_hint(self, ctx: click.Context | None) -> str:
        """The option as typed, or its variable when the value came from the environment."""
        return f"'{_given_as(self, ctx)}'"


def env_option(*decls: str, envvar: str, **attrs: Any) -> Callable[[F], F]:
    """An option that may also come from the environment variable ``envvar`` (shown in --help)."""
    return click.option(*decls, cls=EnvOption, envvar=envvar, show_envvar=True, **attrs)


def flag(*decls: str, envvar: str, help: str) -> Callable[[F], F]:
    """An on/off option, off unless given (or its environment variable is true)."""
    return env_option(*decls, envvar=envvar, is_flag=True, default=False, help=help)


# --- options more than one command uses ---------------------------------------------------------

#: ``--json``: data for scripts instead of text.
json_option = flag(
    "--json",
    "as_json",
    envvar="REMINDER_JSON",
    help="Print the result as JSON (data for scripts) instead of text.",
)

#: ``--force`` of ``poison retry`` and ``poison skip``: never from the environment.
force_option = click.option(
    "--force",
    is_flag=True,
    default=False,
    help="Act on a Pending row even if it never failed. No environment variable: "
    "it must be typed each time.",
)


def budget_option(help: str) -> Callable[[F], F]:
    """``--budget-seconds`` of ``dispatch`` and ``relay`` (REMINDER_CYCLE_BUDGET_SECONDS)."""
    return env_option(
        "--budget-seconds",
        type=BUDGET_SECONDS_TYPE,
        default=DEFAULT_CYCLE_BUDGET_SECONDS,
        envvar="REMINDER_CYCLE_BUDGET_SECONDS",
        help=help,
    )


def batch_size_option(
    type: Checked,
    default: int,
    envvar: str,
    help: str,
) -> Callable[[F], F]:
    """``--batch-size`` (``dispatch``: rows per cycle batch; ``outbox purge``: per DELETE)."""
    return env_option("--batch-size", type=type, default=default, envvar=envvar, help=help)


def port_option(
    *decls: str,
    envvar: str,
    help: str,
    default: int | None = None,
    show_default: str | bool | None = None,
) -> Callable[[F], F]:
    """A port to serve on (``metrics --port``, ``consume --metrics-port``), 1..65,535."""
    return env_option(
        *decls, type=PORT_TYPE, default=default, envvar=envvar, show_default=show_default, help=help
    )
