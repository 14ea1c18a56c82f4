"""Which DueAt days the re-publish back-fill accepts: whole days inside the outbox retention, up to today."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta

import pytest

from reminder_pipeline.operator_jobs.republish import (
    RepublishRefused,
    check_day,
    day_window,
    oldest_day,
)

WEEK = timedelta(hours=168)


def test_a_day_is_its_utc_interval():
    assert day_window(date(2026, 11, 29)) == (
        datetime(2026, 11, 29, tzinfo=UTC),
        datetime(2026, 11, 30, tzinfo=UTC),
    )


@pytest.mark.parametrize(
    ("now", "oldest"),
    [
        # Rows published before now - 168 h may be purged: the day holding that instant is out.
        (datetime(2026, 11, 30, 22, 45, tzinfo=UTC), date(2026, 11, 24)),
        # Exactly at midnight the whole day before the cut-off instant is still there.
        (datetime(2026, 11, 30, 0, 0, tzinfo=UTC), date(2026, 11, 23)),
        (datetime(2026, 11, 30, 0, 0, 1, tzinfo=UTC), date(2026, 11, 24)),
    ],
)
def test_the_oldest_day_is_the_first_whole_day_inside_the_retention(now, oldest):
    assert oldest_day(WEEK, now) == oldest
    check_day(oldest, WEEK, now)
    check_day(now.date(), WEEK, now)  # today: what was published so far
    with pytest.raises(RepublishRefused) as refused:
        check_day(oldest - timedelta(days=1), WEEK, now)
    message = str(refused.value)
    assert message.startswith(
        f"re-publish of {oldest - timedelta(days=1)} refused: the day is past the outbox "
        "retention (168 h); rows published before "
    )
    assert message.endswith(f"(oldest day now: {oldest})")
    assert "\n" not in message


def test_a_future_day_is_refused():
    now = datetime(2026, 11, 30, 23, 59, tzinfo=UTC)
    with pytest.raises(
        RepublishRefused,
        match=r"^re-publish of 2026-12-01 refused: the day is in "
        r"the future \(now 2026-11-30 23:59 UTC\)",
    ):
        check_day(date(2026, 12, 1), WEEK, now)
