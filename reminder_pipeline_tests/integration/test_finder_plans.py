"""The finder's plans at 10M reminders: every filter of ``reminders`` answers from an index.

A database of its own on the session's server, at the migrations' schema, holds 2.5M events
(20 tenants, skewed; 50,000 owners, skewed; 60 % with one of 1M clients; five kinds, skewed) and
their 10M reminders (due over two years and the coming week: Sent and Skipped mostly, Pending
for the coming week and a few poison rows), loaded with a few ``INSERT ... SELECT`` over
``generate_series`` and ANALYZEd. For every filter and the combinations support uses (a client
and a day first), the finder's own statement (:mod:`reminder_pipeline.store.finder`, with its
bind parameters, as the command sends it) is EXPLAINed: each scan of ``event_reminders`` and
``calendar_events`` goes through an index, none is a Seq Scan. The times (EXPLAIN ANALYZE, and
the whole page with its trace items) are printed as figures, not asserted.

The load drops the two tables' indexes and keys and builds them again afterwards from the
definitions the migrations gave them (``pg_get_indexdef`` / ``pg_get_constraintdef`` read before
the drop), which is several times faster than 10M inserts into six indexes; the plans are taken
on exactly the migrations' indexes.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine, make_url

from reminder_pipeline.operator_jobs import finder
from reminder_pipeline.store import finder as finder_store
from reminder_pipeline.store.engine import make_engine

pytestmark = [pytest.mark.slow]

EVENTS = 2_500_000
TABLES = ("calendar_events", "event_reminders")
# Kinds by share: Showing 40 %, Meeting 25 %, Consultation 15 %, Task 15 %, BookingDeadline 5 %.
LOAD = [
    "SELECT setseed(0.35)",
    f"""
    INSERT INTO calendar_events (id, tenant_id, owner_user_id, client_user_id, kind, status,
                                 start_at, time_zone)
    SELECT gen_random_uuid(),
           ('00000000-0000-4000-8000-' || lpad((floor(20 * random() ^ 2))::int::text, 12, '0'))
               ::uuid,
           md5('owner' || floor(50000 * random() ^ 1.5)::int)::uuid,
           CASE WHEN random() < 0.6
                THEN md5('client' || floor(1000000 * random())::int)::uuid END,
           CASE WHEN k < 0.40 THEN 'Showing' WHEN k < 0.65 THEN 'Meeting'
                WHEN k < 0.80 THEN 'Consultation' WHEN k < 0.95 THEN 'Task'
                ELSE 'BookingDeadline' END,
           CASE WHEN random() < 0.05 THEN 'Cancelled'
                WHEN start_at < now() THEN 'Completed' ELSE 'Planned' END,
           start_at, 'Europe/Moscow'
      FROM (SELECT random() AS k,
                   now() - interval '730 days' + random() * interval '737 days' AS start_at
              FROM generate_series(1, {EVENTS})) AS g
    """,
    """
    INSERT INTO event_reminders (id, calendar_event_id, offset_minutes, due_at, status, sent_at,
                                 attempts)
    SELECT gen_random_uuid(), id, m, due,
           CASE WHEN due > now() THEN 'Pending'
                WHEN status = 'Cancelled' OR p < 0.05 THEN 'Skipped'
                WHEN p > 0.99999 THEN 'Pending' ELSE 'Sent' END,
           CASE WHEN due <= now() AND status <> 'Cancelled' AND p BETWEEN 0.05 AND 0.99999
                THEN due + interval '3 seconds' END,
           CASE WHEN due <= now() AND p > 0.99999 THEN 3 ELSE 0 END
      FROM (SELECT e.id, e.status, o.m, e.start_at - o.m * interval '1 minute' AS due,
                   random() AS p
              FROM calendar_events e
             CROSS JOIN (VALUES (1440), (120), (60), (15)) AS o(m)) AS r
    """,
]


def _dsn(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def _load(url: str) -> dict[str, float]:
    """The 10M rows, the indexes and keys built again, ANALYZE; seconds per phase."""
    took: dict[str, float] = {}
    with psycopg.connect(_dsn(url), autocommit=True) as conn:
        conn.execute("SET maintenance_work_mem = '512MB'")
        conn.execute("SET synchronous_commit = off")
        keys = conn.execute(
            "SELECT conrelid::regclass::text, conname, pg_get_constraintdef(oid), contype"
            "  FROM pg_constraint WHERE contype IN ('p', 'f', 'u')"
            "   AND conrelid::regclass::text = ANY(%s)",
            [list(TABLES)],
        ).fetchall()
        indexes = conn.execute(
            "SELECT indexname, indexdef FROM pg_indexes WHERE tablename = ANY(%s)"
            "   AND indexname NOT IN (SELECT conname FROM pg_constraint)",
            [list(TABLES)],
        ).fetchall()
        for table, name, _, _kind in sorted(keys, key=lambda k: k[3] != "f"):  # foreign keys first
            conn.execute(f'ALTER TABLE {table} DROP CONSTRAINT "{name}"')
        for name, _ in indexes:
            conn.execute(f'DROP INDEX "{name}"')
        started = time.monotonic()
        for statement in LOAD:
            conn.execute(statement)
        took["insert_s"] = time.monotonic() - started
        started = time.monotonic()
        for table, name, definition, _kind in sorted(keys, key=lambda k: k[3] == "f"):
            conn.execute(f'ALTER TABLE {table} ADD CONSTRAINT "{name}" {definition}')
        for _, definition in indexes:
            conn.execute(definition)
        took["indexes_s"] = time.monotonic() - started
        started = time.monotonic()
        conn.execute("ANALYZE calendar_events, event_reminders")
        took["analyze_s"] = time.monotonic() - started
        rebuilt = {
            row[0]: row[1]
            for row in conn.execute(
                "SELECT indexname, indexdef FROM pg_indexes WHERE tablename = ANY(%s)",
                [list(TABLES)],
            )
        }
    assert dict(indexes).items() <= rebuilt.items()  # the migrations' own
    return took


@pytest.fixture(scope="module")
def big(pg_admin_url: str, template_db: str) -> Iterator[Engine]:
    """A database of its own at the migrations' schema with the 10M reminders."""
    name = f"rp_finder_plans_{uuid.uuid4().hex[:8]}"
    admin = _dsn(pg_admin_url)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{make_url(template_db).database}"')
    url = make_url(pg_admin_url).set(database=name).render_as_string(hide_password=False)
    try:
        started = time.monotonic()
        took = _load(url)
        took["build_s"] = time.monotonic() - started
        print("\nfinder plans: 10M build", json.dumps({k: round(v, 1) for k, v in took.items()}))
        engine = make_engine(url)
        yield engine
        engine.dispose()
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _one(engine: Engine, sql: str, **params: Any) -> Any:
    with engine.connect() as conn:
        return conn.execute(sa.text(sql), params).scalar_one()


