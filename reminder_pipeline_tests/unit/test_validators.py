"""The validators shared by the CLI, the environment and the Dagster run config: bounds and messages."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from reminder_pipeline.config import (
    ConfigError,
    Settings,
    check_as_of,
    check_batch_size,
    check_budget_seconds,
    check_max_batches,
    check_poison_limit,
    check_purge_batch_size,
    check_retention_hours,
    mask_secrets,
    mask_url,
    parse_range_end,
    parse_range_start,
)


@pytest.mark.parametrize(
    ("check", "value", "expected"),
    [
        (check_batch_size, 1, 1),
        (check_batch_size, "200", 200),
        (check_batch_size, 10_000, 10_000),
        (check_batch_size, 5.0, 5),
        (check_max_batches, "10000", 10_000),
        (check_budget_seconds, "1", 1.0),
        (check_budget_seconds, 600, 600.0),
        (check_retention_hours, "1", 1.0),
        (check_retention_hours, 168, 168.0),
        (check_purge_batch_size, 1000, 1000),
        (check_poison_limit, "1000", 1000),
        (check_poison_limit, " +12 ", 12),
        (check_budget_seconds, "1.5e1", 15.0),
        (check_budget_seconds, ".5e1", 5.0),
    ],
)
def test_good_values_pass_as_numbers(check, value, expected):
    assert check(value, "x") == expected
    assert type(check(value, "x")) is type(expected)


@pytest.mark.parametrize(
    ("check", "value", "message"),
    [
        (check_batch_size, 0, "batch_size=0 is out of range [1, 10000]"),
        (check_batch_size, -5, "batch_size=-5 is out of range [1, 10000]"),
        (check_batch_size, 10_001, "batch_size=10001 is out of range [1, 10000]"),
        (check_batch_size, "lots", "batch_size='lots' is not an integer"),
        (check_batch_size, 2.5, "batch_size=2.5 is not an integer"),
        (check_batch_size, True, "batch_size=True is not an integer"),
        (check_batch_size, None, "batch_size=None is not an integer"),
        (check_max_batches, 0, "max_batches=0 is out of range [1, 10000]"),
        (check_budget_seconds, float("nan"), "budget_seconds=nan is not a finite number"),
        (check_budget_seconds, "inf", "budget_seconds=inf is not a finite number"),
        (check_budget_seconds, 0.5, "budget_seconds=0.5 is out of range [1, 600]"),
        (check_budget_seconds, "soon", "budget_seconds='soon' is not a number"),
        (check_retention_hours, 0, "retention_hours=0 is out of range [1, 8784]"),
        (check_retention_hours, -1, "retention_hours=-1 is out of range [1, 8784]"),
        (check_retention_hours, 0.99, "retention_hours=0.99 is out of range [1, 8784]"),
        (check_purge_batch_size, 0, "batch_size=0 is out of range [1, 10000]"),
        (check_poison_limit, 1001, "limit=1001 is out of range [1, 1000]"),
        # Python's int() and float() take other scripts' digits and "_": no operator means them.
        (check_poison_limit, "\u0663", "limit='\u0663' is not an integer"),  # Arabic-Indic 3
        (check_poison_limit, "1_000", "limit='1_000' is not an integer"),
        (check_budget_seconds, "1_0", "budget_seconds='1_0' is not a number"),
        (check_budget_seconds, "\uff15", "budget_seconds='\uff15' is not a number"),  # fullwidth 5
    ],
)
def test_bad_values_are_one_line_naming_the_value(check, value, message):
    with pytest.raises(ConfigError) as info:
        check(value)
    assert str(info.value) == message


def test_a_job_narrows_the_budget_with_the_same_message():
    assert check_budget_seconds(90, "budget_seconds", high=90.0) == 90.0
    with pytest.raises(ConfigError, match=r"^budget_seconds=91 is out of range \[1, 90\]$"):
        check_budget_seconds(91, "budget_seconds", high=90.0)


def test_as_of_is_iso_8601_with_a_zone_and_never_in_the_future():
    now = datetime(2026, 11, 30, 10, 0, tzinfo=UTC)
    assert check_as_of(None, now=now) is None and check_as_of(" ", now=now) is None
    assert check_as_of("2026-11-30T09:00:00Z", now=now) == now - timedelta(hours=1)
    assert check_as_of(now, now=now) == now
    for value, message in [
        ("2026-11-30T11:00:00Z", "as_of='2026-11-30T11:00:00+00:00' is in the future"),
        ("tomorrow", "as_of='tomorrow' is not an ISO-8601 timestamp"),
        ("2026-11-30T09:00:00", "as_of='2026-11-30T09:00:00' has no time zone"),
        (42, "as_of=42 is not an ISO-8601 timestamp"),
    ]:
        with pytest.raises(ConfigError) as info:
            check_as_of(value, now=now)
        assert str(info.value).startswith(message)


def test_the_environment_uses_the_same_checks_and_names_the_variable():
    with pytest.raises(ConfigError, match=r"^REMINDER_BATCH_SIZE=0 is out of range \[1, 10000\]$"):
        Settings.from_env({"REMINDER_BATCH_SIZE": "0"})
    with pytest.raises(ConfigError, match=r"^REMINDER_CYCLE_BUDGET_SECONDS=nan is not a finite"):
        Settings.from_env({"REMINDER_CYCLE_BUDGET_SECONDS": "nan"})


def test_passwords_are_masked_in_urls_and_in_any_text():
    assert mask_url("postgresql+psycopg://app:s3cret@db:5432/calendar") == (
        "postgresql+psycopg://app:***@db:5432/calendar"
    )
    assert (
        mask_url("postgresql+psycopg://app@db/calendar") == "postgresql+psycopg://app@db/calendar"
    )
    text = "failed: postgresql+psycopg2://dagster:p@ss@db/dagster and http://u:x@h/ and kafka:9092"
    masked = mask_secrets(text)
    assert "p@ss" not in masked and ":x@" not in masked
    assert (
        masked
        == "failed: postgresql+psycopg2://dagster:***@db/dagster and http://u:***@h/ and kafka:9092"
    )


@pytest.mark.parametrize(
    ("given", "start", "end"),
    [
        # A day alone is that UTC day, in ISO's extended and compact forms alike.
        ("2026-12-07", datetime(2026, 12, 7, tzinfo=UTC), datetime(2026, 12, 8, tzinfo=UTC)),
        ("20261207", datetime(2026, 12, 7, tzinfo=UTC), datetime(2026, 12, 8, tzinfo=UTC)),
        # A time is itself, in UTC; as an end it is included (PostgreSQL's microsecond).
        (
            "2026-12-07T10:00:00+03:00",
            datetime(2026, 12, 7, 7, tzinfo=UTC),
            datetime(2026, 12, 7, 7, 0, 0, 1, tzinfo=UTC),
        ),
        # The last day and the last instant end nowhere: no upper bound, never an overflow.
        ("9999-12-31", datetime(9999, 12, 31, tzinfo=UTC), None),
        ("9999-12-31T23:59:59.999999Z", datetime.max.replace(tzinfo=UTC), None),
        ("9999-12-31T23:00:00-05:00", "after 9999-12-31T23:59:59.999999+00:00", None),
        # Before the first instant: it starts at the first, and nothing ends before it.
        ("0001-01-01T00:30:00+01:00", datetime.min.replace(tzinfo=UTC), "before 0001-01-01"),
    ],
)
def test_a_range_bound_is_a_day_or_a_time_and_never_overflows(given, start, end):
    for parse, expected in ((parse_range_start, start), (parse_range_end, end)):
        if isinstance(expected, str):
            with pytest.raises(ConfigError) as info:
                parse(given, "--due-to")
            assert str(info.value).startswith(f"--due-to={given!r} is {expected}")
        else:
            assert parse(given, "--due-to") == expected


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ("2026-12-07T10:00", "--due-from='2026-12-07T10:00:00' has no time zone"),
        ("tuesday", "--due-from='tuesday' is not an ISO-8601 timestamp"),
        ("", "--due-from is empty"),
    ],
)
def test_a_bad_range_bound_is_one_line_naming_the_option(given, message):
    with pytest.raises(ConfigError) as info:
        parse_range_start(given, "--due-from")
    assert str(info.value).startswith(message)
