"""The consumer's CPU-time benchmark on a tiny size (``python -m benchmarks.consumer_cpu``, no
servers): it runs, and every message is notified."""

from __future__ import annotations

from .helpers import run_benchmark


def test_the_cpu_figure_handles_every_message_once() -> None:
    proc = run_benchmark(
        "consumer_cpu", "--messages", "40", "--batch", "7", "--rounds", "2", "--log", timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    # Half the messages have a client: 40 reminders, 60 notifications a round.
    assert "40 messages, batches of 7, 60 notifications a round, INFO lines logged;" in proc.stdout
    assert "CPU per message: median" in proc.stdout
    # --log pays for the package's JSON lines and writes them to /dev/null, not into the output.
    output = (proc.stdout + proc.stderr).splitlines()
    assert not [line for line in output if line.startswith("{")], output[:3]
