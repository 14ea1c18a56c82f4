"""Errors sustained: a poison row keeps the errors signal on for as long as it is held back.

A row whose payload cannot be built is retried with a growing back-off (30 s, 60 s, ... up to an
hour), so ``errors_total`` rises only at each retry. Real cycles against the test database make
such a row; the exporter's live ``poison_rows`` gauge (what the Prometheus alert reads) and the
``dispatch_errors`` check must count it from its second failed attempt until an operator skips
it, whenever they are evaluated. The rate side of the check follows the alert's
``rate(errors_total[5m]) > 0`` for 10 minutes, driven by ledger rows at chosen times.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import sqlalchemy as sa

from reminder_pipeline import cycle
from reminder_pipeline.domain.model import CycleCounts
from reminder_pipeline.observability import exporter as exp
from reminder_pipeline.observability import health
from reminder_pipeline.store import metrics_repository, operator_repository

from ..support import make_due_event, record_cycle_at, reminders
from .helpers import exporter_settings, scrape

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def _poison_attempt(engine) -> None:
    """One more cycle over due rows, as the schedule would run once the row's back-off is over."""
    with engine.begin() as conn:
        # What `reminder-pipeline poison retry` does: the next cycle takes the row at once.
        conn.execute(sa.text("UPDATE event_reminders SET next_attempt_at = NULL"))
    cycle.run_cycle(engine, None)


def _record(engine, finished_at: datetime, **counts: int) -> None:
    """A ledger row for a cycle that finished at ``finished_at`` with these counts."""
    error = counts.pop("error", None)
    record_cycle_at(
        engine,
        f"run-{finished_at:%H%M%S}",
        CycleCounts(**counts),
        finished_at,
        duration_seconds=5.0,
        error=RuntimeError("x") if error else None,
    )


def test_errors_sustained_since_walks_back_until_a_five_minute_gap():
    minute = timedelta(minutes=1)
    now = T0
    assert health.errors_sustained_since([], now) is None
    # The newest error is 5 minutes old: the 5-minute rate is 0 now.
    assert health.errors_sustained_since([now - 5 * minute], now) is None
    every_two = [now - k * 2 * minute for k in range(1, 8)]  # 2, 4, ... 14 minutes ago
    assert health.errors_sustained_since(every_two, now) == now - 14 * minute
    with_gap = [now - 1 * minute, now - 3 * minute, now - 9 * minute, now - 11 * minute]
    assert health.errors_sustained_since(with_gap, now) == now - 3 * minute


def test_a_row_failing_twice_is_held_back_until_skipped_whatever_the_back_off(engine, database_url):
    # An empty Kind cannot become a valid message: a poison row, however the zone policy goes.
    event_id = make_due_event(engine, minutes_overdue=3, kind="")
    healthy = make_due_event(engine, minutes_overdue=2)
    settings, endpoints = exporter_settings(database_url)
    running = exp.start_exporter(settings, endpoints)
    try:
        report = cycle.run_cycle(engine, None)
        assert (report.counts.failed, report.counts.sent) == (1, 1)
        once = scrape(running.url)
        # One failure may be a one-off: not held back yet, and the check still passes.
        assert once.value(exp.POISON_ROWS_GAUGE) == 0 and once.value(exp.POISON_OLDEST_AGE) == 0
        assert once.value(exp.ERRORS, kind="item") == 1
        assert health.errors(engine, datetime.now(UTC)).passed

        _poison_attempt(engine)
        [row] = reminders(engine, event_id)
        assert row["status"] == "Pending" and row["attempts"] == 2
        assert reminders(engine, healthy)[0]["status"] == "Sent"
        twice = scrape(running.url)
        assert twice.value(exp.POISON_ROWS_GAUGE) == 1
        assert 170 <= twice.value(exp.POISON_OLDEST_AGE) <= 400
        assert twice.value(exp.ERRORS, kind="item") == 2
        # The backlog still counts it too (the overdue alert's view of the same row).
        assert twice.value(exp.BACKLOG_GAUGE) == 1
    finally:
        running.stop()

    now = datetime.now(UTC)
    check = health.errors(engine, now)
    assert not check.passed
    assert check.metadata["poison_rows"] == 1
    assert check.description.startswith("1 due reminder(s) held back by repeated failures")
    # 50 minutes on, in the middle of a back-off gap: no error in the last 10 minutes, and the
    # check still fails, as the alert still fires.
    later = now + timedelta(minutes=50)
    gap = health.errors(engine, later)
    assert gap.metadata["cycles_with_errors"] == 0
    assert gap.metadata["errors_sustained_seconds"] is None
    assert not gap.passed
    assert gap.metadata["poison_rows"] == 1
    assert gap.metadata["poison_oldest_age_seconds"] >= 50 * 60

    with engine.begin() as conn:  # an operator skips it (`reminder-pipeline poison skip`)
        assert operator_repository.skip_poison(conn, row["id"])
    assert health.errors(engine, later).passed
    with engine.connect() as conn:
        assert metrics_repository.poison_summary(conn, later).count == 0


def test_errors_fail_the_check_only_after_ten_minutes_without_a_five_minute_gap(engine):
    minute = timedelta(minutes=1)
    # A failed cycle, a poison item, refused deliveries: one error every 3 minutes for 12 minutes.
    for k, counts in enumerate(
        [{"error": 1}, {"failed": 1}, {"publish_failed": 4}, {"failed": 1}, {"publish_failed": 2}]
    ):
        _record(engine, T0 + 3 * k * minute, **counts)

    assert health.errors(engine, T0 + 9 * minute).passed  # going on for 9 minutes: not yet
    check = health.errors(engine, T0 + 12 * minute)
    assert not check.passed
    assert check.metadata["errors_sustained_seconds"] == 720
    assert check.metadata["poison_rows"] == 0
    assert check.description.startswith("Errors for 12 min without a 5-min gap")
    # Five minutes after the last error the rate is back to 0: passed again.
    assert health.errors(engine, T0 + 17 * minute).passed


def test_errors_with_a_gap_of_five_minutes_are_not_sustained(engine):
    minute = timedelta(minutes=1)
    for offset in (0, 2, 4, 10, 12):  # a 6-minute gap between 4 and 10
        _record(engine, T0 + offset * minute, failed=1)
    check = health.errors(engine, T0 + 13 * minute)
    assert check.passed
    assert check.metadata["errors_sustained_seconds"] == 180
    assert check.metadata["cycles_with_errors"] == 3  # 4, 10 and 12 min, in the last 10 minutes
