"""Property-based: arbitrary rows the schema allows never crash the cycle, break the contract or leak PII.

Odd time zones, far and infinite dates, null optional fields, unknown kinds and huge text in the
PII columns are inserted straight into the tables (as another writer could), then a real cycle
runs on real PostgreSQL.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reminder_pipeline import cycle
from reminder_pipeline.domain import contract
from reminder_pipeline.store.tables import event_reminders
from reminder_pipeline_tests.support import insert_as_another_writer

MARK = "PII-MARK-7f3a"

zones = st.one_of(
    st.sampled_from(
        [
            "Europe/Moscow",
            "UTC",
            "America/Argentina/ComodRivadavia",
            "Etc/GMT+12",
            "Pacific/Chatham",
            "Asia/Kathmandu",
        ]
    ),
    st.sampled_from(["", " ", "Mars/Base", "../etc/passwd", "UTC\\x00", "Europe/" + "X" * 200]),
    st.text(max_size=40),
)
timestamps = st.one_of(
    st.datetimes(
        min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30), timezones=st.just(UTC)
    ),
    st.sampled_from(["infinity", "-infinity", "294000-01-01 00:00Z", "4000-01-01 00:00Z BC"]),
)
pii = st.one_of(
    st.none(),
    st.text(max_size=50).filter(lambda t: "\x00" not in t).map(lambda t: MARK + t),
    st.integers(1, 100_000).map(lambda n: MARK + "x" * n),
)
kinds = st.one_of(
    st.sampled_from(["Showing", "Consultation", "Meeting", "Task", "BookingDeadline"]),
    st.text(min_size=0, max_size=100),
)
events = st.fixed_dictionaries(
    {
        "kind": kinds.filter(lambda k: "\x00" not in k),
        "status": st.sampled_from(["Planned", "InProgress", "Completed", "Cancelled"]),
        "origin": st.sampled_from(["Manual", "Appointment"]),
        "client": st.booleans(),
        "appointment": st.booleans(),
        "start_at": timestamps,
        "time_zone": zones.filter(lambda z: "\x00" not in z),
        "title": pii,
        "description": pii,
        "location": pii,
        "offset": st.integers(0, 2**31 - 1),
        "due": st.one_of(
            st.integers(1, 10**6).map(lambda s: timedelta(seconds=s)),
            st.sampled_from(["-infinity", "4000-01-01 00:00Z BC"]),
        ),
    }
)


@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
    ],
)
@given(batch=st.lists(events, min_size=1, max_size=6))
def test_arbitrary_rows_never_crash_break_the_contract_or_leak(engine, batch):
    with engine.begin() as conn:
        conn.exec_driver_sql("TRUNCATE outbox, event_reminders, calendar_events")
        ids = [insert_as_another_writer(conn, spec) for spec in batch]

    outcome = cycle.dispatch_batch(engine, cycle.now_utc(), 500)

    assert len(outcome.sent) + len(outcome.skipped) + len(outcome.poison) == len(ids)
    with engine.connect() as conn:
        outbox = conn.execute(
            sa.text("SELECT payload::text AS p, headers::text AS h FROM outbox")
        ).all()
        rows = {
            str(r.id): r
            for r in conn.execute(
                sa.select(
                    event_reminders.c.id,
                    event_reminders.c.status,
                    event_reminders.c.attempts,
                    event_reminders.c.last_error,
                )
            )
        }
    assert len(outbox) == len(outcome.sent)
    for row in outbox:
        contract.validate(json.loads(row.p))
        assert MARK not in row.p and MARK not in row.h
    for poison in outcome.poison:
        row = rows[poison.reminder_id]
        assert row.status == "Pending" and row.attempts == 1 and MARK not in (row.last_error or "")
