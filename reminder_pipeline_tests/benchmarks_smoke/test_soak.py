"""The seeded fault soak (``benchmarks.soak``): its plan is a pure function of the seed and the
minutes (no servers, seconds), and a short seeded run against the real stack keeps the invariants
(nothing lost, nothing doubled, nothing sent after a cancel; no timing asserts)."""

from __future__ import annotations

import json
import subprocess

import pytest

from benchmarks._soak_plan import KINDS, plan_faults

from .helpers import run_benchmark

#: The suite's short run: every kind once in 3 minutes (durations scaled to a tenth).
SHORT_SEED, SHORT_MINUTES = 26, 3


def test_the_same_seed_gives_the_same_plan_and_another_seed_another() -> None:
    assert plan_faults(26, 30) == plan_faults(26, 30)
    assert plan_faults(26, 30) != plan_faults(27, 30)
    assert plan_faults(26, 30) != plan_faults(26, 20)


@pytest.mark.parametrize("minutes", [2, 3, 10, 30, 45])
def test_every_kind_is_planned_often_enough_apart_and_inside_the_run(minutes: int) -> None:
    faults = plan_faults(5, minutes)
    times = [f.at_s for f in faults]
    assert times == sorted(times)
    assert times[0] > 0 and times[-1] < minutes * 60
    expected = max(1, minutes // 15)  # twice in the 30-minute run
    assert {k: sum(f.kind == k for f in faults) for k in KINDS} == dict.fromkeys(KINDS, expected)
    pauses = [f.down_s for f in faults if f.kind == "broker_pause"]
    if minutes >= 30:  # full scale: the broker paused 30-90 s
        assert all(30 <= p <= 90 for p in pauses)
    assert all(p >= 5 for p in pauses)


def _soak(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    return run_benchmark("soak", *args, timeout=timeout, own_servers=True)


def test_the_command_prints_the_plan_of_its_seed() -> None:
    proc = _soak("--plan", "--minutes", "30", "--seed", "26", timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    assert lines[1:] == [f.line() for f in plan_faults(26, 30)]


@pytest.mark.slow
@pytest.mark.server
def test_a_short_seeded_soak_loses_nothing_doubles_nothing_sends_nothing_cancelled() -> None:
    proc = _soak("--minutes", str(SHORT_MINUTES), "--seed", str(SHORT_SEED), "--json", timeout=1500)
    assert proc.stdout.strip(), proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    for key in ("faults", "checked", "lost", "doubled", "sent_after_cancel", "recovery_max_s"):
        assert key in report
    summary = {k: report[k] for k in ("lost", "doubled", "sent_after_cancel")}
    assert summary == {"lost": 0, "doubled": 0, "sent_after_cancel": 0}, json.dumps(
        {k: report[k] for k in ("examples", "fault_log", "by_kind")}
    )[:3000]
    assert report["checked"] > 0
    assert report["faults"] >= len(KINDS) - 1  # a run worker may not be caught mid-drain
    assert proc.returncode == 0
