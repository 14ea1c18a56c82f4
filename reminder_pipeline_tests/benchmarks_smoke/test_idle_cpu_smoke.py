"""The local stack's CPU benchmark end to end on a stand-in stack (``python -m benchmarks.idle_cpu
--tree``, seconds): a process that works and ends between two samples still counts, for its part.

``--tree DIR`` runs ``up`` from another checkout; here the checkout is a stand-in whose ``up`` is
ready at once, waits until the benchmark reads its PostgreSQL (the moment before the meter starts),
then starts a child that works 0.4 CPU-s and ends, and idles until Ctrl-C. The real ``up`` runs in
``python -m benchmarks.idle_cpu`` by hand (benchmarks/README.md), not here.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

from .helpers import run_benchmark

#: The stand-in's ``reminder_pipeline/cli.py``, run as ``python -m reminder_pipeline.cli up``.
STAND_IN_UP = textwrap.dedent(
    """
    import os, socket, subprocess, sys, time

    listener = socket.create_server(("127.0.0.1", int(os.environ["REMINDER_EMBEDDED_PG_PORT"])))
    print("Dagster UI: http://127.0.0.1:3000", flush=True)
    listener.accept()[0].close()  # the benchmark asks PostgreSQL for its sessions, then meters
    listener.close()
    time.sleep(0.5)
    burn = "import time\\nend = time.process_time() + 0.4\\nwhile time.process_time() < end: pass"
    subprocess.run([sys.executable, "-c", burn, "dagster-daemon"], check=True)
    time.sleep(600)
    """
)


def test_a_child_that_ends_between_samples_is_counted_for_its_part(tmp_path: Path) -> None:
    tree = tmp_path / "checkout"
    (tree / "reminder_pipeline").mkdir(parents=True)
    (tree / "reminder_pipeline" / "__init__.py").write_text("")
    (tree / "reminder_pipeline" / "cli.py").write_text(STAND_IN_UP)
    out = tmp_path / "idle_cpu.json"
    proc = run_benchmark(
        "idle_cpu",
        *("--tree", str(tree), "--minutes", "0.1", "--warmup", "0", "--interval", "0.2"),
        *("--json", str(out)),
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(out.read_text())
    cpu_s = {part: p / 100 * result["seconds"] for part, p in result["percent_of_one_core"].items()}
    assert cpu_s["total"] >= 0.3  # the child's 0.4 CPU-s (the clock ticks are 10 ms)
    assert cpu_s["dagster daemon"] >= 0.3  # its part: its command line names dagster-daemon
    assert "dagster daemon" in proc.stdout  # the table names the part
