"""The audit trail of destructive actions: one logger, a line before acting and one after.

Every destructive command (a poison retry or skip, an outbox purge, a schema downgrade), from
the command line or a Dagster job, logs through :func:`audited` on the logger
``reminder_pipeline.audit``, at WARNING so it is kept: who (the operator), what (the action)
and which target, *before* it acts, so an interrupted or failing action still leaves its line;
then its outcome (or the error's type) after. Identifiers and counts only, never PII.
"""

from __future__ import annotations

import getpass
import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from .logs import RunLog, event, line

#: The one logger of the audit trail (route or keep it by this name).
AUDIT_LOGGER = "reminder_pipeline.audit"
log = logging.getLogger(AUDIT_LOGGER)


def os_user() -> str:
    """Who runs this process (the operator of a command-line action)."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return f"uid {os.getuid()}"


@dataclass
class Outcome:
    """What the action did: the caller fills ``fields`` (and may reword ``message``)."""

    message: str
    fields: dict[str, Any] = field(default_factory=dict)


def _write(run_log: RunLog | None, level: int, message: str, fields: dict[str, Any]) -> None:
    event(log, level, message, **fields)
    if run_log is not None:  # a Dagster run's event log: the same line, readable in the UI
        run_log.log(level, line(message, fields))


@contextmanager
def audited(
    message: str,
    *,
    operator: str,
    action: str,
    run_log: RunLog | None = None,
    **target: Any,
) -> Iterator[Outcome]:
    """Log ``<message> requested`` (who, what, target), run the block, then its outcome.

    The block sets the outcome's fields; an exception is logged as ``<message> failed`` with
    its type (never its text: it may quote a value) and the fields set so far, and re-raised.
    """
    who = {"operator": operator, "action": action, **target}
    _write(run_log, logging.WARNING, f"{message} requested", {**who, "phase": "before"})
    outcome = Outcome(message)
    try:
        yield outcome
    except BaseException as error:
        failed = {**who, "phase": "failed", "error": type(error).__name__, **outcome.fields}
        _write(run_log, logging.ERROR, f"{message} failed", failed)
        raise
    _write(run_log, logging.WARNING, outcome.message, {**who, "phase": "after", **outcome.fields})
