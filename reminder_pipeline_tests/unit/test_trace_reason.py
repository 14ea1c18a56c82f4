"""The trace's reason in words, judged on the database's clock: one per state, no server."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from reminder_pipeline.operator_jobs.trace import has_run_page, moved_by, reason, run_url

NOW = datetime(2026, 12, 2, 9, 0, tzinfo=UTC)
MINUTE = timedelta(minutes=1)
DAY = timedelta(days=1)


def _row(**changes):
    row = {
        "status": "Pending",
        "attempts": 0,
        "last_error": None,
        "due_at": NOW - MINUTE,
        "sent_at": None,
        "created_at": NOW - DAY,
        "updated_at": NOW - DAY,
        "event_status": "Planned",
        "reserved_by": None,
        "reserved_until": None,
        "next_attempt_at": None,
        "moved_by": None,
        "moved_in_run": None,
        "run_id": None,
        "outbox_id": None,
        "published_at": None,
        "failed_publish_attempts": None,
    }
    return {**row, **changes}


SENT = {"status": "Sent", "sent_at": NOW, "outbox_id": 7, "updated_at": NOW}
SKIPPED = {"status": "Skipped", "updated_at": NOW}


@pytest.mark.parametrize(
    ("row", "words"),
    [
        (
            _row(**SENT, moved_by="dagster", moved_in_run="r1", published_at=NOW + MINUTE),
            "sent at 2026-12-02T09:00:00+00:00 by Dagster run r1; "
            "published at 2026-12-02T09:01:00+00:00",
        ),
        (
            _row(**SENT, moved_by="cli:dispatch", moved_in_run="c1", failed_publish_attempts=2),
            "sent at 2026-12-02T09:00:00+00:00 by `reminder-pipeline dispatch` (run id "
            "c1, no Dagster run); its message is not published yet (2 failed publish attempts)",
        ),
        (
            _row(**SENT, moved_by="cli:up", moved_in_run="c2", published_at=NOW),
            "sent at 2026-12-02T09:00:00+00:00 by `reminder-pipeline up` (run id "
            "c2, no Dagster run); published at 2026-12-02T09:00:00+00:00",
        ),
        (  # moved before migration 0007: the message's run, not claimed to be Dagster's
            _row(**SENT, run_id="r0", published_at=NOW),
            "sent at 2026-12-02T09:00:00+00:00 by run r0 (a Dagster run or a command's cycle: "
            "before writers were recorded); published at 2026-12-02T09:00:00+00:00",
        ),
        (
            _row(**{**SENT, "outbox_id": None}, moved_by="dagster", moved_in_run="r1"),
            "sent at 2026-12-02T09:00:00+00:00 by Dagster run r1; its outbox row is gone "
            "(purged after the retention)",
        ),
        (
            _row(status="Skipped", due_at=NOW - DAY - MINUTE),  # inserted Skipped
            "skipped at creation: its time (due at 2026-12-01T08:59:00+00:00) had passed when "
            "it was created at 2026-12-01T09:00:00+00:00",
        ),
        (
            _row(**SKIPPED, event_status="Cancelled"),
            "skipped by the cancel of the event at 2026-12-02T09:00:00+00:00",
        ),
        (
            _row(**SKIPPED, event_status="Completed"),
            "skipped by the completion of the event at 2026-12-02T09:00:00+00:00",
        ),
        (
            _row(**SKIPPED, event_status="Cancelled", moved_by="dagster", moved_in_run="r1"),
            "skipped at 2026-12-02T09:00:00+00:00 by Dagster run r1: the event was Cancelled",
        ),
        (
            _row(**SKIPPED, event_status="Completed", moved_by="cli:dispatch", moved_in_run="c"),
            "skipped at 2026-12-02T09:00:00+00:00 by `reminder-pipeline dispatch` (run id c, no "
            "Dagster run): the event was Completed",
        ),
        (
            _row(
                **SKIPPED, attempts=3, last_error="Kind too long", moved_by="operator:poison skip"
            ),
            "skipped by an operator at 2026-12-02T09:00:00+00:00 after 3 failures "
            "(last error: Kind too long)",
        ),
        (
            _row(**SKIPPED, moved_by="operator:poison skip", moved_in_run="r9"),
            "skipped by an operator at 2026-12-02T09:00:00+00:00 (Dagster run r9), forced: "
            "it had not failed",
        ),
        (  # skipped by hand before migration 0007
            _row(**SKIPPED, attempts=3, last_error="E"),
            "skipped by an operator at 2026-12-02T09:00:00+00:00 after 3 failures (last error: E)",
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


@pytest.mark.parametrize(
    ("row", "words"),
    [
        (
            _row(event_status="Cancelled"),
            "due since 2026-12-02T08:59:00+00:00 and its event is Cancelled: the next dispatch "
            "cycle skips it",
        ),
        (
            _row(event_status="Completed", due_at=NOW + MINUTE),
            "not due yet (due at 2026-12-02T09:01:00+00:00) and its event is Completed: the "
            "cycle that takes it skips it",
        ),
        (
            _row(event_status="Cancelled", reserved_by="run-7", reserved_until=NOW + MINUTE),
            "reserved by run run-7 until 2026-12-02T09:01:00+00:00 and its event is Cancelled: "
            "that run skips it",
        ),
        (
            _row(event_status="Cancelled", attempts=2, last_error="E"),
            "failed 2 times (last error: E); its event is Cancelled: the next cycle skips it",
        ),
        (
            _row(event_status="Cancelled", attempts=2, last_error="E", next_attempt_at=NOW + DAY),
            "backing off after 2 failures (last error: E); next attempt at "
            "2026-12-03T09:00:00+00:00, and its event is Cancelled: that attempt skips it",
        ),
    ],
)
def test_a_pending_reminder_of_a_closed_event_is_said_to_be_skipped_next(row, words):
    """The cycle skips a reminder whose event is not Planned or InProgress (action_for): the
    trace must not promise that the next cycle takes it (it used to, for a Cancelled event)."""
    assert reason(row, NOW) == words


@pytest.mark.parametrize(
    ("row", "writer"),
    [
        (_row(**SKIPPED, event_status="Cancelled"), "calendar"),
        (_row(**SKIPPED, event_status="Completed"), "calendar"),
        (_row(status="Skipped", due_at=NOW - DAY - MINUTE), "calendar"),  # skipped at creation
        (_row(**SKIPPED, event_status="Cancelled", moved_by="dagster"), "dagster"),
        (_row(**SKIPPED, attempts=3, last_error="E"), None),  # an operator, before 0007
        (_row(**SKIPPED), None),  # before writers were recorded, the event still live
        (_row(**SENT, run_id="r0"), None),
        (_row(), None),
    ],
)
def test_the_calendars_skips_are_named_as_the_calendars(row, writer):
    """Every writer is named (docs/cli.md): the calendar records none, so the trace tells its
    skips from the row and the event, as their reason does ("skipped by the cancel ...")."""
    assert moved_by(row) == writer


def test_only_a_dagster_run_has_a_page():
    assert has_run_page(_row(**SENT, moved_by="dagster", moved_in_run="r1"))
    assert not has_run_page(_row(**SENT, moved_by="cli:dispatch", moved_in_run="c1"))
    assert not has_run_page(_row(**SENT, moved_by="in-process", moved_in_run="c1"))
    assert has_run_page(_row(**SKIPPED, moved_by="operator:poison skip", moved_in_run="r9"))
    assert not has_run_page(_row(**SKIPPED, moved_by="operator:poison skip"))


def test_a_run_url_is_the_ui_address_and_the_run_id():
    assert run_url("http://127.0.0.1:3000/", "abc") == "http://127.0.0.1:3000/runs/abc"
    assert run_url("http://127.0.0.1:3000", None) is None
