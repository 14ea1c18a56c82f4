"""Packet-drop scenario: how a bounded libpq connection notices a black-holed PostgreSQL.

Run in a network namespace of its own (``reminder_pipeline_testkit.netns.run_in_own_network``), from
the repository root: ``python -m reminder_pipeline_tests.faults.scenario_drop_probe``. It starts an
embedded PostgreSQL on a free port in a temporary directory, connects with TCP keepalives and
``tcp_user_timeout``, drops the port's packets both ways (iptables), runs a query, and prints one
JSON line: whether the query failed, how, and after how many seconds.
"""

from __future__ import annotations

import time
from typing import Any

import psycopg

from reminder_pipeline.local.servers import EmbeddedPostgres
from reminder_pipeline_testkit.netns import drop_port, undrop_port
from reminder_pipeline_tests.faults.scenarios import run_on_own_server

#: libpq's client-side bounds: keepalive probes after 2 s idle, and unacknowledged data given up
#: after 5 s (tcp_user_timeout), instead of Linux's ~15 minutes of retransmissions.
BOUNDS = {
    "keepalives": 1,
    "keepalives_idle": 2,
    "keepalives_interval": 2,
    "keepalives_count": 2,
    "tcp_user_timeout": 5000,
    "connect_timeout": 10,
}


def probe(server: EmbeddedPostgres) -> dict[str, Any]:
    """Connect, drop the port's packets, run a query: what surfaced, and when."""
    conn = psycopg.connect(
        host=server.host,
        port=server.port,
        user="postgres",
        dbname="postgres",
        autocommit=True,
        **BOUNDS,
    )
    before = conn.execute("SELECT 1").fetchone()
    drop_port(server.port)
    started = time.monotonic()
    try:
        conn.execute("SELECT 1").fetchone()
    except psycopg.OperationalError as exc:
        outcome, error = "failed", f"{type(exc).__name__}: {' '.join(str(exc).split())}"
    else:
        outcome, error = "answered", None
    seconds = time.monotonic() - started
    undrop_port(server.port)
    conn.close()
    return {
        "before": before[0] if before else None,
        "outcome": outcome,
        "error": error,
        "seconds": round(seconds, 2),
    }


def main() -> None:
    """Run the probe on a server of its own and print the findings as one JSON line."""
    run_on_own_server("rp-drop-probe-", probe)


if __name__ == "__main__":
    main()
