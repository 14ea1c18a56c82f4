"""Every exit-code decision of the command line: the codes, and the failures that map to them.

A command returns one of the codes; :func:`run` turns what a command raised into a code and one
line on stderr (docs/cli.md lists the codes; ``reminder_pipeline_tests/docs`` checks the table).
"""

from __future__ import annotations

import click

from ..config import ConfigError
from .context import SchemaNotReady
from .output import print_error

#: The command did what was asked.
EXIT_OK = 0
#: It ran and failed: a server is down or unreachable, or the row it names is not in a state it
#: may change. Nothing was half done (each write is one transaction).
EXIT_FAILURE = 1
#: Bad usage or configuration: an unknown option, a value out of bounds, a missing confirmation,
#: a setting missing or malformed. Refused before anything was started or written.
EXIT_USAGE = 2
#: Partial publish: the rows were written, but some outbox rows could not be published (a
#: failed delivery, or the relay lock held past the budget by a relay that did not publish
#: them); they stay in the outbox and the next relay publishes them.
EXIT_PARTIAL = 3
#: Stopped by Ctrl-C (128 + SIGINT).
EXIT_INTERRUPTED = 130


def relay_exit(failed: int, left: int = 0) -> int:
    """``dispatch`` and ``relay``: 0, or 3 when some outbox rows could not be published:
    ``failed`` deliveries, or rows it was to see out ``left`` unpublished at its end."""
    return EXIT_OK if failed == 0 and left == 0 else EXIT_PARTIAL


def exit_code(error: BaseException) -> int | None:
    """The documented exit code of an expected failure, else None."""
    from sqlalchemy import exc as sa_exc

    from ..local.dagster_processes import OrchestratorError
    from ..local.servers import ServiceError
    from ..store.engine import DatabaseUnavailable
    from ..store.migrations.online_ddl import LockNotGranted

    if isinstance(error, ConfigError):
        return EXIT_USAGE
    if isinstance(
        error,
        DatabaseUnavailable
        | LockNotGranted
        | ServiceError
        | OrchestratorError
        | SchemaNotReady
        | ConnectionError
        | sa_exc.DBAPIError
        | OSError,
    ):
        return EXIT_FAILURE
    try:
        from confluent_kafka import KafkaException
    except ImportError:  # pragma: no cover - a dependency
        return None
    return EXIT_FAILURE if isinstance(error, KafkaException) else None


def consume_exit(error: BaseException) -> tuple[int, str] | None:
    """``consume``: the code and one line of a failure the consumer raised, else None.

    A bad option, or a ``--metrics-port`` that cannot be listened on, is usage (2); the broker,
    the de-duplication store (PostgreSQL or the SQLite file) or the network failing is 1.
    """
    import sqlite3

    from confluent_kafka import KafkaException

    from ..consumer.dedup import DedupStoreError
    from ..messaging.kafka import BrokerUnavailable
    from ..observability.metrics_http import MetricsPortUnavailable

    if isinstance(error, ConfigError | MetricsPortUnavailable):
        return EXIT_USAGE, str(error)
    if isinstance(error, BrokerUnavailable | DedupStoreError | sqlite3.Error | OSError):
        return EXIT_FAILURE, str(error)
    if isinstance(error, KafkaException):
        return EXIT_FAILURE, f"Kafka error: {error}"
    return None


def message(error: BaseException) -> str:
    """One line for an expected failure; a database error's first line, never its parameters."""
    from sqlalchemy import exc as sa_exc

    if isinstance(error, sa_exc.DBAPIError):
        detail = str(error.orig).strip().splitlines()[0] if error.orig else type(error).__name__
        return f"database error: {detail}"
    return str(error) or type(error).__name__


def run(command: click.Command, argv: list[str] | None, prog_name: str) -> int:
    """Run ``command``: every expected failure is one line on stderr and a documented exit code."""
    try:
        result = command.main(args=argv, prog_name=prog_name, standalone_mode=False)
    except click.exceptions.Abort:
        return EXIT_INTERRUPTED
    except click.UsageError as error:
        where = f" (see `{error.ctx.command_path} --help`)" if error.ctx is not None else ""
        print_error(f"{error.format_message()}{where}")
        return EXIT_USAGE
    except click.ClickException as error:
        print_error(error.format_message())
        return error.exit_code
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except Exception as error:  # mapped to a documented exit code, or re-raised
        code = exit_code(error)
        if code is None:
            raise
        print_error(message(error))
        return code
    return result if isinstance(result, int) else EXIT_OK
