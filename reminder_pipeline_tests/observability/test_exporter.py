"""The metrics endpoint after real cycles: scraped over HTTP and parsed with prometheus_client's parser.

Real dispatch cycles run against the test database and broker, the exporter is started on a
free port exactly as ``reminder-pipeline metrics`` starts it, and its text output is parsed;
counters must survive an exporter restart and count failed cycles.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa

from reminder_pipeline import cycle
from reminder_pipeline.local.servers import free_port
from reminder_pipeline.observability import exporter as exp
from reminder_pipeline.observability import ledger, metric_names
from reminder_pipeline.observability.metrics_http import MetricsPortUnavailable

from ..support import POISON_KIND, make_due_event, reminders
from .helpers import exporter_settings, scrape


@pytest.fixture
def metrics(database_url):
    """A running exporter on the test's database; yields its URL."""
    settings, endpoints = exporter_settings(database_url)
    running = exp.start_exporter(settings, endpoints)
    yield running.url
    running.stop()


class ExplodingPublisher:
    """A producer whose client library fails outright (not a delivery failure)."""

    def publish(self, messages, timeout=None):
        raise RuntimeError("producer crashed")


def test_scrape_after_real_cycles_serves_the_seed_metrics(engine, publisher, metrics):
    setup_started = datetime.now(UTC)  # DueAt is set relative to the clock at each row's creation
    for minutes in (0.5, 1.0, 1.5):
        make_due_event(engine, minutes_overdue=minutes)
    make_due_event(engine, status="Cancelled")
    before = datetime.now(UTC)

    report = cycle.run_cycle(engine, publisher)
    # Each row's lateness is its overdue minutes plus the time from its creation to its write.
    elapsed = (datetime.now(UTC) - setup_started).total_seconds()
    assert (report.counts.sent, report.counts.skipped) == (3, 1)
    result = scrape(metrics)

    # Every family, but the oldest snapshot's holder: nothing holds the horizon back now.
    assert result.sample_families() == set(exp.DISPATCH_METRIC_NAMES) - set(
        metric_names.WHILE_HELD_METRIC_NAMES
    )
    assert result.value(exp.UP) == 1
    assert result.value(exp.ITEMS, result="sent") == 3
    assert result.value(exp.ITEMS, result="skipped") == 1
    assert result.value(exp.PUBLISHED) == 3
    assert result.value(exp.SKIP_LOCKED) == 0
    for kind in ("cycle", "item", "publish"):
        assert result.value(exp.ERRORS, kind=kind) == 0
    assert result.value(exp.CYCLES, result="succeeded") == 1
    assert result.value(exp.CYCLE_DURATION + "_count") == 1
    assert 0 < result.value(exp.CYCLE_DURATION + "_sum") < 30

    # Lateness = SentAt - DueAt of the three sent rows: 30-90 s, all within the 120 s SLO.
    assert result.value(exp.LATENESS + "_count") == 3
    assert 90 <= result.value(exp.LATENESS + "_sum") <= 180 + 3 * elapsed
    buckets = result.buckets(exp.LATENESS)
    assert list(buckets) == [repr(float(b)) for b in ledger.LATENESS_BUCKETS] + ["+Inf"]
    assert list(buckets.values()) == sorted(buckets.values())  # cumulative
    assert buckets["30.0"] == 0 and buckets["120.0"] == 3 and buckets["+Inf"] == 3

    assert result.value(exp.BACKLOG_GAUGE) == 0
    assert result.value(exp.OUTBOX_UNPUBLISHED) == 0
    assert result.value(exp.OUTBOX_LAG_GAUGE) == 0
    last_success = result.value(exp.LAST_SUCCESS)
    assert before.timestamp() - 1 <= last_success <= datetime.now(UTC).timestamp() + 1


