"""A snapshot held open, on the session's real PostgreSQL (``HeldSnapshot`` of
``reminder_pipeline_testkit.held_snapshot``: the soak's ``long_snapshot`` fault and the
shared-database benchmark's stack B hold one, as a report or a nightly ``pg_dump`` does): while it
is held its session holds back the xmin horizon, as the exporter's holder query sees it, idle in
its transaction while others commit; released, it is gone.
"""

from __future__ import annotations

from sqlalchemy.engine import Engine, make_url

from reminder_pipeline.store.metrics_repository import snapshot_holders
from reminder_pipeline_testkit.held_snapshot import HeldSnapshot

from ..support import make_due_event

NAME = "test-held-snapshot"


def test_a_held_snapshot_holds_back_the_horizon_while_it_lasts_then_lets_go(
    database_url: str, engine: Engine
) -> None:
    def holders() -> list[str | None]:
        with engine.connect() as conn:
            return [h.application_name for h in snapshot_holders(conn)]

    make_due_event(engine)
    dsn = make_url(database_url).set(drivername="postgresql").render_as_string(hide_password=False)
    snapshot = HeldSnapshot(dsn, application_name=NAME)
    try:
        assert snapshot.take() == snapshot.rows_seen >= 1  # its count(*) read the reminders
        assert NAME in holders()  # what the exporter's query sees
        make_due_event(engine)  # another transaction commits meanwhile
        state = snapshot.state()
        assert state is not None and state["state"] == "idle in transaction"
        assert state["xmin_age"] >= 1 and state["age_s"] >= 0
        assert NAME in holders()
    finally:
        released = snapshot.release()
    assert released  # its session lasted to the release
    assert NAME not in holders()
    assert snapshot.release() is False  # nothing held any more
