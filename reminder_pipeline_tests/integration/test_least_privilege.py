"""The whole cycle runs under the least-privilege role of sql/dispatcher_role.sql, which cannot read PII."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import make_url

from reminder_pipeline import cycle
from reminder_pipeline.db import make_engine

from ..support import POISON_KIND, make_due_event, outbox_rows, reminders

SCRIPT = Path(__file__).resolve().parents[2] / "sql" / "dispatcher_role.sql"


def run_script(engine) -> None:
    """Run the SQL file as psql would (no client-side placeholders)."""
    with engine.begin() as conn:
        conn.connection.dbapi_connection.execute(SCRIPT.read_text())


@pytest.fixture
def dispatcher_engine(engine, database_url):
    login = f"rp_disp_{uuid.uuid4().hex[:8]}"
    run_script(engine)
    with engine.begin() as conn:
        conn.exec_driver_sql(f"CREATE ROLE {login} LOGIN PASSWORD 'dispatcher' IN ROLE reminder_dispatcher")
    url = make_url(database_url).set(username=login, password="dispatcher")
    limited = make_engine(url.render_as_string(hide_password=False))
    yield limited
    limited.dispose()
    with engine.begin() as conn:
        conn.exec_driver_sql(f"DROP OWNED BY {login}")
        conn.exec_driver_sql(f"DROP ROLE {login}")


def test_script_is_idempotent(engine):
    run_script(engine)
    run_script(engine)


def test_full_cycle_under_the_dispatcher_role(engine, dispatcher_engine, publisher):
    live = make_due_event(engine)
    cancelled = make_due_event(engine, status="Cancelled")
    poison = make_due_event(engine, kind=POISON_KIND)

    report = cycle.run_cycle(dispatcher_engine, publisher)

    assert (report.counts.sent, report.counts.skipped, report.counts.failed) == (1, 1, 1)
    assert report.relay.published == 1
    assert reminders(engine, live)[0]["status"] == "Sent"
    assert reminders(engine, cancelled)[0]["status"] == "Skipped"
    assert reminders(engine, poison)[0]["attempts"] == 1
    assert outbox_rows(engine)[0]["published_at"] is not None


@pytest.mark.parametrize("column", ["title", "description", "location"])
def test_dispatcher_role_cannot_read_pii(dispatcher_engine, column):
    with pytest.raises(sa.exc.ProgrammingError, match="permission denied"):
        with dispatcher_engine.connect() as conn:
            conn.execute(sa.text(f"SELECT {column} FROM calendar_events"))


def test_dispatcher_role_cannot_rewrite_events(dispatcher_engine):
    with pytest.raises(sa.exc.ProgrammingError, match="permission denied"):
        with dispatcher_engine.begin() as conn:
            conn.execute(sa.text("UPDATE calendar_events SET status = 'Cancelled'"))
