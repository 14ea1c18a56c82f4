"""The shared-database benchmark (``python -m benchmarks.shared_db``): the minutes it feeds and its
refusal of a bad phase (``--plan``, no servers); its verdicts judge issue 41's done-when as the docs
say (made-up minutes, judged by ``--verdicts``, no servers); and the command still runs end to end
on two stacks, each with its own PostgreSQL and broker (tiny: 2 "minutes" of 8 s at 20 reminders a
second; no timing asserts): a row per dispatch with both stacks' figures, the verdicts, and the
held snapshot's session on B's database, never on A's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .helpers import run_benchmark


def test_phases_are_minutes_at_a_rate_and_a_bad_one_is_refused() -> None:
    proc = run_benchmark(
        "shared_db", "--phases", "4@300,5@1000", "--tail", "1", "--plan", timeout=60
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    assert "4 min @ 300/s, 5 min @ 1000/s, then 1 min with nothing fed" in lines[0]
    assert lines[1:] == [
        *(f"  minute {m}: 300/s, 18,000 reminders" for m in range(1, 5)),
        *(f"  minute {m}: 1000/s, 60,000 reminders" for m in range(5, 10)),
        "  minute 10: nothing fed",
    ]
    for bad in ("4", "0@300", "4@-1", "x@300", "4@"):
        proc = run_benchmark("shared_db", "--phases", bad, timeout=60)
        assert proc.returncode == 2, (bad, proc.stderr)
        [error] = [line for line in proc.stderr.splitlines() if "error:" in line]
        assert repr(bad) in error and ("MINUTES@RATE" in error or "at least one minute" in error)
        assert not proc.stdout  # refused before anything ran


def _report(a: list[tuple[float, int]], b: list[tuple[float, int]], late: float = 61.0) -> dict:
    """Minutes 1-2 at 300/s and 3-4 at 1000/s: (dispatch s, rows left due) per minute, each a
    sample as the report's JSON holds it."""

    def samples(rows: list[tuple[float, int]]) -> list[dict]:
        return [
            {
                "minute": m,
                "rate": 300 if m <= 2 else 1000,
                "started_s": 0,
                "exit_code": 0,
                "command_s": s,
                "dispatch_s": s,
                "left_due": left,
                "max_lateness_s": late,
            }
            for m, (s, left) in enumerate(rows, start=1)
        ]

    phases = [{"minutes": 2, "rate_per_s": 300}, {"minutes": 2, "rate_per_s": 1000}]
    return {"stacks": {"A": samples(a), "B": samples(b)}, "phases": phases}


def _verdicts(report: dict, tmp_path: Path) -> list[dict]:
    """``--verdicts`` of ``report``: the verdicts it writes, each also printed."""
    given, judged = tmp_path / "report.json", tmp_path / "judged.json"
    given.write_text(json.dumps(report))
    proc = run_benchmark("shared_db", "--verdicts", str(given), "--json", str(judged), timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    found = json.loads(judged.read_text())["verdicts"]
    printed = proc.stdout.splitlines()[1:]
    assert [line.split()[-1] for line in printed] == [v["result"] for v in found]
    return found


def test_the_verdicts_judge_the_done_when(tmp_path: Path) -> None:
    fine = _verdicts(
        _report([(3, 0), (3, 0), (10, 0), (12, 0)], [(3, 0), (4, 0), (20, 0), (26, 0)]), tmp_path
    )
    assert [v["result"] for v in fine[:3]] == ["PASS", "PASS", "PASS"]
    # The median of B's 1000/s minutes (23 s) against 2 x A's (11 s) + 2 s.
    assert "B 23.0 s, A 11.0 s: bound 24.0 s" in fine[2]["measured"]
    behind = _verdicts(
        _report([(3, 0), (3, 0), (10, 0), (12, 0)], [(3, 0), (4, 0), (30, 38_000), (32, 91_000)]),
        tmp_path,
    )
    assert [v["result"] for v in behind[:3]] == ["MISS", "PASS", "MISS"]
    late = _verdicts(_report([(3, 0)] * 4, [(3, 0)] * 4, late=126.0), tmp_path)
    assert late[1]["result"] == "MISS"
    # The drift is judged on 10 minutes of at least 20 at one rate; shorter, it is only shown.
    assert {v["result"] for v in fine[3:]} == {"INFO"}


#: Starts two embedded PostgreSQL servers and brokers and runs the command for ~30 s.
@pytest.mark.slow
def test_two_stacks_side_by_side_with_the_snapshot_on_b_only(tmp_path: Path) -> None:
    out = tmp_path / "shared_db.json"
    proc = run_benchmark(
        "shared_db",
        *("--phases", "2@20", "--interval", "8", "--tail", "0", "--json", str(out)),
        timeout=150,
        own_servers=True,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    for heading in (
        "due query ms",
        "buffers/query",
        "dispatch s",
        "left due",
        "max late s",
        "dead event_reminders",
        "due index MB",
        "outbox index MB",
        "xmin holder B",
        "every index of the queue tables at the start and the end of the run",
        "B leaves no due row behind after any dispatch",
        "B's median dispatch at 20/s",
    ):
        assert heading in proc.stdout, heading
    assert "shared_db: B minute 2/2" in proc.stderr  # progress on stderr
    report = json.loads(out.read_text())
    a, b = report["stacks"]["A"], report["stacks"]["B"]
    assert [s["minute"] for s in a] == [s["minute"] for s in b] == [1, 2]
    assert report["due_statement_found"] == {"A": True, "B": True}
    for sample in a + b:
        assert sample["exit_code"] == 0 and not sample["error"], sample
        assert sample["due_calls"] >= 1 and sample["left_due"] is not None
        assert sample["dispatch_s"] is not None and sample["due_index_mb"] >= 0
    assert sum(s["sent"] for s in a) > 0 and sum(s["sent"] for s in b) > 0
    # The snapshot was held on B the whole run (the oldest xmin there), never on A.
    holder = report["snapshot"]["application_name"]
    assert holder and all(s["holder"] == holder for s in b)
    assert not any(s["holder"] == holder for s in a)
    assert report["snapshot"]["at_end"]["state"] == "idle in transaction"
    # Every index of both queue tables, measured at the start and the end on each stack.
    for name in ("A", "B"):
        start, end = report["index_sizes"][name]["start"], report["index_sizes"][name]["end"]
        assert set(start) == set(end)
        assert {
            "event_reminders.ix_event_reminders_status_due_at",
            "outbox.ix_outbox_unpublished",
            "outbox.pk_outbox",
        } <= set(end)
        assert end["outbox.pk_outbox"] > start["outbox.pk_outbox"]  # rows were sent
        assert f"{'outbox.pk_outbox':<50}" in proc.stdout
