"""The runner's plain parts: back-off schedule, option checks, the default sink's line."""

from __future__ import annotations

import io
import json
import uuid

import pytest

from reminder_pipeline.config import Settings
from reminder_pipeline.consumer.notifications import notifications_for, parse_reminder
from reminder_pipeline.consumer.runner import ConsumerOptions, StdoutSink, default_dedup_path


def test_backoff_doubles_and_is_capped() -> None:
    options = ConsumerOptions(retry_backoff_seconds=0.5, max_backoff_seconds=4.0)
    assert [options.backoff(n) for n in range(1, 7)] == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]


@pytest.mark.parametrize(
    "kwargs", [{"max_attempts": 0}, {"retry_backoff_seconds": 0}, {"max_backoff_seconds": 0.1}]
)
def test_nonsensical_options_are_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        ConsumerOptions(**kwargs)


def test_the_default_sink_prints_one_line_with_ids_kind_and_local_time() -> None:
    payload = {
        "ReminderId": str(uuid.uuid4()), "EventId": str(uuid.uuid4()),
        "TenantId": str(uuid.uuid4()), "OwnerUserId": str(uuid.uuid4()), "ClientUserId": None,
        "Kind": "Meeting", "StartAt": "2026-11-30T10:00:00Z", "TimeZone": "Europe/Moscow",
        "OffsetMinutes": 1440, "AppointmentId": None,
    }
    (notification,) = notifications_for(parse_reminder(json.dumps(payload))).notifications
    out = io.StringIO()
    StdoutSink(out).deliver(notification)
    (line,) = out.getvalue().splitlines()
    assert line.startswith(f"CalendarReminder to owner {payload['OwnerUserId']} | ")
    assert "Meeting starts in a day, at 2026-11-30 13:00 (Europe/Moscow)" in line
    assert f"reminder={payload['ReminderId']}" in line and f"event={payload['EventId']}" in line


def test_the_dedup_file_defaults_to_one_per_group_under_home(tmp_path) -> None:
    settings = Settings.from_env({"REMINDER_PIPELINE_HOME": str(tmp_path)})
    path = default_dedup_path(settings, "notifications/../x")
    assert path.parent == tmp_path / "notifications" and "/" not in path.name


def test_the_consume_command_takes_metrics_port_and_locale() -> None:
    from reminder_pipeline.cli import build_parser, cmd_consume

    args = build_parser().parse_args(["consume", "--metrics-port", "9465", "--locale", "ru"])
    assert (args.metrics_port, args.locale, args.func) == (9465, "ru", cmd_consume)
    assert build_parser().parse_args(["consume"]).locale == "en"


def test_the_consume_command_refuses_an_unknown_locale(capsys: pytest.CaptureFixture[str]) -> None:
    from reminder_pipeline.cli import build_parser

    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(["consume", "--locale", "de"])
    assert exited.value.code == 2 and "invalid choice: 'de'" in capsys.readouterr().err
