"""The exporter heals when its database restarts: figures resume, the outage is logged once and counted.

A PostgreSQL server of the test's own is restarted (fast shutdown, and immediate: every server
process ended at once, as in a crash) under a running exporter that has already served figures
from pooled connections. Scrapes while it is down answer ``up 0``; the first scrape after it
answers serves the figures again, through new connections; the outage is one warning line and
one recovery line however many scrapes failed, and the exporter's own counter of recoveries
grows by one.
"""

from __future__ import annotations

import pytest

from reminder_pipeline import cycle
from reminder_pipeline.local.servers import EmbeddedPostgres, free_port
from reminder_pipeline.observability import exporter as exp
from reminder_pipeline.store import migrate
from reminder_pipeline.store.engine import make_engine

from ..support import make_due_event
from .helpers import captured_json_logs, exporter_settings, log_lines, scrape

pytestmark = pytest.mark.server

FAILING = "metrics scrape cannot read the database (migrated? reachable?)"
RECOVERED = "metrics scrape reads the database"


@pytest.fixture
def own_postgres(tmp_path):
    """A PostgreSQL server of this test's own (to restart), with a migrated database."""
    server = EmbeddedPostgres(data_dir=tmp_path / "pg", port=free_port())
    server.start()
    url = server.ensure_database("calendar")
    engine = make_engine(url)
    migrate.upgrade(engine)
    yield server, url, engine
    engine.dispose()
    server.stop()


@pytest.mark.parametrize("mode", ["fast", "immediate"])
def test_figures_resume_after_the_database_restarts_logged_once_and_counted(
    own_postgres, publisher, mode
):
    server, url, engine = own_postgres
    make_due_event(engine)
    assert cycle.run_cycle(engine, publisher).counts.sent == 1
    settings, endpoints = exporter_settings(url)
    running = exp.start_exporter(settings, endpoints)
    try:
        before = scrape(running.url)  # the pool now holds connections to the old server
        assert before.value(exp.UP) == 1
        assert before.value(exp.ITEMS, result="sent") == 1
        assert before.value(exp.RECONNECTS) == 0
        with captured_json_logs() as logs:
            server.stop(mode=mode)
            down = [scrape(running.url) for _ in range(3)]
            assert [s.value(exp.UP) for s in down] == [0, 0, 0]
            server.start()

            engine.dispose()
            make_due_event(engine)
            assert cycle.run_cycle(engine, publisher).counts.sent == 1
            after = scrape(running.url)  # the first scrape after the server answers
            assert after.value(exp.UP) == 1
            assert after.value(exp.ITEMS, result="sent") == 2
            assert after.value(exp.RECONNECTS) == 1
            assert scrape(running.url).value(exp.UP) == 1
        messages = [line["msg"] for line in log_lines(logs)]
        assert messages.count(FAILING) == 1  # three failed scrapes, one line
        assert messages.count(RECOVERED) == 1
    finally:
        running.stop()
