"""Two signals: a broker outage shows as an outbox backlog, never as a dispatcher that is not live.

Three real cycles run against the test database with a producer whose broker is unreachable.
Each moves its due row to Sent with its outbox row and is recorded as a successful cycle with
its refused deliveries. The real exporter then serves a last-success timestamp that advances
with each cycle and ``errors_total{kind="publish"}`` that grows, the ``dispatch_liveness`` check
passes, and the ``outbox_backlog`` check fails once the oldest message is over 2 minutes old:
what the liveness and outbox-backlog alerts read.
"""

from __future__ import annotations

from datetime import UTC, datetime

import sqlalchemy as sa

from reminder_pipeline import cycle
from reminder_pipeline.config import KafkaSettings
from reminder_pipeline.local.servers import free_port
from reminder_pipeline.messaging.kafka import KafkaPublisher
from reminder_pipeline.observability import exporter as exp
from reminder_pipeline.observability import health

from ..support import make_due_event, outbox_rows, reminders
from .helpers import exporter_settings, scrape


def test_a_broker_outage_keeps_liveness_and_fires_the_outbox_backlog(engine, database_url):
    # Nothing listens on this port: every delivery fails within the message time-out.
    down = KafkaPublisher(KafkaSettings(f"127.0.0.1:{free_port()}"), message_timeout_ms=1000)
    settings, endpoints = exporter_settings(database_url)
    running = exp.start_exporter(settings, endpoints)
    scrapes = []
    events = []
    try:
        for minutes in (3, 2, 1):
            events.append(make_due_event(engine, minutes_overdue=minutes))
            report = cycle.run_cycle(engine, down, budget_seconds=5)
            assert report.counts.sent == 1 and report.relay.published == 0
            scrapes.append(scrape(running.url))
    finally:
        running.stop()
        down.close(timeout=5)

    assert all(reminders(engine, e)[0]["status"] == "Sent" for e in events)
    assert [o["published_at"] for o in outbox_rows(engine)] == [None, None, None]
    last = scrapes[-1]
    # Liveness: every cycle succeeded, the timestamp advanced with each one.
    assert last.value(exp.CYCLES, result="succeeded") == 3
    assert last.value(exp.CYCLES, result="failed") == 0
    assert last.value(exp.ERRORS, kind="cycle") == 0
    stamps = [s.value(exp.LAST_SUCCESS) for s in scrapes]
    assert None not in stamps and stamps == sorted(set(stamps))
    # Publish health: each cycle's relay counts every row it could not deliver (at least once
    # each: 1, then 2, then 3 rows; more when it retried within its budget), and the backlog.
    refused = [s.value(exp.ERRORS, kind="publish") for s in scrapes]
    assert refused[0] >= 1 and refused[1] >= refused[0] + 2 and refused[2] >= refused[1] + 3
    assert last.value(exp.OUTBOX_UNPUBLISHED) == 3
    assert last.value(exp.PUBLISHED) == 0

    now = datetime.now(UTC)
    assert health.liveness(engine, now).passed
    assert health.outbox_backlog(engine, now).passed  # written seconds ago: within 2 minutes
    with engine.begin() as conn:  # as the outage goes on, the oldest message ages
        conn.execute(
            sa.text(
                "UPDATE outbox SET created_at = created_at - interval '3 minutes' WHERE id = "
                "(SELECT min(id) FROM outbox)"
            )
        )
    backlog = health.outbox_backlog(engine, now)
    assert not backlog.passed
    assert backlog.metadata["unpublished"] == 3
    assert backlog.runbook_url == health.RUNBOOK_OUTBOX
    assert health.liveness(engine, now).passed
    # Three minutes of refused deliveries are not yet "errors sustained" (10 minutes).
    assert health.errors(engine, now).passed
