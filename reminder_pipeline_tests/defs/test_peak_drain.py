"""A burst of reminders due in the same minute is drained by one scheduled ``reminder_dispatch`` run.

On the real Postgres and broker: the schedule's run request (no run config: the shipped defaults)
drains 2,000 rows due in the same minute in batches of 200, each its own transaction, proved from
the database (a trigger records the top-level transaction id of every row moved to Sent and every
outbox row written), publishes them all, ends within its budget and reports the peak on the asset.
A drain whose budget is spent starts no further batch, and the next cycle goes on from the oldest.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa
from dagster import DagsterInstance, RunRequest, build_schedule_context, instance_for_test

from reminder_pipeline import cycle
from reminder_pipeline.defs.jobs import reminder_dispatch
from reminder_pipeline.defs.schedules import reminder_dispatch_schedule
from reminder_pipeline.observability import health
from reminder_pipeline_tests.support import outbox_rows, reminders, utcnow

from .helpers import instance_overrides, log_messages, metadata_values, resources_for

BURST = 2_000

#: Every row moved to Sent and every outbox row written, with the top-level transaction that did
#: it (``txid_current()`` is the top-level id also inside a savepoint, unlike a row's ``xmin``).
TXID_RECORDER = """
CREATE TABLE test_row_txids (what text NOT NULL, reminder_id uuid NOT NULL, txid bigint NOT NULL);
CREATE FUNCTION test_sent_txid() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO test_row_txids VALUES ('event_reminders', NEW.id, txid_current());
    RETURN NEW;
END $$;
CREATE FUNCTION test_outbox_txid() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO test_row_txids VALUES ('outbox', NEW.reminder_id, txid_current());
    RETURN NEW;
END $$;
CREATE TRIGGER test_sent_txid AFTER UPDATE OF status ON event_reminders
    FOR EACH ROW WHEN (NEW.status = 'Sent') EXECUTE FUNCTION test_sent_txid();
CREATE TRIGGER test_outbox_txid AFTER INSERT ON outbox
    FOR EACH ROW EXECUTE FUNCTION test_outbox_txid();
"""


@pytest.fixture
def instance() -> Iterator[DagsterInstance]:
    """A throwaway instance with the shipped logging settings."""
    with instance_for_test(overrides=instance_overrides()) as instance:
        yield instance


def _burst(engine, n: int, *, minute_ago: int = 0) -> None:
    """``n`` live reminders all due within one minute (the top of an hour), ``minute_ago`` back."""
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                """
                WITH ev AS (
                    INSERT INTO calendar_events
                        (id, tenant_id, owner_user_id, kind, start_at, time_zone)
                    SELECT gen_random_uuid(), gen_random_uuid(), gen_random_uuid(), 'Meeting',
                           date_trunc('minute', now()) + interval '15 minutes', 'UTC'
                      FROM generate_series(1, :n)
                    RETURNING id
                )
                INSERT INTO event_reminders (id, calendar_event_id, offset_minutes, due_at)
                SELECT gen_random_uuid(), id, 15,
                       now() - :ago * interval '1 minute' - random() * interval '59 seconds'
                  FROM ev
                """
            ),
            {"n": n, "ago": minute_ago},
        )


def _transactions(engine, what: str) -> Counter[int]:
    with engine.connect() as conn:
        rows = conn.execute(
            sa.text("SELECT txid, count(*) FROM test_row_txids WHERE what = :w GROUP BY txid"),
            {"w": what},
        )
        return Counter(dict(rows.all()))


def test_one_scheduled_run_drains_a_burst_in_transactions_of_at_most_200_rows(
    engine, database_url, kafka_settings, instance
):
    with engine.begin() as conn:
        conn.execute(sa.text(TXID_RECORDER))
    _burst(engine, BURST)
    request = reminder_dispatch_schedule(
        build_schedule_context(instance=instance, scheduled_execution_time=datetime.now(UTC))
    )
    assert isinstance(request, RunRequest)

    result = reminder_dispatch.execute_in_process(
        run_config=request.run_config,
        instance=instance,
        resources=resources_for(database_url, kafka_settings),
        tags=request.tags,
    )

    assert result.success
    rows = reminders(engine)
    assert [r["status"] for r in rows] == ["Sent"] * BURST
    published = outbox_rows(engine)
    assert len(published) == BURST and all(o["published_at"] is not None for o in published)
    # From the database: every transaction that moved rows moved at most 200, and wrote the
    # outbox rows of exactly those rows (the move and the message atomic, batch by batch).
    sent_in, outbox_in = _transactions(engine, "event_reminders"), _transactions(engine, "outbox")
    assert sum(sent_in.values()) == BURST
    assert max(sent_in.values()) <= 200
    assert len(sent_in) == BURST // 200
    assert outbox_in == sent_in
    meta = metadata_values(result.asset_materializations_for_node("relay_outbox")[0])
    assert (meta["sent_count"], meta["published_count"], meta["batches"]) == (BURST, BURST, 10)
    assert (meta["backlog_remaining"], meta["oldest_due_age_seconds"]) == (0, 0.0)
    assert meta["duration_ms"] < 30_000  # within the default 30 s budget
    # The event log stays readable: the drain's batches fold into a summary line.
    lines = log_messages(instance, result.run_id)
    assert any("batches written" in line and "batches=10" in line for line in lines)
    assert sum("reminder sent" in line for line in lines) < BURST


def test_a_spent_budget_starts_no_further_batch_and_the_next_cycle_goes_on_from_the_oldest(engine):
    _burst(engine, 600, minute_ago=2)
    oldest_first = [r["id"] for r in reminders(engine)]

    # A budget spent by the time the first batch commits: that batch, and no other.
    counts, _ = cycle.drain(
        engine, utcnow(), 200, max_batches=100, budget_seconds=30, started=time.time() - 30
    )
    assert (counts.batches, counts.sent) == (1, 200)
    sent = [r["id"] for r in reminders(engine) if r["status"] == "Sent"]
    assert sorted(sent) == sorted(oldest_first[:200])

    counts, _ = cycle.drain(engine, utcnow(), 200, max_batches=100, budget_seconds=30)
    # 200 + 200; the look-up that then finds nothing due ends the drain and is not a batch.
    assert (counts.batches, counts.sent) == (2, 400)
    assert all(r["status"] == "Sent" for r in reminders(engine))


def _checks_in(engine, minutes: float) -> dict[str, bool]:
    """The health checks as they will read ``minutes`` from now if no other run happens."""
    later = datetime.now(UTC) + timedelta(minutes=minutes)
    return {check.name: check.passed for check in health.evaluate(engine, later)}


def test_the_checks_stay_quiet_for_a_burst_drained_in_time_and_fire_when_a_cycle_cannot_keep_up(
    engine, database_url, kafka_settings, instance
):
    resources = resources_for(database_url, kafka_settings)
    _burst(engine, 1_000)
    assert reminder_dispatch.execute_in_process(instance=instance, resources=resources).success
    # Nothing is left to become overdue, and the burst went out well within the SLO.
    quiet = _checks_in(engine, 6)
    assert quiet["no_overdue_reminders"] and quiet["lateness_slo"], quiet

    # The same burst under a literal one-batch cycle: 800 rows wait, overdue in 6 minutes.
    _burst(engine, 1_000)
    assert reminder_dispatch.execute_in_process(
        run_config={"max_batches": 1}, instance=instance, resources=resources
    ).success
    assert not _checks_in(engine, 6)["no_overdue_reminders"]
