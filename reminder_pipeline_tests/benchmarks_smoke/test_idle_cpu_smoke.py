"""The local stack's CPU meter without the stack: a process that works and ends between two samples
still counts, for its part (the whole ``up`` runs in ``python -m benchmarks.idle_cpu``, not here)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

# In a process of its own: the meter counts every descendant of the process it runs in.
SCRIPT = textwrap.dedent(
    """
    import os, subprocess, sys, time
    from benchmarks.idle_cpu import Meter

    burn = "import time\\nend = time.process_time() + 0.4\\nwhile time.process_time() < end: pass"
    parent = subprocess.Popen(
        [sys.executable, "-c",
         "import subprocess, sys, time\\n"
         f"subprocess.run([sys.executable, '-c', {burn!r}, 'dagster-daemon'])\\n"
         "time.sleep(30)"],
    )
    time.sleep(0.1)
    meter = Meter(os.getpid())
    while True:  # until the parent has reaped the child
        time.sleep(0.2)
        meter.step()
        if meter.prev[parent.pid].reaped >= 0.3:
            break
    result = meter.result()
    parent.kill()
    parent.wait()
    print(round(result["total"], 2), round(result.get("dagster daemon", 0.0), 2))
    """
)


def test_a_child_that_ends_between_samples_is_counted_for_its_part() -> None:
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60, check=True
    ).stdout.split()
    total, daemon = float(out[0]), float(out[1])
    assert total >= 0.3  # the child's 0.4 CPU-s (the clock ticks are 10 ms)
    assert daemon >= 0.3  # its part: both command lines name dagster-daemon
