"""The per-cycle metrics ledger: one row per real cycle, written apart from the dispatch transaction, never failing it.

Histogram arithmetic is checked as plain functions; the rest runs real cycles against the test
database and reads the ledger table back.
"""

from __future__ import annotations

import logging
from datetime import timedelta

import pytest
import sqlalchemy as sa

from reminder_pipeline import cycle
from reminder_pipeline.domain.lateness import Lateness
from reminder_pipeline.domain.model import CycleCounts
from reminder_pipeline.observability import ledger
from reminder_pipeline.store import metrics_repository, repository
from reminder_pipeline.store.tables import dispatch_cycles, dispatch_metric_totals

from ..support import make_due_event, record_cycle_at, reminders

LATE = ledger.LATENESS_BUCKETS


def _database_now(engine):
    with engine.connect() as conn:
        return repository.database_clock(conn)


def _rows(engine) -> list[dict]:
    with engine.connect() as conn:
        return [dict(r._mapping) for r in conn.execute(sa.select(dispatch_cycles).order_by("id"))]


def test_bucket_counts_follow_prometheus_less_or_equal_buckets():
    counts = ledger.bucket_counts([0.2, 1.0, 1.5, 120.0, 120.5, 5000.0], LATE)
    assert len(counts) == len(LATE) + 1
    assert counts[LATE.index(1)] == 2  # 0.2 and exactly 1.0
    assert counts[LATE.index(5)] == 1
    assert counts[LATE.index(120)] == 1  # exactly on the SLO bound: still within it
    assert counts[LATE.index(180)] == 1
    assert counts[-1] == 1  # beyond the last bound: +Inf
    assert ledger.cumulative(counts)[-1] == 6


def test_quantile_interpolates_like_histogram_quantile():
    counts = ledger.bucket_counts([50.0] * 10, LATE)  # all in (30, 60]
    assert ledger.quantile(0.5, counts, LATE) == pytest.approx(45.0)
    assert ledger.quantile(0.95, counts, LATE) == pytest.approx(58.5)
    assert ledger.quantile(0.95, [0] * len(counts), LATE) is None
    overflow = ledger.bucket_counts([10_000.0], LATE)
    assert ledger.quantile(0.95, overflow, LATE) == LATE[-1]


def test_each_cycle_writes_one_row_with_its_counts_and_histograms(engine, publisher):
    events = [make_due_event(engine, minutes_overdue=m) for m in (0.5, 1.5)]
    make_due_event(engine, status="Completed")

    report = cycle.run_cycle(engine, publisher, run_id="run-ledger-1")
    [row] = _rows(engine)

    assert row["run_id"] == "run-ledger-1"
    assert row["succeeded"] is True and row["error_kind"] is None
    assert (row["sent"], row["skipped"], row["failed"]) == (2, 1, 0)
    assert (row["published"], row["publish_failed"], row["batches"]) == (2, 0, 1)
    assert row["as_of"] == report.as_of
    # Both times are the database's: finished when written, started that less the duration.
    assert report.as_of <= row["finished_at"]
    assert abs(row["started_at"] - report.as_of) < timedelta(seconds=5)
    assert row["duration_seconds"] == pytest.approx(report.counts.duration_ms / 1000)
    assert sum(row["duration_buckets"]) == 1
    lateness = sorted(
        (r["sent_at"] - r["due_at"]).total_seconds() for e in events for r in reminders(engine, e)
    )
    assert row["lateness_count"] == 2
    assert row["lateness_sum"] == pytest.approx(sum(lateness), abs=0.01)
    assert row["lateness_buckets"] == ledger.bucket_counts(lateness, LATE)

    cycle.run_cycle(engine, publisher)  # an empty cycle is a cycle too (liveness)
    assert [r["sent"] for r in _rows(engine)] == [2, 0]


