"""What every packet-drop scenario module shares: a server of its own inside the namespace."""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from reminder_pipeline.local.servers import EmbeddedPostgres, free_port


def run_on_own_server(prefix: str, scenario: Callable[[EmbeddedPostgres], dict[str, Any]]) -> None:
    """Run ``scenario`` on an embedded PostgreSQL of its own and print its findings as one JSON
    line (the test reads it); the server never outlives the run."""
    root = Path(tempfile.mkdtemp(prefix=prefix))
    server = EmbeddedPostgres(data_dir=root / "data", port=free_port())
    try:
        server.start()
        findings = scenario(server)
    finally:
        # The namespace lives as long as a process in it: the server must not outlive the run.
        server.stop(mode="immediate")
        shutil.rmtree(root, ignore_errors=True)
    print(json.dumps(findings), flush=True)
