"""The peak benchmark's load generator and command line (its plan only: no servers, seconds)."""

from __future__ import annotations

import itertools

from benchmarks.peak import OFFSETS, busiest, working_week

from .helpers import run_benchmark


def test_the_working_week_falls_due_on_quarter_hours_and_holds_the_target_load() -> None:
    slots = working_week(50_000)
    assert sum(s.reminders for s in slots) == 50_000 // len(OFFSETS) * len(OFFSETS)
    # Events start on :00/:30 and offsets are 15, 60 and 1440 minutes: due on quarter hours.
    assert {s.minute_of_week % 15 for s in slots} == {0}
    peak = busiest(slots, 4)
    marks = [s.minute_of_week for s in peak]
    assert [b - a for a, b in itertools.pairwise(marks)] == [15, 15, 15]
    assert max(s.reminders for s in peak) > 50_000 / (7 * 24 * 4)  # a peak, not the average


def test_the_command_prints_its_plan() -> None:
    proc = run_benchmark("peak", "--quick", "--plan", timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "burst 500: +0 min 500" in proc.stdout
    assert "week 10x: +0 min" in proc.stdout
