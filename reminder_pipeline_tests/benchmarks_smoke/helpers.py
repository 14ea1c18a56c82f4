"""Running a benchmark's command line as a user does: ``python -m benchmarks.<name>`` from the root."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def run_benchmark(
    module: str, *args: str, timeout: float, own_servers: bool = False
) -> subprocess.CompletedProcess[str]:
    """``python -m benchmarks.<module> args`` from the repository root, its output captured.

    ``own_servers``: the benchmark starts its own PostgreSQL and broker even when the suite's
    ``DATABASE_URL`` / ``KAFKA_BOOTSTRAP_SERVERS`` name others.
    """
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    if own_servers:
        for name in ("DATABASE_URL", "KAFKA_BOOTSTRAP_SERVERS"):
            env.pop(name, None)
    return subprocess.run(
        [sys.executable, "-m", f"benchmarks.{module}", *args],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