def test_counters_survive_an_exporter_restart_and_keep_counting(engine, publisher, database_url):
    make_due_event(engine, minutes_overdue=1)
    cycle.run_cycle(engine, publisher)
    settings, endpoints = exporter_settings(database_url)

    first = exp.start_exporter(settings, endpoints)
    try:
        before = scrape(first.url)
    finally:
        first.stop()
    assert before.value(exp.ITEMS, result="sent") == 1

    # A new process (same port, nothing carried over in memory) serves the same counters...
    second = exp.start_exporter(settings, endpoints)
    try:
        again = scrape(second.url)
        assert again.value(exp.ITEMS, result="sent") == 1
        assert again.value(exp.LATENESS + "_count") == before.value(exp.LATENESS + "_count")
        assert again.value(exp.CYCLE_DURATION + "_count") == 1
        # ...and the next run (another short-lived process in production) adds to them.
        make_due_event(engine, minutes_overdue=2)
        make_due_event(engine, minutes_overdue=3)
        cycle.run_cycle(engine, publisher)
        after = scrape(second.url)
    finally:
        second.stop()
    assert after.value(exp.ITEMS, result="sent") == 3
    assert after.value(exp.CYCLE_DURATION + "_count") == 2
    assert after.value(exp.LATENESS + "_count") == 3


def test_an_errored_cycle_counts_in_errors_total_and_still_raises(engine, metrics):
    make_due_event(engine, minutes_overdue=1)

    with pytest.raises(RuntimeError, match="producer crashed"):
        cycle.run_cycle(engine, ExplodingPublisher())
    result = scrape(metrics)

    assert result.value(exp.ERRORS, kind="cycle") == 1
    assert result.value(exp.CYCLES, result="failed") == 1
    assert result.value(exp.CYCLES, result="succeeded") == 0
    assert result.value(exp.CYCLE_DURATION + "_count") == 1
    # Never a successful cycle: the liveness series is absent, which the alert treats as down.
    assert result.value(exp.LAST_SUCCESS) is None
    # The dispatch transaction had committed before the relay failed: the row waits in the outbox.
    assert result.value(exp.OUTBOX_UNPUBLISHED) == 1


def test_poison_rows_and_refused_deliveries_count_as_errors(engine, publisher, metrics):
    make_due_event(engine, minutes_overdue=2, kind=POISON_KIND)  # poison: breaks the contract
    make_due_event(engine, minutes_overdue=1)

    report = cycle.run_cycle(engine, publisher)
    assert report.counts.failed == 1
    result = scrape(metrics)

    assert result.value(exp.ERRORS, kind="item") == 1
    assert result.value(exp.ERRORS, kind="cycle") == 0
    assert result.value(exp.CYCLES, result="succeeded") == 1
    # The poison row stays Pending and due: it is backlog, its age what the overdue alert sees.
    assert result.value(exp.BACKLOG_GAUGE) == 1
    assert 110 <= result.value(exp.BACKLOG_OLDEST_AGE) <= 150


def test_backlog_and_outbox_lag_are_read_live_on_each_scrape(engine, metrics):
    make_due_event(engine, minutes_overdue=10)
    make_due_event(engine, minutes_overdue=4)
    result = scrape(metrics)
    assert result.value(exp.BACKLOG_GAUGE) == 2
    assert 595 <= result.value(exp.BACKLOG_OLDEST_AGE) <= 620
    assert result.value(exp.OUTBOX_UNPUBLISHED) == 0

    cycle.run_cycle(engine, None)  # no relay: the messages wait in the outbox
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE outbox SET created_at = now() - interval '3 minutes'"))
    result = scrape(metrics)
    assert result.value(exp.BACKLOG_GAUGE) == 0
    assert result.value(exp.BACKLOG_OLDEST_AGE) == 0
    assert result.value(exp.OUTBOX_UNPUBLISHED) == 2
    assert 179 <= result.value(exp.OUTBOX_LAG_GAUGE) <= 200


def test_a_ledger_roll_up_never_moves_a_counter(engine, publisher, metrics):
    for minutes in (1, 2):
        make_due_event(engine, minutes_overdue=minutes)
        cycle.run_cycle(engine, publisher)
    make_due_event(engine, minutes_overdue=1, kind=POISON_KIND)  # poison: breaks the contract
    cycle.run_cycle(engine, publisher)
    before = scrape(metrics)

    moved = ledger.roll_up(engine, retention=timedelta(0))
    assert moved == 3
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM dispatch_cycles")).scalar_one() == 0
    after = scrape(metrics)

    compared = 0
    for family in before.families.values():
        if family.type not in ("counter", "histogram") and family.name != exp.LAST_SUCCESS:
            continue  # live gauges (ages) move with the clock
        for s in family.samples:
            assert after.value(s.name, **s.labels) == pytest.approx(s.value), s.name
            compared += 1
    assert compared >= 30  # both histograms at least


