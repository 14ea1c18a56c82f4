"""A stop signal at any moment of ``reminder-pipeline up``'s start: exit 130, everything stopped.

``up`` runs in a subprocess with its own home and free ports, its progress on every poll. The
signal (SIGINT, SIGTERM or SIGHUP) is sent at one point of the start per case: at a line it
prints (the servers starting, the first cycle done, polls of the wait for Dagster), or some
seconds after one. A timed point may fall past the start on a quick machine: then the output
shows the start's end before the stop, and the exit is the clean stop's 0. (The wait's last
line, "code location ... loaded", is past the start's last checkpoint: a signal then is the
clean stop, exit 0, ``test_up_stops.py``.) Most cases start ``up`` the way a shell starts a
background job, with SIGINT and SIGTERM inherited *ignored* (and Dagster's in-process runs map
SIGTERM onto SIGINT's disposition, so a test session may hand both on): a signal must stop it
all the same. Afterwards no process of that home runs (the Dagster processes and code servers,
the guard, the embedded PostgreSQL and broker), awaited with a generous deadline, not slept for.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from reminder_pipeline.cli import EXIT_INTERRUPTED

from ..support import up_env

pytestmark = pytest.mark.slow

#: How long what `up` started may take to be gone on a loaded machine.
GONE_SECONDS = 120


def _ignoring_stop_signals() -> None:
    """A background job's start: SIGINT (the shell) and SIGTERM (Dagster's mapping) ignored."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def _of_home(home: Path) -> list[psutil.Process]:
    """The live processes that belong to ``home``: named in their command line or run in it."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                continue
            if str(home) in " ".join(proc.cmdline()) or proc.cwd().startswith(str(home)):
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def _gone(processes: list[psutil.Process], home: Path) -> list[str]:
    """Await the end of ``processes`` and of any process of ``home``; what is left running."""
    deadline = time.monotonic() + GONE_SECONDS
    _, alive = psutil.wait_procs(processes, timeout=GONE_SECONDS)
    left = alive + _of_home(home)
    while left and time.monotonic() < deadline:
        _, left = psutil.wait_procs(left, timeout=max(deadline - time.monotonic(), 0.1))
        left += _of_home(home)
    return [" ".join(p.cmdline()[:3]) for p in left if p.is_running()]


# (the line it waits for, how many of them, seconds after it, signal, inherited ignored)
POINTS = [
    ("reminder-pipeline: starting under", 1, 0.0, signal.SIGINT, True),
    ("reminder-pipeline: starting under", 1, 2.0, signal.SIGTERM, True),
    ("reminder-pipeline: starting under", 1, 6.0, signal.SIGHUP, True),
    ("first dispatch cycle:", 1, 0.0, signal.SIGTERM, True),
    # Polls are 0.25 s apart. The code server loads the definitions first (the longest wait:
    # Dagster and the project imported); the webserver, started once it listens, then answers
    # within a few polls.
    ("reminder-pipeline: waiting for Dagster: code server", 3, 0.0, signal.SIGTERM, True),
    ("reminder-pipeline: waiting for Dagster: code server", 6, 0.0, signal.SIGHUP, True),
    ("reminder-pipeline: waiting for Dagster: webserver", 1, 0.0, signal.SIGINT, True),
    ("reminder-pipeline: waiting for Dagster: webserver", 2, 0.0, signal.SIGTERM, True),
    # The plain case: dispositions as a terminal gives them, Ctrl-C while Dagster loads.
    ("reminder-pipeline: waiting for Dagster:", 1, 0.0, signal.SIGINT, False),
]


@pytest.mark.parametrize(
    ("line", "nth", "delay", "sig", "ignored"),
    POINTS,
    ids=[
        f"{p[0].split(': ')[-1].split()[0]}-{p[1]}-{p[2]:g}s-{p[3].name}"
        f"{'-inherited-ignored' if p[4] else ''}"
        for p in POINTS
    ],
)
def test_a_stop_signal_at_any_moment_of_the_start_stops_everything_and_exits_130(
    tmp_path: Path, line: str, nth: int, delay: float, sig: signal.Signals, ignored: bool
) -> None:
    home = tmp_path / "home"
    env = up_env(home, REMINDER_PROGRESS_SECONDS="0", REMINDER_LOG_LEVEL="WARNING")
    proc = subprocess.Popen(
        [sys.executable, "-m", "reminder_pipeline.cli", "up", "--no-demo"],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        preexec_fn=_ignoring_stop_signals if ignored else None,
    )
    started: list[psutil.Process] = []
    try:
        seen, matched = [], 0
        for text in proc.stdout:
            seen.append(text)
            matched += text.startswith(line)
            if matched == nth or text.startswith("Dagster UI:"):
                break
        assert matched == nth, "the point never came: " + "".join(seen[-20:])
        time.sleep(delay)  # a point in time, not a wait for an event
        started = psutil.Process(proc.pid).children(recursive=True)
        proc.send_signal(sig)
        out, _ = proc.communicate(timeout=GONE_SECONDS + 60)
        if delay and "Dagster UI:" in out.partition("stopping...")[0]:
            # A point in time, not a line: on a quick machine the start was over before the
            # signal came, so this was the clean stop of a running stack (exit 0).
            assert proc.returncode == 0, "".join(seen[-20:]) + out
        else:
            assert proc.returncode == EXIT_INTERRUPTED, "".join(seen[-20:]) + out
            assert "Dagster UI:" not in out
        if "Dagster" in line:  # up stopped Dagster itself, in order (librdkafka's lines: "%")
            ours = [t for t in out.splitlines() if t.strip() and not t.startswith("%")]
            assert ours[-1] == "stopped", out
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert _gone(started, home) == []
