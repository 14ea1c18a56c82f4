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
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

from reminder_pipeline.cli.output import command_as_started
from reminder_pipeline.local.servers import free_port
from reminder_pipeline.local.stack_record import Identity, StackRecord
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


@pytest.fixture
def stranger() -> Iterator[subprocess.Popen[bytes]]:
    """An unrelated process leading a process group of its own: nothing may signal it."""
    proc = subprocess.Popen(["sleep", "600"], start_new_session=True)
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


def _as_recorded(pid: int) -> dict[str, object]:
    identity = Identity.of_started(pid)
    assert identity is not None
    return identity.as_entry()


def _entry(**changes: object) -> Callable[[int], dict[str, object]]:
    """The stranger's true entry (pid, start time, command line) with ``changes`` (None: drop)."""

    def make(pid: int) -> dict[str, object]:
        entry = {**_as_recorded(pid), **changes}
        return {k: v for k, v in entry.items() if v is not None}

    return make


# Each names the stranger in a way no process may be signalled for; "ignored" ones are also
# reported (one warning line), the others are simply not ours (a pid reused since).
BAD_ENTRIES: dict[str, tuple[Callable[[int], dict[str, object]], bool]] = {
    "started-missing": (lambda pid: {"daemon": _entry(started=None)(pid)}, True),
    "started-zero": (lambda pid: {"daemon": _entry(started=0)(pid)}, True),
    "started-null": (lambda pid: {"daemon": {**_entry()(pid), "started": None}}, True),
    "started-not-a-number": (lambda pid: {"daemon": _entry(started="yesterday")(pid)}, True),
    "started-a-float": (lambda pid: {"webserver": _entry(started=1.5e9)(pid)}, True),
    "pid-not-a-number": (lambda pid: {"daemon": _entry(pid=f"{pid}x")(pid)}, True),
    "pid-as-text": (lambda pid: {"daemon": _entry(pid=str(pid))(pid)}, True),
    "cmdline-missing": (lambda pid: {"daemon": _entry(cmdline=None)(pid)}, True),
    "cmdline-not-a-list": (lambda pid: {"daemon": _entry(cmdline="sleep 600")(pid)}, True),
    "entry-a-list": (lambda pid: {"daemon": [pid, _as_recorded(pid)["started"]]}, True),
    "a-name-up-never-records": (lambda pid: {"exporter": _entry()(pid)}, True),
    "up-started-missing": (lambda pid: {"up": _entry(started=None)(pid)}, True),
    "other-command-line": (
        lambda pid: {"daemon": _entry(cmdline=["dagster-daemon", "run"])(pid)},
        False,
    ),
    "other-start-time": (
        lambda pid: {"up": _entry(started=int(_as_recorded(pid)["started"]) + 1)(pid)},  # type: ignore[call-overload]
        False,
    ),
}


def _record_warnings(result: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in result.stderr.splitlines() if "stack record" in line]


@pytest.mark.parametrize("kind", list(BAD_ENTRIES))
def test_an_entry_that_is_not_exactly_what_up_recorded_never_signals_anything(
    tmp_path: Path, stranger: subprocess.Popen[bytes], kind: str
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    entries, reported = BAD_ENTRIES[kind]
    record = home / "up.json"
    env = _env(home)

    record.write_text(json.dumps(entries(stranger.pid)))
    status = run_cli("services", "status", "--json", env=env)
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["dagster"]["running"] is False
    assert len(_record_warnings(status)) == (1 if reported else 0), status.stderr

    record.write_text(json.dumps(entries(stranger.pid)))
    stop = run_cli("services", "stop", env=env)
    assert stop.returncode == 0, stop.stderr
    assert stop.stdout.splitlines() == ["embedded servers stopped"], stop.stdout
    assert len(_record_warnings(stop)) == (1 if reported else 0), stop.stderr

    record.write_text(json.dumps(entries(stranger.pid)))
    with socket.socket() as taken:  # `up` ends right after its take-over, before any server
        taken.bind(("127.0.0.1", int(env["REMINDER_EMBEDDED_PG_PORT"])))
        taken.listen(1)
        up = run_cli("up", "--no-demo", env=env)
    assert up.returncode == 1 and "already in use" in error_lines(up)[0], up.stderr
    assert "earlier up" not in up.stdout
    assert "Traceback" not in up.stderr + status.stderr + stop.stderr

    assert stranger.poll() is None  # neither SIGINT, SIGTERM nor SIGKILL reached it


@pytest.mark.parametrize(
    "content",
    [b"{not json", b"[1, 2]", b'"up"', b"", b"\xff\xfe{}"],
    ids=["not-json", "a-list", "a-string", "empty", "not-utf8"],
)
def test_a_malformed_record_is_reported_in_one_line_set_aside_and_the_commands_go_on(
    tmp_path: Path, stranger: subprocess.Popen[bytes], content: bytes
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    record = home / "up.json"
    env = _env(home)
    for command in (("services", "status", "--json"), ("services", "stop"), ("up", "--no-demo")):
        for old in home.glob("up.json.bad-*"):
            old.unlink()
        record.write_bytes(content)
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", int(env["REMINDER_EMBEDDED_PG_PORT"])))
            taken.listen(1)
            result = run_cli(*command, env=env)
        expected = 1 if command[0] == "up" else 0  # `up`: the port taken, after the take-over
        assert result.returncode == expected, result.stderr
        assert "Traceback" not in result.stderr
        [warning] = _record_warnings(result)
        assert "set aside" in warning and "up.json.bad-" in warning
        [aside] = home.glob("up.json.bad-*")
        assert aside.read_bytes() == content  # kept for a look, out of the way
        if command[0] == "up":
            assert "already in use" in error_lines(result)[0]
    assert stranger.poll() is None


def test_a_process_recorded_right_after_its_start_is_recorded_with_its_command_line(tmp_path):
    """``up`` records each Dagster process as soon as ``Popen`` returns, which can be before the
    child's exec has set its command line in /proc (seen under load: an entry recorded with none,
    which ``services stop`` then ignores). Each of twenty starts is recorded whole."""
    record = StackRecord(tmp_path / "home")
    procs = []
    try:
        for _ in range(20):
            proc = subprocess.Popen(["sleep", "600"], start_new_session=True)
            procs.append(proc)
            record.add("daemon", proc.pid)
            assert json.loads(record.path.read_text())["daemon"]["cmdline"] == ["sleep", "600"]
            assert record.running() == {"daemon": proc.pid}
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
