"""A read-only look-up never starts a server.

With the ``embedded`` extra installed and ``DATABASE_URL`` (or ``KAFKA_BOOTSTRAP_SERVERS``) set
empty, as a careless shell does, ``reminders``, ``trace``, ``poison list``, ``forecast``,
``db current`` and ``dlq list`` run from an empty directory refuse in one line naming the
setting (exit 2) and leave nothing behind: no ``.reminder-pipeline`` in that directory, nothing
listening on the local stack's ports. ``DATABASE_URL='' reminder-pipeline reminders`` used to
initialise and start a PostgreSQL there and leave it running. (With the local stack up, the
same look-ups use its servers: ``e2e/test_support_walk.py``.)
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from reminder_pipeline.local.endpoints import embedded_installed
from reminder_pipeline.local.servers import free_port, port_in_use

pytestmark = pytest.mark.skipif(
    not embedded_installed(), reason="without the embedded extra nothing could start anyway"
)

LOOKUPS = {
    "reminders": (("reminders", "--client", str(uuid.uuid4())), "DATABASE_URL"),
    "trace": (("trace", str(uuid.uuid4())), "DATABASE_URL"),
    "poison list": (("poison", "list"), "DATABASE_URL"),
    "forecast": (("forecast",), "DATABASE_URL"),
    "db current": (("db", "current"), "DATABASE_URL"),
    "dlq list": (("dlq", "list"), "KAFKA_BOOTSTRAP_SERVERS"),
}


@pytest.mark.parametrize("name", list(LOOKUPS))
def test_a_lookup_with_no_server_named_refuses_and_starts_nothing(tmp_path: Path, name: str):
    args, setting = LOOKUPS[name]
    pg_port, broker_port = free_port(), free_port()
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("REMINDER_", "DAGSTER_"))},
        "DATABASE_URL": "",
        "KAFKA_BOOTSTRAP_SERVERS": "",
        "REMINDER_EMBEDDED_PG_PORT": str(pg_port),
        "REMINDER_EMBEDDED_BROKER_PORT": str(broker_port),
    }
    result = subprocess.run(
        [sys.executable, "-m", "reminder_pipeline.cli", *args],
        cwd=tmp_path,  # REMINDER_PIPELINE_HOME unset: .reminder-pipeline here, as in the issue
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )

    assert result.returncode == 2, result.stderr
    assert result.stdout == ""
    [line] = result.stderr.splitlines()
    home = tmp_path / ".reminder-pipeline"
    port = pg_port if setting == "DATABASE_URL" else broker_port
    assert line.startswith(
        f"reminder-pipeline: error: {setting} is not set and no embedded "
        f"{'PostgreSQL' if setting == 'DATABASE_URL' else 'broker'} runs under {home} on port "
        f"{port}: a look-up starts no server"
    ), line
    assert list(tmp_path.iterdir()) == []  # no home, no data directory
    assert not port_in_use("127.0.0.1", pg_port) and not port_in_use("127.0.0.1", broker_port)
