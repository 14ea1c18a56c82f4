"""The peak benchmark's load generator and command line (``python -m benchmarks.peak --plan``: what
it would feed, no servers, seconds)."""

from __future__ import annotations

import re

from .helpers import run_benchmark

#: A week's quarter hours, and the design's target load in reminders a week.
QUARTER_HOURS, WEEK_REMINDERS = 7 * 24 * 4, 50_000
#: One fed minute in a phase's line: ``+3 min 1,234``.
FED = re.compile(r"\+(\d+) min ([\d,]+)")


def _week_at_target_load(quarter_hours: int) -> dict[int, int]:
    """What ``--plan`` feeds for the busiest ``quarter_hours`` consecutive quarter hours of the
    week at the target load: reminders by quarter hour (0: the window's first)."""
    proc = run_benchmark(
        "peak",
        *("--quick", "--plan", "--week-scales", "1", "--week-slots", str(quarter_hours)),
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    [line] = [line for line in proc.stdout.splitlines() if line.startswith("week 1x: ")]
    return {int(i): int(n.replace(",", "")) for i, n in FED.findall(line)}


def test_the_working_week_falls_due_on_quarter_hours_and_holds_the_target_load() -> None:
    # The whole week as one window: only what falls due on a quarter hour is fed, and that is
    # every reminder (one per offset, 15, 60 and 1440 minutes, of each event).
    week = _week_at_target_load(QUARTER_HOURS)
    assert sum(week.values()) == WEEK_REMINDERS // 3 * 3
    assert max(week) < QUARTER_HOURS
    # The busiest hour: four consecutive quarter hours, each bringing reminders, more than any
    # other four of the week bring, and a peak, not the average.
    peak = _week_at_target_load(4)
    assert sorted(peak) == [0, 1, 2, 3]
    busiest = max(sum(week.get(q + k, 0) for k in range(4)) for q in range(QUARTER_HOURS - 3))
    assert sum(peak.values()) == busiest
    assert max(peak.values()) > WEEK_REMINDERS / QUARTER_HOURS


def test_the_command_prints_its_plan() -> None:
    proc = run_benchmark("peak", "--quick", "--plan", timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "burst 500: +0 min 500" in proc.stdout
    assert "week 10x: +0 min" in proc.stdout
