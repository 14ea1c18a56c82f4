"""``reminder_dispatch`` and ``reminder_catch_up`` executed in process on the real Postgres and broker."""

from __future__ import annotations

import pickle
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone

import pytest
import sqlalchemy as sa
from dagster import (
    DagsterInstance,
    DagsterInvalidConfigError,
    instance_for_test,
    validate_run_config,
)

from reminder_pipeline import config as settings_module
from reminder_pipeline.cycle import database_now
from reminder_pipeline.defs.assets import DISPATCH_ASSET_KEY, NUMERIC_METADATA
from reminder_pipeline.defs.jobs import reminder_catch_up, reminder_dispatch
from reminder_pipeline.domain import contract
from reminder_pipeline.domain.lateness import LATENESS_BUCKETS, bucket_counts
from reminder_pipeline_tests.support import (
    bulk_due,
    make_due_event,
    outbox_rows,
    reminders,
    utcnow,
)

from .helpers import instance_overrides, log_messages, metadata_values, resources_for


@pytest.fixture
def instance() -> Iterator[DagsterInstance]:
    """A throwaway instance with the shipped python_logs settings."""
    with instance_for_test(overrides=instance_overrides()) as instance:
        yield instance


def _reminder_id(engine, event_id):
    (row,) = reminders(engine, event_id)
    return row["id"]


def test_dispatch_run_sends_skips_publishes_and_records_the_figures(
    engine, database_url, kafka_settings, kafka_reader, instance
):
    live = [make_due_event(engine, minutes_overdue=1 + i) for i in range(3)]
    cancelled = make_due_event(engine, minutes_overdue=2, status="Cancelled")
    future = make_due_event(engine, minutes_overdue=-30)

    result = reminder_dispatch.execute_in_process(
        instance=instance, resources=resources_for(database_url, kafka_settings)
    )

    assert result.success
    run_id = result.run_id
    live_ids = {_reminder_id(engine, e) for e in live}
    by_event = {e: reminders(engine, e)[0] for e in [*live, cancelled, future]}
    assert all(by_event[e]["status"] == "Sent" and by_event[e]["sent_at"] for e in live)
    assert by_event[cancelled]["status"] == "Skipped"
    assert by_event[future]["status"] == "Pending"

    rows = outbox_rows(engine)
    assert {r["reminder_id"] for r in rows} == live_ids
    assert all(r["published_at"] is not None for r in rows)
    messages = kafka_reader.wait_for(live_ids)
    assert {m.value["ReminderId"] for m in messages} == {str(i) for i in live_ids}
    # The run id is the correlation id.
    assert {m.headers[contract.HEADER_CORRELATION_ID] for m in messages} == {run_id}

    (materialization,) = result.asset_materializations_for_node("relay_outbox")
    assert materialization.asset_key == DISPATCH_ASSET_KEY
    meta = metadata_values(materialization)
    assert {
        k: meta[k]
        for k in (
            "sent_count",
            "skipped_count",
            "skipped_locked_count",
            "failed_count",
            "published_count",
            "publish_failed_count",
            "backlog_remaining",
            "outbox_unpublished",
            "batch_size",
            "batches",
        )
    } == {
        "sent_count": 3,
        "skipped_count": 1,
        "skipped_locked_count": 0,
        "failed_count": 0,
        "published_count": 3,
        "publish_failed_count": 0,
        "backlog_remaining": 0,
        "outbox_unpublished": 0,
        "batch_size": 200,
        "batches": 1,
    }
    # Numbers are never None, so Dagster plots every point.
    assert all(isinstance(meta[k], int | float) for k in NUMERIC_METADATA)
    assert meta["duration_ms"] > 0
    assert meta["oldest_due_age_seconds"] == 0.0
    assert 150 <= meta["max_lateness_seconds"] <= 240  # the oldest was due ~3 minutes ago
    assert abs(meta["as_of"] - utcnow().timestamp()) < 60

    report = result.output_for_node("relay_outbox")  # the cycle's typed report
    assert report.run_id == run_id and report.counts.sent == 3

    # The package's stdlib logs are in the run's event log, with their ids (no PII).
    lines = log_messages(instance, run_id)
    assert any("cycle started" in line and f"run_id={run_id}" in line for line in lines)
    assert any("batch selected" in line and "count=4" in line for line in lines)
    for reminder_id in live_ids:
        assert any(
            "reminder sent" in line and f"reminder_id={reminder_id}" in line for line in lines
        )
    assert any("cycle completed" in line and "sent=3" in line for line in lines)
    assert not any("Secret deal" in line or "Tverskaya" in line for line in lines)


