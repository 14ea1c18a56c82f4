"""Ctrl-C while ``reminder-pipeline up`` waits for Dagster: exit 130, everything it started stopped.

``up`` runs in a subprocess with its own home and free ports; the signal is sent once its
progress line says it is waiting for Dagster, so the interrupt lands in that wait.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import psutil
import pytest

from reminder_pipeline.cli import EXIT_INTERRUPTED
from reminder_pipeline.local.servers import EmbeddedPostgres, free_port

pytestmark = pytest.mark.slow


def test_ctrl_c_while_dagster_loads_exits_130_and_stops_everything(tmp_path):
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("DATABASE_URL", "KAFKA_BOOTSTRAP_SERVERS", "DAGSTER_PG_URL", "DAGSTER_HOME")
    }
    env.update(
        REMINDER_PIPELINE_HOME=str(tmp_path / "home"),
        REMINDER_EMBEDDED_PG_PORT=str(free_port()),
        REMINDER_EMBEDDED_BROKER_PORT=str(free_port()),
        DAGSTER_WEBSERVER_PORT=str(free_port()),
        REMINDER_METRICS_PORT=str(free_port()),
        REMINDER_PROGRESS_SECONDS="0",
        REMINDER_LOG_LEVEL="WARNING",
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "reminder_pipeline.cli", "up", "--no-demo"],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    children: list[psutil.Process] = []
    try:
        waited = []
        for line in proc.stderr:
            waited.append(line)
            if line.startswith("reminder-pipeline: waiting for Dagster:"):
                break
        assert waited and waited[-1].startswith("reminder-pipeline: waiting for Dagster:"), waited
        children = psutil.Process(proc.pid).children(recursive=True)
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=180)
        assert proc.returncode == EXIT_INTERRUPTED
        assert out.rstrip().endswith("stopped")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    alive = [c for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]
    assert alive == [], f"left running: {[c.cmdline()[:3] for c in alive]}"
    # PostgreSQL runs detached (not a child): stopped too.
    pg = EmbeddedPostgres(tmp_path / "home" / "pgdata", port=int(env["REMINDER_EMBEDDED_PG_PORT"]))
    assert not pg.is_running()
