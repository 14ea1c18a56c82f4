"""A stop mid-cycle: the batch commits or rolls back whole and its locks are free at once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import sqlalchemy as sa

from reminder_pipeline import cycle
from reminder_pipeline.store import repository

from ..support import POISON_KIND, make_due_event, outbox_rows, reminders, utcnow


def _lockable_now(engine) -> int:
    """How many Pending rows another connection can lock right now (NOWAIT)."""
    with engine.begin() as conn:
        return len(
            conn.execute(
                sa.text("SELECT id FROM event_reminders WHERE status = 'Pending' FOR UPDATE NOWAIT")
            ).all()
        )


def test_interrupt_inside_the_transaction_rolls_back_the_whole_batch(engine, monkeypatch):
    events = [make_due_event(engine, minutes_overdue=m) for m in (3, 2)]
    poison = make_due_event(engine, minutes_overdue=1, kind=POISON_KIND)

    def stop(*_args, **_kwargs):
        raise KeyboardInterrupt  # the host stops after the UPDATE, before the commit

    monkeypatch.setattr(repository, "record_poison", stop)
    with pytest.raises(KeyboardInterrupt):
        cycle.dispatch_batch(engine, utcnow(), 200)

    for event_id in [*events, poison]:
        [row] = reminders(engine, event_id)
        assert row["status"] == "Pending" and row["attempts"] == 0
    assert outbox_rows(engine) == []
    assert _lockable_now(engine) == 3


CHILD = textwrap.dedent(
    """
    import sys
    from reminder_pipeline import cycle
    from reminder_pipeline.cli.context import honour_stop_signals
    from reminder_pipeline.store.engine import make_engine
    honour_stop_signals()  # as the command line's entry point does, first thing
    engine = make_engine(sys.argv[1])
    with engine.begin() as conn:
        selection = cycle.lock_due(conn, cycle.now_utc(), 200)
        cycle.write_rows(conn, selection.rows, selection.as_of)
        print("written", len(selection.rows), flush=True)
        sys.stdin.readline()  # stopped here: inside the transaction, before commit
    """
)

#: Generous: the machine may be loaded; an event (the child's exit, the locks freed) ends it.
WAIT_SECONDS = 120


def _background_job() -> None:
    """Start as a shell's background job after Dagster's mapping: SIGINT and SIGTERM ignored."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


@pytest.mark.parametrize("inherited_ignored", [False, True], ids=["plain", "inherited-ignored"])
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGKILL])
def test_process_stopped_before_commit_leaves_nothing_and_no_locks(
    engine, database_url, sig, inherited_ignored
):
    events = [make_due_event(engine, minutes_overdue=m) for m in (2, 1)]
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, database_url],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ},
        preexec_fn=_background_job if inherited_ignored else None,
    )
    try:
        assert child.stdout.readline().strip() == "written 2"
        child.send_signal(sig)
        child.wait(timeout=WAIT_SECONDS)
    finally:
        if child.poll() is None:
            child.kill()
    # The server notices the closed connection and rolls back; the locks go with it.
    deadline = time.monotonic() + WAIT_SECONDS
    while time.monotonic() < deadline:
        try:
            if _lockable_now(engine) == 2:
                break
        except sa.exc.OperationalError:
            continue  # still held for a moment by the dying backend
    assert _lockable_now(engine) == 2
    assert all(reminders(engine, e)[0]["status"] == "Pending" for e in events)
    assert outbox_rows(engine) == []