def test_max_batches_1_restores_one_batch_per_run_and_the_backlog_is_reported(
    engine, database_url, kafka_settings, instance
):
    events = [make_due_event(engine, minutes_overdue=10 - i) for i in range(5)]

    result = reminder_dispatch.execute_in_process(
        run_config={"batch_size": 2, "max_batches": 1},
        instance=instance,
        resources=resources_for(database_url, kafka_settings),
    )

    assert result.success
    sent = [e for e in events if reminders(engine, e)[0]["status"] == "Sent"]
    assert sent == events[:2]  # oldest first
    meta = metadata_values(result.asset_materializations_for_node("relay_outbox")[0])
    assert (meta["sent_count"], meta["batches"], meta["backlog_remaining"]) == (2, 1, 3)
    assert 470 <= meta["oldest_due_age_seconds"] <= 540  # the oldest left was due 8 min ago


def test_catch_up_drains_the_backlog_in_batches_in_one_run(
    engine, database_url, kafka_settings, kafka_reader, instance
):
    events = [make_due_event(engine, minutes_overdue=60 - i) for i in range(7)]

    result = reminder_catch_up.execute_in_process(
        run_config={"batch_size": 2},
        instance=instance,
        resources=resources_for(database_url, kafka_settings),
    )

    assert result.success
    assert all(reminders(engine, e)[0]["status"] == "Sent" for e in events)
    ids = [_reminder_id(engine, e) for e in events]
    assert len(kafka_reader.wait_for(ids)) == 7
    meta = metadata_values(result.asset_materializations_for_node("relay_outbox")[0])
    assert (meta["sent_count"], meta["published_count"], meta["backlog_remaining"]) == (7, 7, 0)
    assert meta["batches"] == 4  # 2+2+2+1: the short batch ends the drain
    assert meta["max_lateness_seconds"] >= 54 * 60
    assert result.dagster_run.tags["reminder_pipeline/kind"] == "catch-up"


def test_a_large_drains_step_output_is_a_summary_not_a_float_per_row(
    engine, database_url, kafka_settings, instance
):
    # The write step's output is stored for every run (14 days): its size must not grow with
    # the rows it sent (1.27 MB for a 140,600-row drain when it carried a float per row).
    rows = 5_000
    bulk_due(engine, rows)

    result = reminder_catch_up.execute_in_process(
        run_config={"batch_size": 500},
        instance=instance,
        resources=resources_for(database_url, kafka_settings),
    )

    assert result.success
    written = result.output_for_node("transition_and_outbox")
    assert written.written.counts.sent == rows
    assert len(pickle.dumps(written)) < 2_000  # stored as its plain values
    # What the relay step makes of it: the ledger's histogram and the largest lateness, exact.
    with engine.connect() as conn:
        lateness = (
            conn.execute(
                sa.text(
                    "SELECT EXTRACT(EPOCH FROM sent_at - due_at)::float8 FROM event_reminders "
                    "WHERE status = 'Sent'"
                )
            )
            .scalars()
            .all()
        )
        [row] = conn.execute(sa.text("SELECT * FROM dispatch_cycles")).mappings().all()
    assert row["lateness_count"] == rows
    assert row["lateness_buckets"] == bucket_counts(lateness, LATENESS_BUCKETS)
    meta = metadata_values(result.asset_materializations_for_node("relay_outbox")[0])
    assert meta["max_lateness_seconds"] == pytest.approx(max(lateness), abs=1e-6)


def test_as_of_in_the_past_only_takes_rows_due_before_it(
    engine, database_url, kafka_settings, instance
):
    old = make_due_event(engine, minutes_overdue=10)
    recent = make_due_event(engine, minutes_overdue=1)
    as_of = (utcnow() - timedelta(minutes=5)).isoformat()

    result = reminder_dispatch.execute_in_process(
        run_config={"as_of": as_of},
        instance=instance,
        resources=resources_for(database_url, kafka_settings),
    )

    assert result.success
    assert reminders(engine, old)[0]["status"] == "Sent"
    assert reminders(engine, recent)[0]["status"] == "Pending"


