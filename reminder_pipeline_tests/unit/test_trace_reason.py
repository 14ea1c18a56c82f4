"""The trace's reason in words, judged on the database's clock: one per state, no server."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from reminder_pipeline.operator_jobs.trace import reason, run_url

NOW = datetime(2026, 12, 2, 9, 0, tzinfo=UTC)
MINUTE = timedelta(minutes=1)


def _row(**changes):
    row = {
        "status": "Pending",
        "attempts": 0,
        "last_error": None,
        "due_at": NOW - MINUTE,
        "sent_at": None,
        "event_status": "Planned",
        "reserved_by": None,
        "reserved_until": None,
        "next_attempt_at": None,
        "outbox_id": None,
        "published_at": None,
        "failed_publish_attempts": None,
    }
    return {**row, **changes}


@pytest.mark.parametrize(
    ("row", "words"),
    [
        (
            _row(status="Sent", sent_at=NOW, outbox_id=7, published_at=NOW + MINUTE),
            "sent at 2026-12-02T09:00:00+00:00; published at 2026-12-02T09:01:00+00:00",
        ),
        (
            _row(status="Sent", sent_at=NOW, outbox_id=7, failed_publish_attempts=2),
            "sent at 2026-12-02T09:00:00+00:00; its message is not published yet "
            "(2 failed publish attempts)",
        ),
        (
            _row(status="Skipped", event_status="Cancelled"),
            "skipped because the event was Cancelled",
        ),
        (
            _row(status="Skipped", event_status="Completed"),
            "skipped because the event was Completed",
        ),
        (
            _row(status="Skipped", attempts=3, last_error="Kind too long"),
            "skipped by an operator after 3 failed attempts (last error: Kind too long)",
        ),
        (
            _row(reserved_by="run-7", reserved_until=NOW + MINUTE),
            "reserved by run run-7 until 2026-12-02T09:01:00+00:00",
        ),
        (
            _row(attempts=2, last_error="E", next_attempt_at=NOW + MINUTE),
            "backing off after 2 failures (last error: E); next attempt at "
            "2026-12-02T09:01:00+00:00",
        ),
        (
            _row(attempts=2, last_error="E"),
            "failed 2 times (last error: E); the next cycle tries it again",
        ),
        (_row(due_at=NOW + MINUTE), "not due yet (due at 2026-12-02T09:01:00+00:00)"),
        (
            _row(reserved_by="run-7", reserved_until=NOW - MINUTE),  # an expired reservation
            "due since 2026-12-02T08:59:00+00:00; the next dispatch cycle takes it",
        ),
    ],
)
def test_each_state_has_its_reason(row, words):
    assert reason(row, NOW) == words


def test_a_run_url_is_the_ui_address_and_the_run_id():
    assert run_url("http://127.0.0.1:3000/", "abc") == "http://127.0.0.1:3000/runs/abc"
    assert run_url("http://127.0.0.1:3000", None) is None
