"""The exact ``skipped_locked`` count reads the due index only up to the last row a batch took.

Real PostgreSQL, EXPLAIN rather than timing. In a catch-up every row of the backlog is due; a
count that could not bound its index scan would read the whole backlog with every batch (it did:
a sequential scan of 100k rows per 1,000-row selection). Both statements that count (the due
query and the reservation of a Dagster run) must carry the bound into the index condition.
"""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from reminder_pipeline.store import queries


def _nodes(node: dict):
    yield node
    for child in node.get("Plans", []):
        yield from _nodes(child)


@pytest.fixture
def due_backlog(engine):
    """20,000 due Pending reminders (a catch-up's shape), analyzed."""
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                """
                WITH ev AS (
                    INSERT INTO calendar_events (id, tenant_id, owner_user_id, kind, start_at, time_zone)
                    SELECT gen_random_uuid(), gen_random_uuid(), gen_random_uuid(), 'Task', now(), 'UTC'
                      FROM generate_series(1, 20000) RETURNING id
                )
                INSERT INTO event_reminders (id, calendar_event_id, offset_minutes, due_at, status)
                SELECT gen_random_uuid(), id, 60, now() - random() * interval '1 day', 'Pending'
                  FROM ev
                """
            )
        )
        conn.exec_driver_sql("ANALYZE event_reminders")
        conn.exec_driver_sql("ANALYZE calendar_events")
    return engine


@pytest.mark.parametrize("statement", ["SELECT_DUE_FOR_UPDATE_SKIP_LOCKED", "RESERVE_DUE"])
def test_the_passed_over_count_is_bounded_in_the_index(due_backlog, statement):
    sql = getattr(queries, statement).text
    for name, value in (
        ("as_of", "now()"),
        ("batch_size", "1000"),
        ("run_id", "'run'"),
        ("seconds", "30"),
        ("from_due_at", "'-infinity'"),
        ("from_id", "'00000000-0000-0000-0000-000000000000'"),
    ):
        sql = sql.replace(f":{name}", value)
    with due_backlog.begin() as conn:  # EXPLAIN of a locking statement takes no lock
        [plan] = conn.exec_driver_sql("EXPLAIN (FORMAT JSON) " + sql).scalar_one()
    nodes = list(_nodes(plan["Plan"]))
    scans = [
        n
        for n in nodes
        if n.get("Relation Name") == "event_reminders"
        or n.get("Index Name") == "ix_event_reminders_status_due_at"
    ]
    assert "Seq Scan" not in {n["Node Type"] for n in scans}
    bounded = [n for n in scans if "ROW(due_at, id) <=" in n.get("Index Cond", "")]
    assert bounded, [(n["Node Type"], n.get("Index Cond"), n.get("Filter")) for n in scans]
