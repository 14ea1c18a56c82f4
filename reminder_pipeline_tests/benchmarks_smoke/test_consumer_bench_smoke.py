"""The consumer benchmark's command line on a tiny topic (its own servers; no timing asserts)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .helpers import run_benchmark

#: It starts its own servers and runs the benchmark end to end.
pytestmark = pytest.mark.slow


def test_the_command_measures_every_loop_in_every_round(tmp_path: Path) -> None:
    out = tmp_path / "consumer.json"
    proc = run_benchmark(
        "consumer", "--messages", "200", "--rounds", "2", "--json", str(out), timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(out.read_text())
    loops = [row["loop"] for row in report["rows"]]
    assert loops == ["raw", "member/sqlite", "member/postgres"] * 2
    assert [row["loop"] for row in report["summary"]] == ["raw", "member/sqlite", "member/postgres"]
    for row in report["summary"][1:]:
        assert len(row["ratios"]) == 2 and row["result"] in {"PASS", "MISS"}
        assert row["per_s"] > 0 and row["peak_rss_mb"] > 0
    assert "ratio by round" in proc.stdout