def _cases(engine: Engine) -> dict[str, dict[str, Any]]:
    """Each filter and the combinations support uses, with values from the data."""
    busiest_tenant = _one(
        engine,
        "SELECT tenant_id FROM calendar_events GROUP BY 1 ORDER BY count(*) DESC LIMIT 1",
    )
    busiest_owner = _one(engine, "SELECT md5('owner0')::uuid")
    owner = _one(engine, "SELECT md5('owner30000')::uuid")
    client = _one(
        engine,
        "SELECT client_user_id FROM calendar_events WHERE client_user_id IS NOT NULL"
        " AND start_at < now() - interval '30 days' LIMIT 1",
    )
    event = _one(engine, "SELECT id FROM calendar_events LIMIT 1")
    due = _one(
        engine,
        "SELECT r.due_at FROM event_reminders r JOIN calendar_events e"
        " ON e.id = r.calendar_event_id WHERE e.client_user_id = :c LIMIT 1",
        c=client,
    )
    day = datetime.combine(due.astimezone(UTC).date(), datetime.min.time(), tzinfo=UTC)
    the_day = {"due_from": day, "due_before": day + timedelta(days=1)}
    after = (day, uuid.UUID(int=2**127))
    return {
        "none": {},
        "owner": {"owner": owner},
        "busiest owner": {"owner": busiest_owner},
        "client": {"client": client},
        "tenant (busiest)": {"tenant": busiest_tenant},
        "event": {"event": event},
        "status Pending": {"statuses": ["Pending"]},
        "status Sent": {"statuses": ["Sent"]},
        "status Skipped": {"statuses": ["Skipped"]},
        "status Pending+Skipped": {"statuses": ["Pending", "Skipped"]},
        "kind BookingDeadline": {"kind": "BookingDeadline"},
        "kind Showing": {"kind": "Showing"},
        "due from": {"due_from": day},
        "due to": {"due_before": day},
        "a day": the_day,
        "client + day": {"client": client, **the_day},
        "tenant + day": {"tenant": busiest_tenant, **the_day},
        "owner + Sent + Showing": {"owner": owner, "statuses": ["Sent"], "kind": "Showing"},
        "kind + day + Skipped": {"kind": "Task", "statuses": ["Skipped"], **the_day},
        "next page": {"after": after},
        "tenant, next page": {"tenant": busiest_tenant, "after": after},
    }


def _scans(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", ()):
        yield from _scans(child)


def test_every_filter_answers_from_an_index_at_10m_reminders(big: Engine) -> None:
    with big.connect() as conn:
        total = conn.execute(sa.text("SELECT count(*) FROM event_reminders")).scalar_one()
    assert total == 4 * EVENTS
    figures: dict[str, dict[str, Any]] = {}
    wrong: dict[str, list[str]] = {}
    for name, filters in _cases(big).items():
        params = finder_store.find_params(**filters)
        given = [n for n in finder_store.CONDITIONS if n in params]
        statement = finder_store.find_statement(given)
        marks = ("after", "pending", "settled")
        values = {k: v for k, v in params.items() if k not in marks} | {"limit": 51}
        with big.connect() as conn:
            [[plan]] = conn.execute(sa.text(f"EXPLAIN (FORMAT JSON) {statement}"), values).one()
            [[analyzed]] = conn.execute(
                sa.text(f"EXPLAIN (ANALYZE, FORMAT JSON) {statement}"), values
            ).one()
        nodes = list(_scans(plan["Plan"]))
        on_tables = [n for n in nodes if n.get("Relation Name") in TABLES]
        kinds = [f"{n['Node Type']} on {n['Relation Name']}" for n in on_tables]
        indexed = [n for n in on_tables if n["Node Type"] != "Seq Scan"]
        if (
            not on_tables
            or len(indexed) != len(on_tables)
            or not any(n["Relation Name"] == "event_reminders" for n in indexed)
        ):
            wrong[name] = kinds
        started = time.monotonic()
        filters_only = {k: v for k, v in filters.items() if k != "after"}
        finder.find(
            big,
            finder.Filters(**{**filters_only, "statuses": tuple(filters_only.get("statuses", ()))}),
            after=filters.get("after"),
            ui_url="http://ui",
        )
        figures[name] = {
            "explain_analyze_ms": round(analyzed["Execution Time"], 1),
            "page_with_trace_ms": round((time.monotonic() - started) * 1000, 1),
            "plan": " / ".join(kinds),
        }
    print("\nfinder plans at 10M reminders:")
    for name, figure in figures.items():
        print(f"  {name:<24} {json.dumps(figure)}")
    assert not wrong, f"scans that are not index scans: {wrong}"
