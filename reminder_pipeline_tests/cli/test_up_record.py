"""What one ``up`` leaves behind is found by the next ``up`` and by ``services stop`` / ``status``.

The stack record (``up.json`` in the project home) names processes by pid and start time; these
tests put real stand-in processes in it (a "daemon" leading its own process group with a child,
as Dagster's daemon has its code servers) instead of starting the whole stack, since what is
checked is how the commands read the record and stop what it names, not Dagster itself
(``test_up_stops.py`` kills the real stack).
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from reminder_pipeline.cli.output import command_as_started
from reminder_pipeline.local.dagster_processes import StackRecord
from reminder_pipeline.local.servers import free_port
from reminder_pipeline_tests.support import error_lines, run_cli

#: A "daemon": leads its own group, and has a child in it that it never waits for.
_DAEMON = (
    "import subprocess, sys, time\n"
    "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
    "print('ready', flush=True)\n"
    "time.sleep(600)\n"
)


@pytest.fixture
def daemon() -> Iterator[psutil.Process]:
    """A stand-in daemon (own session) whose child is ready when it is returned."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _DAEMON],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
        # As Dagster's children get them: SIGINT (their clean stop) is ignored in a background job.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    try:
        yield psutil.Process(proc.pid)
    finally:
        for child in psutil.Process(proc.pid).children() if proc.poll() is None else []:
            child.kill()
        proc.kill()
        proc.wait()


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _env(home: Path) -> dict[str, str]:
    return {
        "REMINDER_PIPELINE_HOME": str(home),
        "REMINDER_EMBEDDED_PG_PORT": str(free_port()),
        "REMINDER_EMBEDDED_BROKER_PORT": str(free_port()),
        "DAGSTER_WEBSERVER_PORT": str(free_port()),
    }


def test_services_status_and_stop_include_what_a_dead_up_left(tmp_path, daemon):
    home = tmp_path / "home"
    grandchild = daemon.children()[0]
    record = StackRecord(home)
    record.add("up", _dead_pid())
    record.add("daemon", daemon.pid)
    env = _env(home)

    status = run_cli("services", "status", "--json", env=env)
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["dagster"] == {
        "running": True,
        "up_pid": None,
        "daemon_pid": daemon.pid,
        "webserver_pid": None,
    }

    stop = run_cli("services", "stop", env=env)
    assert stop.returncode == 0, stop.stderr
    assert f"stopped daemon pid {daemon.pid}" in stop.stdout
    _, alive = psutil.wait_procs([daemon, grandchild], timeout=30)
    assert alive == []  # the whole group: the code servers of a real daemon
    assert not record.exists()


def test_up_beside_a_running_up_of_the_same_home_says_what_runs_and_starts_nothing(
    tmp_path, daemon
):
    home = tmp_path / "home"
    StackRecord(home).add("up", daemon.pid)  # alive: stands for the earlier `up`

    result = run_cli("up", env=_env(home))

    assert result.returncode == 1
    assert error_lines(result) == [
        f"reminder-pipeline: error: reminder-pipeline up already runs under {home} "
        f"(up pid {daemon.pid}); stop it with `{command_as_started('__main__.py')} services stop`"
    ]
    assert daemon.is_running()
    assert sorted(p.name for p in home.iterdir()) == ["up.json"]  # no server was started


def test_up_stops_what_an_earlier_up_left_running(tmp_path, daemon):
    home = tmp_path / "home"
    record = StackRecord(home)
    record.add("up", _dead_pid())
    record.add("daemon", daemon.pid)
    env = _env(home)
    # The port of PostgreSQL taken: `up` fails right after taking over, before anything starts.
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", int(env["REMINDER_EMBEDDED_PG_PORT"])))
        taken.listen(1)
        result = run_cli("up", "--no-demo", env=env)

    assert f"stopped what an earlier up left running: daemon pid {daemon.pid}" in result.stdout
    _, alive = psutil.wait_procs([daemon], timeout=30)
    assert alive == []
    assert result.returncode == 1 and "already in use" in error_lines(result)[0]
