"""One dispatch cycle: the four steps of the design, owned here; the CLI and the ops adapt it.

The Dagster job's steps are ``select_due_batch → resolve_event_status → transition_and_outbox →
relay_outbox`` (the op names). Each is one plain call here, taking and returning plain records
(:mod:`.records`), so a step re-executed from the UI in another process reads them back:

* :func:`start` - the cycle's settings and clock, the database's (``cycle started``);
* :func:`select` - step 1 as an op: due rows reserved for the run in a short transaction of their
  own, so concurrent runs take disjoint batches;
* :func:`decide` - step 2 as an op: the reserved rows' event status, send or skip (a preview);
* :func:`write` - step 3: lock and re-read, decide on that state, write set-based; then, while
  rows are due and the budget lasts, go on draining (each batch one transaction);
* :func:`relay` - step 4: publish what is unpublished, measure the backlog, record the cycle
  (``cycle completed``, the metrics ledger);
* :func:`run_cycle` - all of it in one process (CLI, demo, tests).

Underneath, one batch in the caller's transaction (:mod:`.batch`), every batch by one route
(rows locked and read once, each row's verdict and message decided in Python, one write):
:func:`lock_due` and :func:`lock_candidates` (``FOR UPDATE SKIP LOCKED``), :func:`write_rows`
(decide and write), :func:`dispatch_batch` (a drain's batch: the due rows locked, decided and
written in one transaction, logged after commit); and :func:`drain` (:mod:`.drain`), batch after
batch.
"""

from ..domain.writers import WRITER_DAGSTER, WRITER_IN_PROCESS, cli_writer
from ..observability.ledger import CLOCK_SKEW_WARN_SECONDS
from .batch import dispatch_batch, lock_candidates, lock_due, report_batch, write_rows
from .clock import (
    as_of_or_now,
    check_as_of_on_database,
    database_now,
    now_utc,
    read_clock,
)
from .drain import RELAY_QUEUE_ROWS, drain
from .records import (
    BatchOutcome,
    Cycle,
    CycleReport,
    Decisions,
    Progress,
    Selection,
    Written,
)
from .steps import (
    MIN_RELAY_SECONDS,
    RESERVATION_SECONDS,
    backlog_left,
    decide,
    fail,
    relay,
    run_cycle,
    select,
    start,
    write,
)

__all__ = [
    "CLOCK_SKEW_WARN_SECONDS",
    "MIN_RELAY_SECONDS",
    "RELAY_QUEUE_ROWS",
    "RESERVATION_SECONDS",
    "WRITER_DAGSTER",
    "WRITER_IN_PROCESS",
    "BatchOutcome",
    "Cycle",
    "CycleReport",
    "Decisions",
    "Progress",
    "Selection",
    "Written",
    "as_of_or_now",
    "backlog_left",
    "check_as_of_on_database",
    "cli_writer",
    "database_now",
    "decide",
    "dispatch_batch",
    "drain",
    "fail",
    "lock_candidates",
    "lock_due",
    "now_utc",
    "read_clock",
    "relay",
    "report_batch",
    "run_cycle",
    "select",
    "start",
    "write",
    "write_rows",
]
