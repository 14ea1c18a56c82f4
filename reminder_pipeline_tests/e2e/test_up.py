"""The README's run command: everything on the embedded default, then Ctrl-C stops all of it cleanly.

``reminder-pipeline up`` runs in a subprocess with its own home and free ports (never the
developer's running system), exactly as a person would start it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import psutil
import pytest

from reminder_pipeline.local import dagster_processes as orchestrator

from ..support import read_until, up_env

pytestmark = pytest.mark.slow


def _env(home: Path) -> dict[str, str]:
    return up_env(home)


def test_up_runs_everything_and_ctrl_c_stops_it(tmp_path):
    env = {**_env(tmp_path / "home"), "REMINDER_PROGRESS_SECONDS": "0"}  # a line per poll
    stderr = (tmp_path / "up.stderr").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "reminder_pipeline.cli", "up"],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=stderr,
        text=True,
        start_new_session=True,
    )
    try:
        lines = read_until(proc, "Dagster UI:", timeout=240)
        first = next(line for line in lines if line.startswith("first dispatch cycle:"))
        assert "sent=" in first and "published=" in first
        sent = int(first.split("sent=")[1].split()[0])
        assert sent > 0  # the demo data had reminders already due
        ui = next(line for line in lines if line.startswith("Dagster UI:")).split()[2]
        # While Dagster loaded, progress lines went to stderr (stdout stays the command's output).
        progress = [
            line
            for line in (tmp_path / "up.stderr").read_text().splitlines()
            if line.startswith("reminder-pipeline: waiting for Dagster:")
        ]
        assert progress, "no progress line while Dagster loaded"
        assert not any("waiting for Dagster" in line for line in lines)
        with urllib.request.urlopen(f"{ui}/server_info", timeout=10) as response:
            assert response.status == 200
        # Dagster's storage on pooled connections (a new one per call was the idle stack's
        # largest cost after the run worker: docs/benchmarks.md).
        instance_yaml = (tmp_path / "home" / "dagster_home" / "dagster.yaml").read_text()
        assert orchestrator.POOLED_STORAGE_MODULE in instance_yaml
        metrics = f"http://127.0.0.1:{env['REMINDER_METRICS_PORT']}/metrics"
        with urllib.request.urlopen(metrics, timeout=10) as response:
            assert b"calendar_reminder_dispatch_items_total" in response.read()
        children = psutil.Process(proc.pid).children(recursive=True)

        proc.send_signal(signal.SIGINT)  # what Ctrl-C sends
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode == 0
        assert "stopped" in out
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        stderr.close()
    alive = [c for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]
    assert alive == [], f"left running: {[c.cmdline()[:3] for c in alive]}"

    # Running it again resumes on the same data (the schema is there; the demo adds more).
    again = subprocess.run(
        [sys.executable, "-m", "reminder_pipeline.cli", "up", "--once"],
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert again.returncode == 0, again.stderr[-2000:]
    assert "first dispatch cycle:" in again.stdout
    # Its terminal has its own lines and no JSON; its JSON log is in the file it names once.
    log_file = tmp_path / "home" / "logs" / "up.log"
    assert again.stdout.count(f"Log: {log_file}") == 1
    assert not [line for line in again.stdout.splitlines() if line.startswith("{")]
    assert not [line for line in again.stderr.splitlines() if line.startswith("{")]
    logged = [json.loads(line) for line in log_file.read_text().splitlines()]
    assert any(line["msg"] == "embedded PostgreSQL ready" for line in logged)
    subprocess.run(
        [sys.executable, "-m", "reminder_pipeline.cli", "services", "stop"],
        env=env,
        capture_output=True,
        timeout=120,
        check=True,
    )
