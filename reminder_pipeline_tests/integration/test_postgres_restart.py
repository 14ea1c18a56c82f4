"""PostgreSQL restarted in the middle of a cycle: the batch fails whole, the next cycle recovers.

A server of this test's own is stopped (fast shutdown: open transactions are rolled back) while a
dispatcher holds a written but uncommitted batch, then started again.
"""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from reminder_pipeline import cycle
from reminder_pipeline.local.servers import EmbeddedPostgres, free_port
from reminder_pipeline.store import migrate
from reminder_pipeline.store.engine import make_engine

from ..support import make_due_event, outbox_rows, reminders


@pytest.fixture
def own_postgres(tmp_path):
    server = EmbeddedPostgres(data_dir=tmp_path / "pg", port=free_port())
    server.start()
    url = server.ensure_database("calendar")
    engine = make_engine(url)
    migrate.upgrade(engine)
    yield server, engine
    engine.dispose()
    server.stop()


def test_restart_mid_cycle_rolls_back_the_batch_and_the_next_cycle_recovers(
    own_postgres, publisher
):
    server, engine = own_postgres
    events = [make_due_event(engine, minutes_overdue=m) for m in (3, 2, 1)]

    with pytest.raises(sa.exc.OperationalError):
        with engine.begin() as conn:
            selection = cycle.lock_due(conn, cycle.now_utc(), 200)
            outcome = cycle.write_rows(conn, selection.rows, selection.as_of)
            assert len(outcome.sent) == 3  # written, not committed
            server.stop()  # the server goes away before the commit
            server.start()
    # Nothing of the half batch survived: no row moved, no outbox row.
    assert [reminders(engine, e)[0]["status"] for e in events] == ["Pending"] * 3
    assert outbox_rows(engine) == []

    report = cycle.run_cycle(engine, publisher)  # the pool drops dead connections (pre-ping)
    assert report.counts.sent == 3 and report.relay.published == 3
    assert len(outbox_rows(engine)) == 3
