"""The forecast before a peak, against the real database: a planted peak is found and warned of.

Reminders planted on coming minutes (on the database's clock) are counted per minute from the
partial Pending index; the drain rate comes from the ledger's cycles (or the stated default);
the ``coming_peak`` asset check, evaluated by the health sensor like the others, warns naming
the minute and both numbers; ``reminder-pipeline forecast --json`` and the exporter's gauges
give the same figures.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime

import sqlalchemy as sa
from dagster import AssetCheckSeverity, build_sensor_context, instance_for_test
from sqlalchemy.engine import Engine

from reminder_pipeline.defs.checks import runbook_link
from reminder_pipeline.defs.resources import PostgresResource
from reminder_pipeline.defs.sensors import reminder_health_sensor
from reminder_pipeline.domain.model import CycleCounts
from reminder_pipeline.observability import exporter as exp
from reminder_pipeline.observability import forecast, health, ledger
from reminder_pipeline.store import forecast as store

from ..integration.test_schema import _nodes
from ..support import run_cli
from .helpers import exporter_settings, scrape

INDEX = "ix_event_reminders_status_due_at"

PLANT = sa.text(
    """
    WITH ev AS (
        INSERT INTO calendar_events (id, tenant_id, owner_user_id, kind, start_at, time_zone)
        SELECT gen_random_uuid(), gen_random_uuid(), gen_random_uuid(), 'Task',
               CAST(:minute AS timestamptz) + interval '1 hour', 'UTC'
          FROM generate_series(1, :n)
        RETURNING id
    )
    INSERT INTO event_reminders (id, calendar_event_id, offset_minutes, due_at)
    SELECT gen_random_uuid(), id, 60, CAST(:minute AS timestamptz) + random() * interval '59 s'
      FROM ev
    """
)


def plant(engine: Engine, n: int, minutes_ahead: int) -> datetime:
    """``n`` Pending reminders due within the minute ``minutes_ahead`` from the database's."""
    with engine.begin() as conn:
        minute = conn.execute(
            sa.text("SELECT date_trunc('minute', now()) + make_interval(mins => :m)"),
            {"m": minutes_ahead},
        ).scalar_one()
        conn.execute(PLANT, {"minute": minute, "n": n})
    return minute


def drained(engine: Engine, rows: int, seconds: float) -> None:
    """A successful cycle in the ledger that moved ``rows`` in ``seconds``."""
    assert ledger.record_cycle(
        engine,
        "forecast-test",
        CycleCounts(sent=rows, duration_ms=int(seconds * 1000)),
        duration_seconds=seconds,
    )


