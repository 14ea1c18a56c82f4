"""Running a benchmark's command line as a user does: ``python -m benchmarks.<name>`` from the root.

The tests reach a benchmark only so, never by importing it (``pyproject.toml``'s import contract):
what they check is what the command prints or writes.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def run_benchmark(
    module: str,
    *args: str,
    timeout: float,
    own_servers: bool = False,
    env: Mapping[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """``python -m benchmarks.<module> args`` from the repository root, its output captured.

    ``own_servers``: the benchmark starts its own PostgreSQL and broker even when the suite's
    ``DATABASE_URL`` / ``KAFKA_BOOTSTRAP_SERVERS`` name others. ``env``: more variables for it.
    """
    environ = dict(os.environ)
    environ["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(REPO_ROOT), environ.get("PYTHONPATH")])
    )
    if own_servers:
        for name in ("DATABASE_URL", "KAFKA_BOOTSTRAP_SERVERS"):
            environ.pop(name, None)
    environ.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", f"benchmarks.{module}", *args],
        cwd=REPO_ROOT,
        env=environ,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
