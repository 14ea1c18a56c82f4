"""The live-migration benchmark still runs end to end on the test server: a tiny calendar at 0006,
the calendar writing beside ``reminder-pipeline db upgrade`` to head (no timing is asserted)."""

from __future__ import annotations

from reminder_pipeline.store import migrate

from .helpers import run_benchmark


def test_the_upgrade_beside_the_calendar_prints_its_figures(pg_admin_url, monkeypatch) -> None:
    monkeypatch.setenv("DATABASE_URL", pg_admin_url)  # a scratch database on the test server
    proc = run_benchmark(
        "migration_live",
        *("--reminders", "2000", "--baseline-seconds", "1", "--rate", "20"),
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout
    assert f"db upgrade 0006 -> {migrate.head_revision()}: exit 0" in out
    assert "ix_event_reminders_poison: " in out
    assert "calendar before the upgrade: " in out and "calendar during the upgrade: " in out
    assert "failed calendar writes" not in out
