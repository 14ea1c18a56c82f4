"""Migrations: forward on an empty database and at head, matching the declared metadata, and the invariants they enforce."""

from __future__ import annotations

import json
import uuid

import psycopg
import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy.engine import make_url

from reminder_pipeline.store import migrate, queries
from reminder_pipeline.store.engine import make_engine
from reminder_pipeline.store.tables import metadata

from ..support import make_due_event, reminders


@pytest.fixture
def empty_engine(pg_admin_url):
    name = f"rp_empty_{uuid.uuid4().hex[:10]}"
    dsn = make_url(pg_admin_url).set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    engine = make_engine(
        make_url(pg_admin_url).set(database=name).render_as_string(hide_password=False)
    )
    yield engine
    engine.dispose()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE "{name}" WITH (FORCE)')


def test_upgrade_from_empty_then_again_at_head_is_a_no_op(empty_engine):
    assert migrate.current_revision(empty_engine) is None
    migrate.upgrade(empty_engine)
    assert migrate.current_revision(empty_engine) == migrate.head_revision()
    migrate.upgrade(empty_engine)
    assert migrate.current_revision(empty_engine) == migrate.head_revision()


def test_migrated_schema_matches_the_declared_metadata(empty_engine):
    migrate.upgrade(empty_engine)
    with empty_engine.connect() as conn:
        context = MigrationContext.configure(conn, opts={"compare_type": True})
        diff = compare_metadata(context, metadata)
    assert diff == []


def test_downgrade_to_base_and_up_again(empty_engine):
    migrate.upgrade(empty_engine)
    migrate.downgrade(empty_engine, "base")
    with empty_engine.connect() as conn:
        assert not sa.inspect(conn).has_table("event_reminders")
    migrate.upgrade(empty_engine)
    with empty_engine.connect() as conn:
        assert sa.inspect(conn).has_table("outbox")


def test_the_database_refuses_a_second_outbox_row_for_a_reminder(engine):
    event_id = make_due_event(engine)
    [row] = reminders(engine, event_id)
    insert = sa.text(
        "INSERT INTO outbox (topic, message_key, payload, reminder_id) "
        "VALUES ('t', 'k', CAST(:p AS jsonb), :r)"
    )
    with engine.begin() as conn:
        conn.execute(insert, {"p": json.dumps({}), "r": row["id"]})
    with pytest.raises(sa.exc.IntegrityError):
        with engine.begin() as conn:
            conn.execute(insert, {"p": json.dumps({}), "r": row["id"]})


def test_due_query_plan_uses_the_status_due_at_index(engine):
    # Enough terminal rows that a sequential scan would be the wrong plan; EXPLAIN, not timing.
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                """
                WITH ev AS (
                    INSERT INTO calendar_events (id, tenant_id, owner_user_id, kind, start_at, time_zone)
                    SELECT gen_random_uuid(), gen_random_uuid(), gen_random_uuid(), 'Task', now(), 'UTC'
                      FROM generate_series(1, 20000) RETURNING id
                )
                INSERT INTO event_reminders (id, calendar_event_id, offset_minutes, due_at, status, sent_at)
                SELECT gen_random_uuid(), id, 60, now() - interval '1 day', 'Sent', now() FROM ev
                """
            )
        )
        conn.exec_driver_sql("ANALYZE event_reminders")
        conn.exec_driver_sql("ANALYZE calendar_events")
    sql = queries.SELECT_DUE_FOR_UPDATE_SKIP_LOCKED.text
    sql = sql.replace(":as_of", "now()").replace(":batch_size", "200")
    with engine.connect() as conn:
        [plan] = conn.exec_driver_sql("EXPLAIN (FORMAT JSON) " + sql).scalar_one()
    # Two walks of the index: the rows taken, and the count of the rows passed over (locked).
    scans = [n for n in _nodes(plan["Plan"]) if n.get("Relation Name") == "event_reminders"]
    assert [n["Node Type"] for n in scans] == ["Index Scan", "Index Scan"]
    assert {n["Index Name"] for n in scans} == {"ix_event_reminders_status_due_at"}


def _nodes(node: dict):
    yield node
    for child in node.get("Plans", []):
        yield from _nodes(child)