def iso(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")


def test_with_no_history_the_capacity_is_the_stated_default(engine) -> None:
    ahead = forecast.forecast(engine)
    assert ahead.plain()["peak"] == {"minute": None, "due": 0}
    assert ahead.drain_cycles == 0 and ahead.plain()["drain_source"] == "default"
    assert ahead.capacity_per_run == int(forecast.DEFAULT_DRAIN_ROWS_PER_SECOND * 30) == 150_000
    check = health.coming_peak(engine, datetime.now(UTC))
    assert check.passed and check.description.startswith("Nothing due in the next 24 h")


def test_a_planted_peak_is_found_and_the_check_warns_naming_it(engine, database_url) -> None:
    drained(engine, 1_000, 10.0)  # 100 rows/s: one 30 s run moves 3,000
    drained(engine, 500, 100.0)  # too small to measure a drain: not counted
    peak = plant(engine, 3_001, 180)
    plant(engine, 40, 60)
    beyond = plant(engine, 5, 30 * 60)  # after 24 h: only a longer horizon sees it

    ahead = forecast.forecast(engine)
    assert ahead.peak == (peak, 3_001)
    assert ahead.busiest(2)[1][1] == 40 and ahead.capacity_per_run == 3_000
    assert ahead.drain_cycles == 1 and ahead.drain_rows_per_second == 100.0
    assert ahead.over_capacity() == [(peak, 3_001)]
    assert sum(n for _, n in ahead.minutes) == 3_041
    assert (beyond, 5) in forecast.forecast(engine, hours=48).minutes

    with (
        instance_for_test() as instance,
        build_sensor_context(
            instance=instance, resources={"postgres": PostgresResource(database_url=database_url)}
        ) as context,
    ):
        result = reminder_health_sensor(context)
    check = {e.check_name: e for e in result.asset_events}["coming_peak"]
    assert check.passed is False and check.severity is AssetCheckSeverity.WARN
    assert check.description.startswith(f"{peak.isoformat()} holds 3,001 due reminders")
    assert "one run moves 3,000 in 30 s at 100 rows/s measured over 1 cycles" in check.description
    meta = {k: v.value for k, v in check.metadata.items()}
    assert (meta["peak_due"], meta["capacity_per_run"], meta["minutes_over_capacity"]) == (
        3_001,
        3_000,
        1,
    )
    # A link under the docs base URL (issue 35: clickable runbook links), not a repository path.
    assert meta["runbook"] == runbook_link(health.RUNBOOK_COMING_PEAK).value

    settings, endpoints = exporter_settings(database_url)
    running = exp.start_exporter(settings, endpoints)
    try:
        scraped = scrape(running.url)
    finally:
        running.stop()
    assert scraped.value(exp.FORECAST_PEAK_DUE) == 3_001
    assert scraped.value(exp.FORECAST_PEAK_TIME) == peak.timestamp()
    assert scraped.value(exp.FORECAST_CAPACITY) == 3_000


def test_the_command_line_prints_the_peak_and_the_capacity(engine, database_url) -> None:
    peak = plant(engine, 25, 90)
    env = {"DATABASE_URL": database_url}
    result = run_cli("forecast", "--json", "--hours", "6", env=env)
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["peak"] == {"minute": iso(peak), "due": 25}
    assert data["capacity_per_run"] == 150_000 and data["hours"] == 6
    assert data["minutes"] == [{"minute": iso(peak), "due": 25}]

    text = run_cli("forecast", env=env)
    assert text.returncode == 0, text.stderr
    assert f"peak 25 at {iso(peak)}" in text.stdout and "one run moves 150000" in text.stdout

    refused = run_cli("forecast", "--hours", "0", env=env)
    assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1


def test_the_per_minute_counts_read_only_the_partial_index_range(engine) -> None:
    """EXPLAIN, not timing: 20,000 Sent rows a sequential scan would read and 2,000 Pending ones
    in the window; the plan walks ix_event_reminders_status_due_at (docs/benchmarks.md has the
    10M-row figures)."""
    plant(engine, 2_000, 60)
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                """
                WITH ev AS (
                    INSERT INTO calendar_events
                           (id, tenant_id, owner_user_id, kind, start_at, time_zone)
                    SELECT gen_random_uuid(), gen_random_uuid(), gen_random_uuid(), 'Task',
                           now(), 'UTC'
                      FROM generate_series(1, 20000) RETURNING id
                )
                INSERT INTO event_reminders
                       (id, calendar_event_id, offset_minutes, due_at, status, sent_at)
                SELECT gen_random_uuid(), id, 60, now() - interval '1 day', 'Sent', now() FROM ev
                """
            )
        )
        conn.exec_driver_sql("ANALYZE event_reminders")
    sql = store.DUE_PER_MINUTE.text.replace(":start", "now()").replace(
        ":until", "now() + interval '24 hours'"
    )
    with engine.connect() as conn:
        [plan] = conn.exec_driver_sql("EXPLAIN (FORMAT JSON) " + sql).scalar_one()
    scans = [n for n in _nodes(plan["Plan"]) if "Scan" in n["Node Type"]]
    # An index (only) scan, or a bitmap heap scan over it: never a sequential scan.
    assert "Seq Scan" not in {n["Node Type"] for n in scans}, scans
    assert {n["Index Name"] for n in scans if "Index Name" in n} == {INDEX}, scans