def test_a_failed_ledger_write_is_logged_and_never_fails_the_cycle(
    engine, publisher, monkeypatch, caplog
):
    make_due_event(engine, minutes_overdue=1)

    def broken(conn, record):
        raise sa.exc.OperationalError("INSERT", {}, Exception("ledger unavailable"))

    monkeypatch.setattr(metrics_repository, "insert_cycle", broken)
    with caplog.at_level(logging.WARNING, logger="reminder_pipeline"):
        report = cycle.run_cycle(engine, publisher)

    assert report.counts.sent == 1 and report.relay.published == 1
    assert _rows(engine) == []
    [warning] = [r for r in caplog.records if "metrics ledger" in r.getMessage()]
    assert warning.fields == {"run_id": report.run_id, "error_kind": "OperationalError"}


def test_a_failed_dispatch_is_recorded_in_its_own_transaction(engine, publisher, monkeypatch):
    event_id = make_due_event(engine, minutes_overdue=1)

    def lost_connection(*args, **kwargs):
        raise sa.exc.OperationalError("UPDATE", {}, Exception("server closed the connection"))

    monkeypatch.setattr(repository, "write_verdicts", lost_connection)
    with pytest.raises(sa.exc.OperationalError):
        cycle.run_cycle(engine, publisher, run_id="run-ledger-failed")

    # The dispatch transaction rolled back; the ledger row, written apart from it, stayed.
    assert reminders(engine, event_id)[0]["status"] == "Pending"
    [row] = _rows(engine)
    assert row["run_id"] == "run-ledger-failed"
    assert row["succeeded"] is False
    assert row["error_kind"] == "OperationalError"
    assert row["sent"] == 0


def test_record_cycle_stamps_the_database_clock_and_keeps_the_hosts_duration(engine):
    counts = CycleCounts(
        sent=3, skipped=1, batches=2, published=3, lateness=Lateness.of([10.0, 20.0, 200.0])
    )
    before = _database_now(engine)
    # A failed run's sensor passes the duration it measured; the ledger's times are the database's.
    assert ledger.record_cycle(engine, "dagster-run-1", counts, duration_seconds=4.0) is True
    after = _database_now(engine)
    [row] = _rows(engine)

    assert before <= row["finished_at"] <= after
    assert row["finished_at"] - row["started_at"] == timedelta(seconds=4)
    assert row["duration_seconds"] == 4.0
    assert row["lateness_buckets"] == ledger.bucket_counts([10.0, 20.0, 200.0], LATE)
    assert (row["lateness_count"], row["lateness_sum"]) == (3, 230.0)
    assert (row["sent"], row["batches"]) == (3, 2)


def test_roll_up_folds_old_rows_into_the_totals_and_keeps_recent_ones(engine):
    now = _database_now(engine)
    for days_ago, error in ((3, None), (2, "OperationalError"), (0, None)):
        at = now - timedelta(days=days_ago)
        counts = CycleCounts(sent=2, lateness=Lateness.of([5, 50]))
        record_cycle_at(engine, f"run-{days_ago}", counts, at, error=error)

    # The next write rolls up what was older than the retention (1 day) by the database's clock.
    assert ledger.record_cycle(engine, "run-now", CycleCounts()) is True
    assert [r["run_id"] for r in _rows(engine)] == ["run-0", "run-now"]
    with engine.connect() as conn:
        totals = dict(conn.execute(sa.select(dispatch_metric_totals)).one()._mapping)
        assert totals["cycles"] == 2 and totals["cycles_failed"] == 1 and totals["sent"] == 4
        assert totals["lateness_buckets"] == [2 * c for c in ledger.bucket_counts([5, 50], LATE)]
        assert totals["last_success_at"] == now - timedelta(days=3)
        assert totals["rolled_up_until"] == now - timedelta(days=2)
        merged = metrics_repository.ledger_totals(
            conn, len(ledger.DURATION_BUCKETS) + 1, len(LATE) + 1
        )
    assert (merged.cycles, merged.cycles_failed, merged.sent, merged.lateness_count) == (4, 1, 6, 6)
    assert merged.last_success_at > now
