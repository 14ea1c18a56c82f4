"""The benchmark command still runs end to end (tiny sizes; no timing is asserted)."""

from __future__ import annotations

import subprocess

import pytest

from .helpers import run_benchmark

#: Each starts its own servers and runs a benchmark end to end.
pytestmark = pytest.mark.slow


def _bench(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    return run_benchmark("bench", "--quick", *args, timeout=timeout)


def test_bench_quick_prints_the_table() -> None:
    proc = _bench(
        "--only",
        "catchup,dueq",
        "--backlog",
        "2000",
        "--catchup-rounds",
        "1",
        "--rows",
        "20000",
        "--due",
        "300",
        "--executions",
        "30",
        timeout=170,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout
    for header in ("figure", "target", "measured", "baseline", "ratio", "result"):
        assert header in out
    assert "1. catch-up 2,000 rows" in out
    assert "1. catch-up peak RSS" in out
    assert "reminder_catch_up Dagster run" in out
    assert "3. due query p99" in out
    assert "3. due query plan uses the partial index" in out
    assert "ERROR" not in out
    # Progress goes to stderr, the table to stdout.
    assert "catch-up" in proc.stderr


def test_concurrent_dispatch_runs_figure_prints_a_row_per_run_count() -> None:
    proc = _bench("--only", "runs", "--runs-backlog", "1000", timeout=170)
    assert proc.returncode == 0, proc.stderr[-2000:]
    for n in ("1 reminder_dispatch run ", "2 reminder_dispatch runs", "4 reminder_dispatch runs"):
        assert f"6. {n}" in proc.stdout
    assert "ideal 4 x 200 = 800" in proc.stdout
    assert "ERROR" not in proc.stdout
