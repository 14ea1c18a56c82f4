"""A batch as one statement (store/queries._write_batch: a drain's DISPATCH_DUE_BATCH, a held
batch's WRITE_HELD_BATCH): the messages ``build_payload`` describes, and the batch written again,
its odd rows set apart, whenever a row needs it.

The statement builds each payload in SQL; these tests hold it equal to ``build_payload`` (the
contract's rules in plain Python) over arbitrary well-formed rows, and show that a batch holding
a row the statement cannot vouch for (a non-canonical time zone, a payload that breaks the
contract, data the database refuses) is rolled back and written again: nothing is lost, nothing
is sent twice.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime, timedelta

import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reminder_pipeline import cycle
from reminder_pipeline.domain import time_zones
from reminder_pipeline.domain.payload import build_payload
from reminder_pipeline.domain.plan import message_headers
from reminder_pipeline.store import repository
from reminder_pipeline_tests.support import insert_as_another_writer

ROW_BY_ROW = "batch written again"

canonical = sorted(time_zones.canonical_zones())
well_formed = st.fixed_dictionaries(
    {
        "kind": st.text(
            alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
            min_size=1,
            max_size=64,
        ),
        "status": st.sampled_from(["Planned", "InProgress", "Completed", "Cancelled"]),
        "client": st.booleans(),
        "appointment": st.booleans(),
        "start_at": st.datetimes(
            min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 29), timezones=st.just(UTC)
        ).flatmap(lambda d: st.sampled_from([d, d.replace(microsecond=0)])),
        "time_zone": st.sampled_from(canonical),
        "offset": st.one_of(st.sampled_from([0, 15, 60, 1440, 2**31 - 1]), st.integers(0, 10**6)),
        "due_seconds_ago": st.integers(1, 10**6),
    }
)


def _insert(conn: sa.Connection, spec: dict) -> str:
    due = timedelta(seconds=spec["due_seconds_ago"])
    return str(insert_as_another_writer(conn, {**spec, "due": due}))


def _expected(engine: sa.Engine, as_of: datetime) -> dict[str, dict]:
    """The due rows as the selection reads them (then rolled back), for build_payload."""
    with engine.connect() as conn:
        due = repository.select_due_for_update_skip_locked(conn, as_of, 1000).reminders
        conn.rollback()
    return {r.reminder_id: r for r in due}


def _outbox(engine: sa.Engine) -> dict[str, tuple[dict, dict]]:
    with engine.connect() as conn:
        rows = conn.execute(
            sa.text("SELECT CAST(reminder_id AS text) AS r, payload, headers FROM outbox")
        ).all()
    return {r.r: (r.payload, r.headers) for r in rows}


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(batch=st.lists(well_formed, min_size=1, max_size=8))
def test_the_statement_builds_exactly_the_payload_build_payload_builds(engine, batch, caplog):
    with engine.begin() as conn:
        conn.exec_driver_sql("TRUNCATE outbox, event_reminders, calendar_events")
        ids = [_insert(conn, spec) for spec in batch]
    as_of = cycle.now_utc()
    expected = _expected(engine, as_of)
    assert sorted(expected) == sorted(ids)

    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger="reminder_pipeline"):
        outcome = cycle.dispatch_batch(engine, as_of, 500, correlation_id="run-1")

    assert ROW_BY_ROW not in [r.getMessage() for r in caplog.records]  # one statement wrote it
    live = {rid for rid, r in expected.items() if r.event_status in ("Planned", "InProgress")}
    assert {r.reminder_id for r in outcome.sent} == live
    assert {r.reminder_id for r in outcome.skipped} == set(ids) - live
    stored = _outbox(engine)
    assert set(stored) == live
    for reminder_id in live:
        payload, headers = stored[reminder_id]
        assert payload == build_payload(expected[reminder_id])
        assert headers == message_headers(reminder_id, "run-1", {})
    # The messages handed to the relay are the stored rows.
    for message, sent in zip(outcome.messages, outcome.sent, strict=True):
        assert json.loads(message.payload) == stored[sent.reminder_id][0]
        assert message.message_key == sent.event_id
        assert message.headers == message_headers(sent.reminder_id, "run-1", {})


def _due_event(conn: sa.Connection, **spec: object) -> str:
    base = {
        "kind": "Meeting",
        "status": "Planned",
        "client": True,
        "appointment": False,
        "start_at": datetime.now(UTC) + timedelta(hours=1),
        "time_zone": "Europe/Moscow",
        "offset": 60,
        "due_seconds_ago": 30,
    }
    return _insert(conn, {**base, **spec})


def test_a_batch_with_a_non_canonical_zone_is_written_row_by_row(engine, caplog):
    with engine.begin() as conn:
        good = [_due_event(conn) for _ in range(3)]
        odd = _due_event(conn, time_zone="Mars/Base")

    with caplog.at_level(logging.DEBUG, logger="reminder_pipeline"):
        outcome = cycle.dispatch_batch(engine, cycle.now_utc(), 500, correlation_id="run-2")

    [line] = [r for r in caplog.records if r.getMessage() == ROW_BY_ROW]
    assert line.fields["reason"] == "payload not sendable as built"
    assert {r.reminder_id for r in outcome.sent} == {*good, odd}
    assert [r.reminder_id for r in outcome.time_zone_fallbacks] == [odd]
    stored = _outbox(engine)
    assert len(stored) == 4  # one row each: the statement's rows were rolled back
    assert stored[odd][0]["TimeZone"] == "UTC"
    assert {stored[g][0]["TimeZone"] for g in good} == {"Europe/Moscow"}


def test_a_poison_row_in_a_batch_is_isolated_the_rest_sent_once(engine, caplog):
    with engine.begin() as conn:
        good = [_due_event(conn) for _ in range(3)]
        poison = _due_event(conn, kind="")
        skipped = _due_event(conn, status="Cancelled", kind="")

    with caplog.at_level(logging.DEBUG, logger="reminder_pipeline"):
        outcome = cycle.dispatch_batch(engine, cycle.now_utc(), 500)

    assert ROW_BY_ROW in [r.getMessage() for r in caplog.records]
    assert {r.reminder_id for r in outcome.sent} == set(good)
    assert [r.reminder_id for r in outcome.skipped] == [skipped]
    assert [p.reminder_id for p in outcome.poison] == [poison]
    assert set(_outbox(engine)) == set(good)
    with engine.connect() as conn:
        status, attempts = conn.execute(
            sa.text("SELECT status, attempts FROM event_reminders WHERE id = :id"), {"id": poison}
        ).one()
    assert (status, attempts) == ("Pending", 1)


def test_a_start_outside_the_representable_range_is_poison_not_a_crash(engine):
    with engine.begin() as conn:
        good = _due_event(conn)
        far = _due_event(conn)
        conn.execute(
            sa.text(
                "UPDATE calendar_events SET start_at = 'infinity' WHERE id = "
                "(SELECT calendar_event_id FROM event_reminders WHERE id = :id)"
            ),
            {"id": far},
        )

    outcome = cycle.dispatch_batch(engine, cycle.now_utc(), 500)

    assert [r.reminder_id for r in outcome.sent] == [good]
    assert [p.reminder_id for p in outcome.poison] == [far]
    assert set(_outbox(engine)) == {good}


def test_data_the_database_refuses_sends_the_batch_row_by_row_and_isolates_the_row(engine, caplog):
    with engine.begin() as conn:
        good = [_due_event(conn) for _ in range(3)]
        refused = _due_event(conn)
        # The outbox refuses this one row's message with a data error (a check violation).
        conn.exec_driver_sql(
            "CREATE FUNCTION refuse_one() RETURNS trigger LANGUAGE plpgsql AS $$BEGIN "
            f"IF NEW.reminder_id = '{refused}' THEN RAISE EXCEPTION 'refused' "
            "USING ERRCODE = '23514'; END IF; RETURN NEW; END$$"
        )
        conn.exec_driver_sql(
            "CREATE TRIGGER refuse_one BEFORE INSERT ON outbox "
            "FOR EACH ROW EXECUTE FUNCTION refuse_one()"
        )

    with caplog.at_level(logging.DEBUG, logger="reminder_pipeline"):
        outcome = cycle.dispatch_batch(engine, cycle.now_utc(), 500)

    [line] = [r for r in caplog.records if r.getMessage() == ROW_BY_ROW]
    assert line.fields == {"run_id": None, "reason": "data error", "sqlstate": "23514"}
    assert {r.reminder_id for r in outcome.sent} == set(good)
    assert [p.reminder_id for p in outcome.poison] == [refused]
    assert set(_outbox(engine)) == set(good)  # each once: the statement's writes rolled back
    with engine.connect() as conn:
        status, attempts = conn.execute(
            sa.text("SELECT status, attempts FROM event_reminders WHERE id = :id"),
            {"id": refused},
        ).one()
    assert (status, attempts) == ("Pending", 1)