def test_as_of_is_parsed_once_where_it_enters_and_the_steps_hand_on_a_datetime(
    engine, database_url, kafka_settings, instance
):
    make_due_event(engine, minutes_overdue=10)
    as_of = utcnow() - timedelta(minutes=5)

    result = reminder_dispatch.execute_in_process(
        run_config={"as_of": as_of.astimezone(timezone(timedelta(hours=3))).isoformat()},
        instance=instance,
        resources=resources_for(database_url, kafka_settings),
    )

    assert result.success
    # The run config's text became a timezone-aware datetime in select_due_batch; the steps
    # after it get that datetime (the IO manager stores it), never the text again.
    for step in ("select_due_batch", "resolve_event_status", "transition_and_outbox"):
        handed = result.output_for_node(step).plain()["cycle"]["as_of"]
        assert isinstance(handed, datetime) and handed == as_of, step
    assert result.output_for_node("relay_outbox").as_of == as_of


@pytest.mark.parametrize(
    "run_config",
    [{"as_of": "yesterday"}, {"batch_size": 0}],
    ids=["as-of-not-a-time", "batch-0"],
)
def test_a_bad_run_config_is_refused_before_anything_is_written(
    engine, database_url, kafka_settings, instance, run_config
):
    # Every refused value and its message: test_definitions.py (validate_run_config).
    event_id = make_due_event(engine, minutes_overdue=1)

    with pytest.raises(DagsterInvalidConfigError, match="reminder_dispatch run config refused"):
        reminder_dispatch.execute_in_process(
            run_config=run_config,
            instance=instance,
            resources=resources_for(database_url, kafka_settings),
        )

    assert reminders(engine, event_id)[0]["status"] == "Pending"
    assert outbox_rows(engine) == []
    assert instance.get_runs() == []  # refused before a run existed


def test_an_as_of_after_the_database_clock_is_refused_when_the_run_starts(
    engine, database_url, kafka_settings, instance
):
    # The database's clock decides (the host creating the run may be off): the run config's one
    # line, from the first step, before any row is taken.
    event_id = make_due_event(engine, minutes_overdue=1)
    ahead = (database_now(engine) + timedelta(minutes=5)).isoformat()

    result = reminder_dispatch.execute_in_process(
        run_config={"as_of": ahead},
        instance=instance,
        resources=resources_for(database_url, kafka_settings),
        raise_on_error=False,
    )

    assert not result.success
    [failure] = [e for e in result.all_events if e.is_step_failure]
    assert failure.step_key == "select_due_batch"
    description = failure.step_failure_data.user_failure_data.description
    assert description == (
        f"reminder_dispatch run config refused: as_of='{ahead}' is in the future; it must be <= now"
    )
    assert reminders(engine, event_id)[0]["status"] == "Pending"
    assert outbox_rows(engine) == []


class _SlowHostDatetime(datetime):
    """This process's wall clock 20 minutes slow (a host whose clock is behind)."""

    @classmethod
    def now(cls, tz=None):
        return datetime.now(tz) - timedelta(minutes=20)


def test_a_slow_host_launches_an_as_of_the_database_accepts(
    engine, database_url, kafka_settings, instance, monkeypatch
):
    # A host 20 minutes slow took an AsOf a minute ago for the future and refused it at launch.
    monkeypatch.setattr(settings_module, "datetime", _SlowHostDatetime)
    due = make_due_event(engine, minutes_overdue=3)
    as_of = (database_now(engine) - timedelta(minutes=1)).isoformat()

    validate_run_config(reminder_dispatch, {"as_of": as_of})
    result = reminder_dispatch.execute_in_process(
        run_config={"as_of": as_of},
        instance=instance,
        resources=resources_for(database_url, kafka_settings),
    )

    assert result.success
    assert reminders(engine, due)[0]["status"] == "Sent"


def test_an_unreachable_database_fails_the_run_naming_the_setting(kafka_settings, instance):
    from reminder_pipeline.local.servers import free_port

    url = f"postgresql+psycopg://nobody@127.0.0.1:{free_port()}/nothing"
    result = reminder_dispatch.execute_in_process(
        instance=instance, resources=resources_for(url, kafka_settings), raise_on_error=False
    )

    assert not result.success
    errors = [
        e.event_specific_data.error.message
        for e in result.all_events
        if getattr(e.event_specific_data, "error", None) is not None
    ]
    assert any(
        "DATABASE_URL: cannot connect to postgresql+psycopg://nobody@127.0.0.1" in m for m in errors
    ), errors
