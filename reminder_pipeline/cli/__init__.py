"""``reminder-pipeline``: a thin command line over the same use cases the Dagster ops call.

The ``cli`` group and ``main`` are here; each command group is its own module (dispatch and relay,
poison, outbox, db, services, consume, metrics, demo, up), the options they share are in
:mod:`.options`, what they open at run time in :mod:`.context`, what they print in :mod:`.output`,
and every exit code in :mod:`.exits` (docs/cli.md lists them). Only ``db upgrade`` (and ``up``,
the embedded quick start) migrate: the dispatcher's commands run as the least-privilege role and
refuse an old schema.
"""

from __future__ import annotations

import logging

import click

from .. import __version__, logs
from .consume import consume
from .context import DEFAULT_PROGRESS_SECONDS, honour_stop_signals
from .db import db
from .demo import demo
from .dispatch import dispatch, relay_command
from .dlq import dlq
from .exits import EXIT_FAILURE, EXIT_INTERRUPTED, EXIT_OK, EXIT_PARTIAL, EXIT_USAGE, run
from .forecast import forecast_command
from .metrics import metrics
from .options import PROGRESS_SECONDS_TYPE, env_option
from .outbox import outbox_group
from .output import PROG, ProgressLine
from .poison import poison
from .reminders import reminders
from .services import services
from .trace import trace_command
from .up import up

__all__ = [
    "EXIT_FAILURE",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_PARTIAL",
    "EXIT_USAGE",
    "ProgressLine",
    "cli",
    "main",
]


class _Root(click.Group):
    """The root group: ``--verbose`` is also taken after the command (``trace ID --verbose``)."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        """Move every ``--verbose`` before ``--`` to the front, where the root's options are."""
        end = args.index("--") if "--" in args else len(args)
        moved = [a for a in args[:end] if a == "--verbose"]
        rest = [a for a in args[:end] if a != "--verbose"]
        return super().parse_args(ctx, [*moved, *rest, *args[end:]])


@click.group(
    cls=_Root,
    context_settings={
        "show_default": True,
        "help_option_names": ["-h", "--help"],
        "max_content_width": 100,
    },
)
@click.version_option(__version__, "--version", prog_name=PROG, message="%(prog)s %(version)s")
@env_option(
    "--log-level",
    type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
    default=None,
    show_default="WARNING: a command prints only its answer",
    envvar="REMINDER_LOG_LEVEL",
    help="Level of the JSON log lines on stderr (`up`: of its log file, default INFO).",
)
@click.option(
    "-v",
    "--verbose",
    is_flag=True,
    default=False,
    help="Log what the command does (INFO lines) too: --log-level INFO. Also after the command.",
)
@env_option(
    "--progress-seconds",
    type=PROGRESS_SECONDS_TYPE,
    default=DEFAULT_PROGRESS_SECONDS,
    envvar="REMINDER_PROGRESS_SECONDS",
    help="Interval of the progress lines on stderr during long work (0: every step).",
)
@click.pass_context
def cli(ctx: click.Context, log_level: str | None, verbose: bool, progress_seconds: float) -> None:
    """The calendar's reminder dispatcher: the same use cases as the Dagster jobs, from a shell.

    Exit codes: 0 done; 1 runtime failure (a server down, a row not in a state the command may
    change); 2 bad usage or configuration (nothing was started or written); 3 partial publish
    (rows written, some outbox rows left unpublished for the next relay); 130 interrupted.
    """
    chosen = getattr(logging, log_level.upper()) if log_level else None
    if verbose:
        chosen = min(chosen or logging.INFO, logging.INFO)
    logs.configure(logging.WARNING if chosen is None else chosen)
    ctx.obj = {"progress_seconds": progress_seconds, "log_level": chosen}


for _command in (
    dispatch,
    relay_command,
    poison,
    outbox_group,
    db,
    services,
    consume,
    metrics,
    demo,
    up,
):
    cli.add_command(_command)
for _command in (dlq, forecast_command):
    cli.add_command(_command)
cli.add_command(trace_command)
cli.add_command(reminders)


def main(argv: list[str] | None = None) -> int:
    """Entry point: every expected failure is one line on stderr and a documented exit code."""
    honour_stop_signals()
    package = logging.getLogger("reminder_pipeline")
    level = package.level
    try:
        return run(cli, argv, prog_name=PROG)
    finally:
        # The level is this command's: a caller in the same process (a test) keeps its own.
        package.setLevel(level)
