"""Migrations: forward on an empty database and at head, matching the declared metadata, and the invariants they enforce."""

from __future__ import annotations

import json
import uuid

import pytest
import sqlalchemy as sa

from reminder_pipeline.store import migrate, outbox_queries, queries
from reminder_pipeline.store.tables import metadata

from ..support import make_due_event, reminders, schema_differences


def test_upgrade_from_empty_then_again_at_head_is_a_no_op(empty_engine):
    assert migrate.current_revision(empty_engine) is None
    migrate.upgrade(empty_engine)
    assert migrate.current_revision(empty_engine) == migrate.head_revision()
    migrate.upgrade(empty_engine)
    assert migrate.current_revision(empty_engine) == migrate.head_revision()


def test_migrated_schema_matches_the_declared_metadata(empty_engine):
    migrate.upgrade(empty_engine)
    assert schema_differences(empty_engine) == []
    # The check compares storage parameters too (Alembic's compare_metadata does not).
    assert metadata.tables["event_reminders"].dialect_options["postgresql"]["with"]


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
    sql = sql.replace(":from_due_at", "'-infinity'").replace(":from_id", f"'{uuid.UUID(int=0)}'")
    with engine.connect() as conn:
        [plan] = conn.exec_driver_sql("EXPLAIN (FORMAT JSON) " + sql).scalar_one()
    # Two walks of the due index (the rows taken from the scan's start, the count of the rows
    # passed over) and two of the poison index (the poison rows due again behind the start, and
    # their count): index scans, never a sequential scan of the reminders.
    scans = [n for n in _nodes(plan["Plan"]) if n.get("Relation Name") == "event_reminders"]
    assert [n["Node Type"] for n in scans] == ["Index Scan"] * 4
    assert {n["Index Name"] for n in scans} == {
        "ix_event_reminders_status_due_at",
        "ix_event_reminders_poison",
    }


def _fill_outbox(conn, rows: int, published_ago: str) -> None:
    """``rows`` published outbox rows with a realistic payload, published ``published_ago``."""
    conn.execute(
        sa.text(
            """
            INSERT INTO outbox (topic, message_key, payload, published_at, reminder_id, due_at)
            SELECT 'pin.calendar.reminder-due.v1', gen_random_uuid()::text,
                   jsonb_build_object('ReminderId', gen_random_uuid(), 'EventId', gen_random_uuid(),
                                      'Kind', 'Meeting', 'StartAt', now(), 'TimeZone', 'UTC'),
                   now() - CAST(:ago AS interval), gen_random_uuid(), now()
              FROM generate_series(1, :rows)
            """
        ),
        {"rows": rows, "ago": published_ago},
    )


def _purge_plan(conn, retention_hours: float) -> dict:
    """EXPLAIN ANALYZE of one purge call (rolled back: the test keeps its rows)."""
    sql = outbox_queries.PURGE_PUBLISHED_OUTBOX.text
    sql = sql.replace(":retention_seconds", str(retention_hours * 3600)).replace(":limit", "1000")
    with conn.begin() as tx:
        [plan] = conn.exec_driver_sql("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + sql).scalar_one()
        tx.rollback()
    return plan


@pytest.mark.parametrize("old_rows", [0, 5_000], ids=["nothing-old-enough", "old-rows-first"])
def test_the_outbox_purge_reads_its_batch_not_the_whole_outbox(engine, old_rows):
    # 60,000 rows published recently: a purge with a 7-day retention has nothing to delete among
    # them. Its last call (the one that finds nothing old enough) once walked the whole outbox.
    with engine.begin() as conn:
        if old_rows:
            _fill_outbox(conn, old_rows, "10 days")
        _fill_outbox(conn, 60_000, "1 hour")
        conn.exec_driver_sql("ANALYZE outbox")
    with engine.connect() as conn:
        pages = conn.exec_driver_sql(
            "SELECT relpages FROM pg_class WHERE relname = 'outbox'"
        ).scalar_one()
        conn.rollback()
        plan = _purge_plan(conn, retention_hours=7 * 24)

    scans = [n for n in _nodes(plan["Plan"]) if n.get("Relation Name") == "outbox"]
    assert {n.get("Index Name") for n in scans if "Index" in n["Node Type"]} >= {
        "ix_outbox_published_at"
    }
    root = plan["Plan"]
    assert root["Actual Rows"] == 1  # one row: the counts (rows, re-publish records); deleted:
    deleted = min(old_rows, 1000)
    [select] = [n for n in scans if n.get("Index Name") == "ix_outbox_published_at"]
    assert select["Actual Rows"] == deleted
    # The buffers read grow with the batch, not with the outbox (once: every page of it).
    buffers = root["Shared Hit Blocks"] + root["Shared Read Blocks"]
    assert pages > 2_000
    assert buffers < 100 + 10 * deleted, (buffers, pages)


def _nodes(node: dict):
    yield node
    for child in node.get("Plans", []):
        yield from _nodes(child)
