"""Who moved a reminder out of Pending: the writer names recorded in ``event_reminders.moved_by``
(migration 0007), with the run in ``moved_in_run``; the trace's reason names them.

* ``dagster``: a Dagster run (``moved_in_run`` its run id, a page in the UI);
* ``cli:<command>``: a cycle run by ``reminder-pipeline <command>`` (``cli:dispatch``, ``cli:up``),
  no Dagster run behind it (``moved_in_run`` the run id the command gave the cycle);
* ``operator:<action>``: an operator's action (``operator:poison skip``; ``moved_in_run`` the
  Dagster run that did it, NULL from the command line);
* ``in-process``: a cycle called in process (``cycle.run_cycle`` from tests or benchmarks).

NULL: the calendar moved it (skipped at creation, by a cancel or a completion), or it moved
before migration 0007. The calendar records no writer of its own; the trace names it
``calendar`` (:data:`WRITER_CALENDAR`) when the row and its event show the calendar's skip.
"""

from __future__ import annotations

WRITER_DAGSTER = "dagster"
WRITER_IN_PROCESS = "in-process"
WRITER_POISON_SKIP = "operator:poison skip"
#: Never recorded: the trace's name for the calendar's skips (it leaves ``moved_by`` NULL).
WRITER_CALENDAR = "calendar"
#: The prefixes of a command's and an operator's writer names.
CLI_PREFIX = "cli:"
OPERATOR_PREFIX = "operator:"


def cli_writer(command: str) -> str:
    """The writer name of a cycle run by ``reminder-pipeline COMMAND`` (``cli:COMMAND``)."""
    return f"{CLI_PREFIX}{command}"
