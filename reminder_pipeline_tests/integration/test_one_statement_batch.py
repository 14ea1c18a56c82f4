"""One route for a batch (docs/design.md): the rows locked and read once, every verdict known
before the one write, held to the tests' oracle (``reminder_pipeline_tests/oracle.py``).

The cycle gives each locked row its verdict and builds its message in Python, once
(``domain/plan.verdict``, ``domain/payload.py``); the property test holds both to the oracle's plan
(``plan_batch``: the decision, ``build_payload``, the fallback zone, poison) over every event
status the code knows and one it does not, canonical and non-canonical zones, any kind's
characters and each kind of poison row, and holds the text handed to the relay to the outbox's
own text of the message, byte for byte. The other tests show the odd rows set apart in the one
write: nothing is lost, nothing is sent twice, and only a refusal of the database's own is found
row by row.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reminder_pipeline import cycle
from reminder_pipeline.domain import time_zones
from reminder_pipeline.domain.model import DueReminder, EventStatus
from reminder_pipeline.store import repository
from reminder_pipeline_tests import oracle
from reminder_pipeline_tests.support import insert_as_another_writer

#: A status no code knows (another writer's, or a newer version's): a skip, never a send.
UNKNOWN_STATUS = "Postponed"

canonical = sorted(time_zones.canonical_zones())
rows = st.fixed_dictionaries(
    {
        "kind": st.one_of(
            st.text(
                alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
                min_size=1,
                max_size=64,
            ),
            st.sampled_from(["", "K" * 65]),  # poison: empty, longer than the contract allows
        ),
        "status": st.sampled_from([*(s.value for s in EventStatus), UNKNOWN_STATUS]),
        "client": st.booleans(),
        "appointment": st.booleans(),
        "start_at": st.one_of(
            st.datetimes(
                min_value=datetime(1, 1, 2),
                max_value=datetime(9999, 12, 29),
                timezones=st.just(UTC),
            ).flatmap(lambda d: st.sampled_from([d, d.replace(microsecond=0)])),
            st.sampled_from(["infinity", "-infinity"]),  # poison: StartAt out of range
        ),
        "time_zone": st.one_of(
            st.sampled_from(canonical),
            st.sampled_from(["", "Mars/Base", "localtime", "Factory", "europe/moscow"]),
        ),
        "offset": st.one_of(st.sampled_from([0, 15, 60, 1440, 2**31 - 1]), st.integers(0, 10**6)),
        "due_seconds_ago": st.integers(1, 10**6),
    }
)


def _insert(conn: sa.Connection, spec: dict) -> str:
    due = timedelta(seconds=spec["due_seconds_ago"])
    return str(insert_as_another_writer(conn, {**spec, "due": due}))


def _allow_unknown_statuses(engine: sa.Engine) -> None:
    """Drop the CHECK on calendar_events.status in this test's own database, so a status no code
    knows can be stored (as a newer writer's could be)."""
    with engine.begin() as conn:
        name = conn.execute(
            sa.text(
                "SELECT conname FROM pg_constraint WHERE conrelid = 'calendar_events'::regclass "
                "AND contype = 'c' AND pg_get_constraintdef(oid) LIKE '%status%'"
            )
        ).scalar_one()
        conn.exec_driver_sql(f'ALTER TABLE calendar_events DROP CONSTRAINT "{name}"')


def _locked(engine: sa.Engine, as_of: datetime) -> dict[str, DueReminder]:
    """The due rows as the batch reads them under its lock (then rolled back)."""
    with engine.connect() as conn:
        due = repository.select_due_for_update_skip_locked(conn, as_of, 1000).rows
        conn.rollback()
    return {r.reminder_id: r for r in due}


def _outbox(engine: sa.Engine) -> dict[str, tuple[dict, dict]]:
    with engine.connect() as conn:
        stored = conn.execute(
            sa.text("SELECT CAST(reminder_id AS text) AS r, payload, headers FROM outbox")
        ).all()
    return {r.r: (r.payload, r.headers) for r in stored}


def _stored_texts(engine: sa.Engine) -> dict[str, str]:
    """Each outbox row's payload as the relay reads it (its text)."""
    with engine.connect() as conn:
        stored = conn.execute(
            sa.text(
                "SELECT CAST(reminder_id AS text) AS r, CAST(payload AS text) AS stored FROM outbox"
            )
        ).all()
    return {r.r: r.stored for r in stored}


def _ids(items) -> set[str]:
    return {r.reminder_id for r in items}


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(batch=st.lists(rows, min_size=1, max_size=8))
def test_the_batch_decides_and_writes_exactly_what_the_oracle_plans(engine, batch):
    if not getattr(engine, "_unknown_statuses_allowed", False):
        _allow_unknown_statuses(engine)
        engine._unknown_statuses_allowed = True  # type: ignore[attr-defined]
    with engine.begin() as conn:
        conn.exec_driver_sql("TRUNCATE outbox, event_reminders, calendar_events")
        ids = [_insert(conn, spec) for spec in batch]
    as_of = cycle.now_utc()
    locked = _locked(engine, as_of)
    assert sorted(locked) == sorted(ids)
    plan = oracle.plan_batch(list(locked.values()), run_id="run-1")

    outcome = cycle.dispatch_batch(engine, as_of, 500, run_id="run-1")

    assert _ids(outcome.sent) == {r.reminder_id for r, _ in plan.sends}
    assert _ids(outcome.skipped) == _ids(plan.skips)
    assert _ids(outcome.poison) == _ids(plan.poison)
    assert _ids(outcome.time_zone_fallbacks) == _ids(plan.time_zone_fallbacks)
    stored = _outbox(engine)
    assert set(stored) == {r.reminder_id for r, _ in plan.sends}
    for reminder, message in plan.sends:
        payload, headers = stored[reminder.reminder_id]
        assert payload == message.payload
        assert headers == message.headers
    # The messages handed to the relay are the stored rows, oldest first, each the very text the
    # relay would read from the outbox (a re-publish sends the same bytes).
    assert [m.headers["reminder-id"] for m in outcome.messages] == [
        r.reminder_id for r in outcome.sent
    ]
    texts = _stored_texts(engine)
    for message, sent in zip(outcome.messages, outcome.sent, strict=True):
        assert message.payload == texts[sent.reminder_id]
        assert json.loads(message.payload) == stored[sent.reminder_id][0]
        assert message.message_key == sent.event_id
    with engine.connect() as conn:
        pending = conn.execute(
            sa.text(
                "SELECT CAST(id AS text), attempts FROM event_reminders WHERE status = 'Pending'"
            )
        ).all()
    assert {(rid, attempts) for rid, attempts in pending} == {(p, 1) for p in _ids(plan.poison)}


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


@pytest.fixture
def statements(engine):
    """Every statement the engine sends to the server, in order, while the test runs."""
    sent: list[str] = []

    def record(conn, cursor, statement, parameters, context, executemany):
        sent.append(" ".join(statement.split()))

    sa.event.listen(engine, "before_cursor_execute", record)
    yield sent
    sa.event.remove(engine, "before_cursor_execute", record)


def _touching_reminders(statements: list[str]) -> list[str]:
    return [s for s in statements if "event_reminders" in s]


def test_a_batch_locks_and_reads_its_rows_once_and_writes_them_once(engine, statements):
    with engine.begin() as conn:
        sent = [_due_event(conn) for _ in range(3)]
        skipped = _due_event(conn, status="Cancelled")
        odd = _due_event(conn, time_zone="Mars/Base")
        poison = _due_event(conn, kind="")
    statements.clear()

    outcome = cycle.dispatch_batch(engine, cycle.now_utc(), 500)

    assert _ids(outcome.sent) == {*sent, odd}
    assert _ids(outcome.skipped) == {skipped}
    assert _ids(outcome.poison) == {poison}
    lock_and_read, write, back_off = _touching_reminders(statements)
    assert "FOR UPDATE OF r SKIP LOCKED" in lock_and_read
    assert write.startswith("WITH verdict AS") and "INSERT INTO outbox" in write
    assert back_off.startswith("UPDATE event_reminders r SET attempts")
    assert len(_outbox(engine)) == 4


def test_a_batch_with_a_non_canonical_zone_sends_it_with_the_fallback_zone(engine, statements):
    with engine.begin() as conn:
        good = [_due_event(conn) for _ in range(3)]
        odd = _due_event(conn, time_zone="Mars/Base")
    statements.clear()

    outcome = cycle.dispatch_batch(engine, cycle.now_utc(), 500, run_id="run-2")

    assert len(_touching_reminders(statements)) == 2  # locked and read, written: once each
    assert _ids(outcome.sent) == {*good, odd}
    assert [r.reminder_id for r in outcome.time_zone_fallbacks] == [odd]
    stored = _outbox(engine)
    assert len(stored) == 4
    assert stored[odd][0]["TimeZone"] == "UTC"
    assert {stored[g][0]["TimeZone"] for g in good} == {"Europe/Moscow"}
    texts = _stored_texts(engine)
    for message in outcome.messages:
        assert message.payload == texts[message.headers["reminder-id"]]
    [message] = [m for m in outcome.messages if m.headers["reminder-id"] == odd]
    assert json.loads(message.payload) == stored[odd][0]


def test_a_poison_row_in_a_batch_is_isolated_the_rest_sent_once(engine, statements):
    with engine.begin() as conn:
        good = [_due_event(conn) for _ in range(3)]
        poison = _due_event(conn, kind="")
        skipped = _due_event(conn, status="Cancelled", kind="")
    statements.clear()

    outcome = cycle.dispatch_batch(engine, cycle.now_utc(), 500)

    assert len(_touching_reminders(statements)) == 3  # read, written, the poison's back-off
    assert _ids(outcome.sent) == set(good)
    assert [r.reminder_id for r in outcome.skipped] == [skipped]
    assert [p.reminder_id for p in outcome.poison] == [poison]
    assert outcome.poison[0].error.startswith("breaks the contract: Kind")
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


def test_data_the_database_refuses_is_found_row_by_row_and_isolated(engine, statements, caplog):
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
    statements.clear()

    with caplog.at_level(logging.ERROR, logger="reminder_pipeline"):
        outcome = cycle.dispatch_batch(engine, cycle.now_utc(), 500)

    # Read once; the batch's write refused and rolled back to its savepoint, each row written
    # alone (and rolled back), then the rest written once; the refused row backs off.
    reads = [s for s in _touching_reminders(statements) if "FOR UPDATE" in s]
    writes = [s for s in _touching_reminders(statements) if s.startswith("WITH verdict AS")]
    assert len(reads) == 1 and len(writes) == 1 + 4 + 1
    assert _ids(outcome.sent) == set(good)
    assert [p.reminder_id for p in outcome.poison] == [refused]
    assert outcome.poison[0].error == "database rejected the row (SQLSTATE 23514)"
    [line] = [r for r in caplog.records if r.getMessage() == "item failed"]
    assert line.fields["reminder_id"] == refused
    assert set(_outbox(engine)) == set(good)  # each once: the refused write rolled back
    with engine.connect() as conn:
        status, attempts = conn.execute(
            sa.text("SELECT status, attempts FROM event_reminders WHERE id = :id"),
            {"id": refused},
        ).one()
    assert (status, attempts) == ("Pending", 1)
