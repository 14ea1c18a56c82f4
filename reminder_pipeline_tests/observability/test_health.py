"""The seed's alert conditions as health checks, evaluated against the real database (what the Dagster asset checks show).

Each check is driven over its threshold by real rows (real cycles, or ledger rows written the
way a Dagster op writes them) and evaluated at a chosen ``now``.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

import sqlalchemy as sa

from reminder_pipeline import cycle
from reminder_pipeline.domain.lateness import Lateness
from reminder_pipeline.domain.model import CycleCounts
from reminder_pipeline.observability import health, ledger

from ..support import POISON_KIND, make_due_event

ROOT = Path(__file__).resolve().parents[2]


def _by_name(engine, now=None) -> dict[str, health.HealthCheck]:
    return {c.name: c for c in health.evaluate(engine, now)}


def test_a_fresh_system_is_not_live_and_otherwise_clean(engine):
    checks = _by_name(engine)
    assert list(checks) == [
        "dispatch_liveness",
        "no_overdue_reminders",
        "dispatch_errors",
        "outbox_backlog",
        "lateness_slo",
        "clock_skew",
        "coming_peak",
        "vacuum_horizon",
    ]
    assert not checks["dispatch_liveness"].passed
    assert checks["dispatch_liveness"].metadata["seconds_since_last_success"] is None
    assert all(c.passed for name, c in checks.items() if name != "dispatch_liveness")


def test_liveness_passes_after_a_cycle_and_fails_five_minutes_later(engine, publisher):
    cycle.run_cycle(engine, publisher)
    now = datetime.now(UTC)
    live = health.liveness(engine, now)
    assert live.passed
    assert live.metadata["seconds_since_last_success"] < 60

    later = health.liveness(engine, now + timedelta(minutes=6))
    assert not later.passed
    assert 355 <= later.metadata["seconds_since_last_success"] <= 420
    assert later.metadata["threshold_seconds"] == 300


def test_a_failed_cycle_does_not_count_as_live(engine):
    now = datetime.now(UTC)
    ledger.record_cycle(engine, "failed-run", None, error=RuntimeError("x"))
    assert not health.liveness(engine, now).passed


def test_pending_rows_due_over_five_minutes_ago_fail_the_overdue_check(engine):
    make_due_event(engine, minutes_overdue=2)
    now = datetime.now(UTC)
    assert health.overdue(engine, now).passed

    make_due_event(engine, minutes_overdue=10)
    check = health.overdue(engine, now)
    assert not check.passed
    assert check.metadata["overdue_count"] == 1
    assert check.metadata["backlog"] == 2
    assert 590 <= check.metadata["oldest_due_age_seconds"] <= 620


def test_errors_in_two_cycles_are_not_yet_sustained(engine, publisher):
    # Errors sustained means going on for 10 minutes (the alert's rule), or a row held back by
    # repeated failures: test_errors_sustained.py. Two cycles with errors just now are neither.
    make_due_event(engine, minutes_overdue=1, kind=POISON_KIND)
    cycle.run_cycle(engine, publisher)  # one poison row, failing once: one cycle with an error
    now = datetime.now(UTC)
    ledger.record_cycle(engine, "failing-run", None, error=RuntimeError("x"))
    check = health.errors(engine, now)
    assert check.passed
    assert check.metadata["failed_items"] == 1 and check.metadata["cycles_with_errors"] == 2
    assert check.metadata["failed_cycles"] == 1
    assert check.metadata["poison_rows"] == 0


def test_an_outbox_row_unpublished_for_over_two_minutes_fails_the_backlog_check(engine):
    make_due_event(engine, minutes_overdue=1)
    cycle.run_cycle(engine, None)  # dispatched, not relayed
    check = health.outbox_backlog(engine, datetime.now(UTC))
    assert check.passed and check.metadata["unpublished"] == 1

    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE outbox SET created_at = now() - interval '5 minutes'"))
    check = health.outbox_backlog(engine, datetime.now(UTC))
    assert not check.passed
    assert 299 <= check.metadata["oldest_unpublished_age_seconds"] <= 320
    assert check.runbook_url == health.RUNBOOK_OUTBOX


def test_lateness_p95_over_the_slo_fails_the_slo_check(engine, publisher):
    for seconds in (10, 30, 50):
        make_due_event(engine, minutes_overdue=seconds / 60)
    cycle.run_cycle(engine, publisher)
    now = datetime.now(UTC)
    within = health.lateness_slo(engine, now)
    assert within.passed
    assert within.metadata["sent_in_window"] == 3
    assert within.metadata["lateness_p95_seconds"] <= 120

    late = CycleCounts(sent=20, lateness=Lateness.of([200.0] * 20))
    ledger.record_cycle(engine, "late-run", late)
    burnt = health.lateness_slo(engine, now)
    assert not burnt.passed
    assert burnt.metadata["lateness_p95_seconds"] > 120
    assert burnt.severity == "WARN"
    # Beyond the 15-minute window the burn is over.
    assert health.lateness_slo(engine, now + timedelta(minutes=16)).passed


def _headings(markdown: Path) -> set[str]:
    """GitHub-style anchors of the file's headings."""
    return {
        re.sub(r"\s", "-", re.sub(r"[^\w\s-]", "", line.lstrip("#").strip().lower()))
        for line in markdown.read_text().splitlines()
        if line.startswith("#")
    }


def test_every_check_links_an_existing_runbook_section_and_has_plottable_figures(engine):
    for check in health.evaluate(engine):
        path, _, anchor = check.runbook_url.partition("#")
        assert (ROOT / path).is_file(), check.runbook_url
        assert not anchor or anchor in _headings(ROOT / path), check.runbook_url
        assert check.metadata["runbook_url"] == check.runbook_url
        assert check.description and "\n" not in check.description
        numbers = [v for k, v in check.metadata.items() if isinstance(v, int | float)]
        assert numbers, check.name
        assert check.severity in ("ERROR", "WARN")
