"""Stop signals are never lost: taken whatever was inherited, and kept once received.

In this process, with real signals sent to itself: a SIGINT or SIGTERM inherited *ignored* (a
shell's background job; Dagster maps SIGTERM onto SIGINT's disposition) still stops the command
line, and a KeyboardInterrupt that Python drops inside a finaliser is raised again at the next
checkpoint of ``up``'s start.
"""

from __future__ import annotations

import gc
import os
import signal
import sys
from collections.abc import Iterator

import pytest

from reminder_pipeline.cli.context import honour_stop_signals, stop_requests


@pytest.fixture
def ignored() -> Iterator[None]:
    """SIGINT and SIGTERM ignored, as a background job after Dagster's mapping; then restored."""
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    for sig in previous:
        signal.signal(sig, signal.SIG_IGN)
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def test_the_command_line_takes_back_stop_signals_it_inherited_ignored(ignored):
    honour_stop_signals()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_a_stop_request_hears_a_signal_inherited_ignored_and_restores_what_was_there(ignored, sig):
    with stop_requests(signal.SIGHUP) as request:
        os.kill(os.getpid(), sig)
        request.wait()  # returns: the handler woke it
        assert request.signal == sig
        with pytest.raises(KeyboardInterrupt):
            request.check()
        os.kill(os.getpid(), sig)  # a second one changes nothing
        assert request.signal == sig
    assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_IGN


class _SignalledWhileFinalised:
    """An object whose finaliser gets the signal: Python drops what a finaliser raises."""

    def __del__(self) -> None:
        os.kill(os.getpid(), signal.SIGTERM)
        sum(range(1000))  # the handler runs here, inside the finaliser


def test_an_interrupt_dropped_inside_a_finaliser_is_raised_at_the_next_checkpoint(
    ignored, monkeypatch
):
    dropped: list[sys.UnraisableHookArgs] = []
    monkeypatch.setattr(sys, "unraisablehook", dropped.append)
    with stop_requests(interrupting=True) as request:
        obj = _SignalledWhileFinalised()
        del obj
        gc.collect()
        # Still here: the KeyboardInterrupt went to "Exception ignored in ..." instead.
        assert [type(d.exc_value) for d in dropped] == [KeyboardInterrupt]
        assert request.signal == signal.SIGTERM
        with pytest.raises(KeyboardInterrupt):
            request.check()


def test_up_s_ready_lines_survive_a_reader_that_left_after_the_first() -> None:
    """``up | head -1`` (or a test reading up to "Dagster UI:"), unbuffered: the pipe is closed
    while the later ready lines are printed; ``up`` must go on to its stop, not exit 1 on EPIPE."""
    import subprocess

    code = (
        "import sys; from reminder_pipeline.cli.up import _print_ready\n"
        "sys.stdin.read()\n"  # wait until the reader has gone
        "_print_ready('http://ui', 'http://metrics', 'postgresql+psycopg://u@h:1/d')\n"
        "print('still here', file=sys.stderr)\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert proc.stdout is not None and proc.stdin is not None and proc.stderr is not None
    proc.stdout.close()  # the reader is gone before the first line
    proc.stdin.close()
    err = proc.stderr.read()
    assert proc.wait(60) == 0, err
    assert b"still here" in err
