"""Packet-drop scenario: the metrics exporter scraped while its database is black-holed.

Run in a network namespace of its own (``reminder_pipeline_testkit.netns.run_in_own_network``), from
the repository root: ``python -m reminder_pipeline_tests.faults.scenario_exporter_drop``. It starts
an embedded PostgreSQL and the exporter on it (with Dagster's daemon heartbeats read through
psycopg2 on the same server, as in a deployment), scrapes once, drops the port's packets both ways
(iptables), scrapes a few times during the drop, lets the packets through and scrapes until ``up``
is 1 again. It prints one JSON line: each scrape's seconds and ``up`` during the drop (a scrape past
Prometheus' 10 s is recorded as no answer), and how long after the packets flowed again the figures
came back.
"""

from __future__ import annotations

import json
import time
from typing import Any

import sqlalchemy as sa

from reminder_pipeline.local.servers import EmbeddedPostgres
from reminder_pipeline.observability import exporter as exp
from reminder_pipeline.store.engine import dagster_storage_url
from reminder_pipeline_testkit.netns import drop_port, undrop_port
from reminder_pipeline_tests.faults.scenario_relay_drop import own_servers
from reminder_pipeline_tests.observability.helpers import exporter_settings, scrape

SCRAPES_DURING_DROP = 3
HEAL_WAIT_SECONDS = 60.0


def _timed_scrape(url: str) -> tuple[float, float | None]:
    """(seconds, up) of one scrape; up None when it did not answer within 10 s."""
    started = time.monotonic()
    try:
        up = scrape(url).value(exp.UP)
    except OSError:  # urllib's timeout: Prometheus would have given up
        up = None
    return round(time.monotonic() - started, 1), up


def scenario(server: EmbeddedPostgres) -> dict[str, Any]:
    """Scrapes before, during and after the drop."""
    dagster = sa.create_engine(dagster_storage_url(server.url("app")), pool_pre_ping=True)

    def heartbeats() -> dict[str, float]:
        with dagster.connect() as conn:
            now = conn.exec_driver_sql("SELECT extract(epoch FROM now())").scalar_one()
            return {"SCHEDULER": float(now)}

    settings, endpoints = exporter_settings(server.url("app"))
    running = exp.start_exporter(settings, endpoints, heartbeats=heartbeats)
    try:
        before = _timed_scrape(running.url)[1]
        drop_port(server.port)
        during = [_timed_scrape(running.url) for _ in range(SCRAPES_DURING_DROP)]
        undrop_port(server.port)
        flowing = time.monotonic()
        after = _timed_scrape(running.url)[1]
        while after != 1 and time.monotonic() - flowing < HEAL_WAIT_SECONDS:
            time.sleep(1)
            after = _timed_scrape(running.url)[1]
        healed = time.monotonic() - flowing
    finally:
        running.stop()
        dagster.dispose()
    return {
        "up_before": before,
        "during_seconds": [seconds for seconds, _ in during],
        "during_up": [up for _, up in during],
        "up_after": after,
        "healed_seconds": round(healed, 1),
    }


def main() -> None:
    """Run the scenario on a server of its own and print the findings as one JSON line."""
    with own_servers("rp-exporter-drop-", broker=False) as (server, _watcher):
        findings = scenario(server)
    print(json.dumps(findings), flush=True)


if __name__ == "__main__":
    main()