def test_the_scrape_answers_up_0_when_the_database_cannot_be_read(pg_admin_url):
    missing = sa.engine.make_url(pg_admin_url).set(database="rp_no_such_database")
    settings, endpoints = exporter_settings(missing.render_as_string(hide_password=False))
    running = exp.start_exporter(settings, endpoints)
    try:
        result = scrape(running.url)
    finally:
        running.stop()
    assert result.value(exp.UP) == 0
    assert result.sample_families() == {exp.UP, exp.RECONNECTS}
    assert result.value(exp.RECONNECTS) == 0  # never read: no outage has ended


def test_a_port_in_use_is_a_one_line_error(database_url):
    settings, endpoints = exporter_settings(database_url)
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", settings.metrics_port))
        holder.listen()
        with pytest.raises(MetricsPortUnavailable, match=f"127.0.0.1:{settings.metrics_port}"):
            exp.start_exporter(settings, endpoints)


def test_scrape_shows_no_row_level_data(engine, publisher, metrics):
    event_id = make_due_event(engine, minutes_overdue=1)
    cycle.run_cycle(engine, publisher)
    text = scrape(metrics).text
    [row] = reminders(engine, event_id)
    # Counts and ages only: no ids (high cardinality) and no labels besides result/kind/le and
    # the names of the two watched indexes and their tables (the oldest snapshot's holder, one
    # series, only while a snapshot is held: test_vacuum_horizon.py).
    assert str(row["id"]) not in text and str(event_id) not in text
    labels = {
        part.split("=")[0]
        for line in text.splitlines()
        if "{" in line and not line.startswith("#")
        for part in line[line.index("{") + 1 : line.index("}")].split(",")
    }
    assert labels <= {"result", "kind", "le", "index", "table"}


def test_the_metrics_command_serves_until_sigterm_then_exits_cleanly(
    engine, publisher, database_url
):
    # `reminder-pipeline metrics` in its own process, configured by the environment.
    make_due_event(engine, minutes_overdue=1)
    cycle.run_cycle(engine, publisher)
    port = free_port()
    env = {**os.environ, "DATABASE_URL": database_url, "REMINDER_METRICS_PORT": str(port)}
    process = subprocess.Popen(
        [sys.executable, "-m", "reminder_pipeline.cli", "metrics"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        url = f"http://127.0.0.1:{port}/metrics"
        deadline = time.monotonic() + 30
        while True:
            try:
                result = scrape(url)
                break
            except OSError:
                assert process.poll() is None, process.communicate()
                assert time.monotonic() < deadline, "the exporter did not start listening"
                time.sleep(0.1)
        assert result.value(exp.ITEMS, result="sent") == 1
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=15)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 0, err
    assert url in out


def test_the_exporter_serves_the_runbooks_the_ui_links_to(metrics):
    """The runbook links `up` gives the Dagster UI open in a browser: the exporter serves this
    checkout's docs under /docs/ as plain text, and nothing outside them."""
    import urllib.error
    import urllib.request

    from reminder_pipeline.cli.up import docs_served_here
    from reminder_pipeline.config import DOCS_BASE_URL_ENV
    from reminder_pipeline.defs.checks import runbook_link

    base = metrics.removesuffix("/metrics")
    port = int(base.rsplit(":", 1)[1])
    env = docs_served_here(port, {})
    assert env == {DOCS_BASE_URL_ENV: f"http://127.0.0.1:{port}/docs/"}
    assert docs_served_here(port, {DOCS_BASE_URL_ENV: "https://docs.example/"}) == {}
    link = runbook_link("docs/runbooks/reminder-dispatch.md", env[DOCS_BASE_URL_ENV]).value
    assert link.startswith(env[DOCS_BASE_URL_ENV])
    with urllib.request.urlopen(link, timeout=30) as answer:
        assert answer.headers["Content-Type"] == "text/plain; charset=utf-8"
        assert b"# " in answer.read()
    for outside in ("/docs/../pyproject.toml", "/docs/%2e%2e/pyproject.toml", "/docs/nope.md"):
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(base + outside, timeout=30)
        assert refused.value.code == 404
    assert b"calendar_reminder_dispatch" in urllib.request.urlopen(metrics, timeout=30).read()
