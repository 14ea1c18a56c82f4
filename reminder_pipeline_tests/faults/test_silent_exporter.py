"""The metrics exporter while its databases go silent, on a real PostgreSQL behind the fault proxy
gone "stuck" (sockets open, nothing answered): every scrape answers within Prometheus' 10 s
scrape timeout, ``up 0`` and no daemon heartbeat ages (read, as Dagster's storage is, through
psycopg2 on the same silent server) instead of hanging, one warning line however many scrapes;
once the database answers, the figures come back.
"""

from __future__ import annotations

import time

import pytest
import sqlalchemy as sa

from reminder_pipeline.observability import exporter as exp
from reminder_pipeline.store.engine import dagster_storage_url
from reminder_pipeline_testkit.fault_proxy import FaultProxy
from reminder_pipeline_tests.observability.helpers import (
    captured_json_logs,
    exporter_settings,
    log_lines,
    scrape,
)

pytestmark = pytest.mark.server

#: Prometheus' default scrape timeout; ``scrape`` itself gives up after it.
SCRAPE_TIMEOUT = 10.0
FAILING = "metrics scrape cannot read the database (migrated? reachable?)"


def test_scrapes_answer_within_the_scrape_timeout_while_the_database_is_silent(
    database_url_via_proxy: str, pg_proxy: FaultProxy
) -> None:
    dagster = sa.create_engine(dagster_storage_url(database_url_via_proxy), pool_pre_ping=True)

    def heartbeats() -> dict[str, float]:
        with dagster.connect() as conn:
            return {
                "SCHEDULER": float(
                    conn.exec_driver_sql("SELECT extract(epoch FROM now())").scalar_one()
                )
            }

    settings, endpoints = exporter_settings(database_url_via_proxy)
    running = exp.start_exporter(settings, endpoints, heartbeats=heartbeats)
    try:
        before = scrape(running.url)
        assert before.value(exp.UP) == 1
        assert exp.DAEMON_HEARTBEAT_AGE in before.families
        with captured_json_logs() as logs:
            pg_proxy.set_mode("stuck")
            took = []
            for _ in range(2):
                started = time.monotonic()
                silent = scrape(running.url)  # raises past 10 s, as Prometheus gives up
                took.append(time.monotonic() - started)
                assert silent.value(exp.UP) == 0
                assert exp.DAEMON_HEARTBEAT_AGE not in silent.families
            assert max(took) < SCRAPE_TIMEOUT, took
            pg_proxy.set_mode("pass")
            deadline = time.monotonic() + 60
            while scrape(running.url).value(exp.UP) == 0 and time.monotonic() < deadline:
                time.sleep(1)
            assert scrape(running.url).value(exp.UP) == 1
        messages = [line["msg"] for line in log_lines(logs)]
        assert messages.count(FAILING) == 1
    finally:
        running.stop()
        pg_proxy.close()  # ends a psycopg2 read still held by the silent proxy
        dagster.dispose()
