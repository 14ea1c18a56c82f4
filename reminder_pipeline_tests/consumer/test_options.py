"""The runner's plain parts: back-off schedule, option checks, the default sink's line."""

from __future__ import annotations

import io
import json

import pytest

from reminder_pipeline.config import Settings
from reminder_pipeline.consumer.main import default_dedup_path
from reminder_pipeline.consumer.notifications import notifications_for, parse_reminder
from reminder_pipeline.consumer.options import ConsumerOptions
from reminder_pipeline.consumer.sinks import StdoutSink

from .payloads import payload


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
    data = payload(OffsetMinutes=1440)
    (notification,) = notifications_for(parse_reminder(json.dumps(data))).notifications
    out = io.StringIO()
    StdoutSink(out).deliver(notification)
    (line,) = out.getvalue().splitlines()
    assert line.startswith(f"CalendarReminder to owner {data['OwnerUserId']} | ")
    assert "Meeting starts in a day, at 2026-11-30 13:00 (Europe/Moscow)" in line
    assert f"reminder={data['ReminderId']}" in line and f"event={data['EventId']}" in line


def test_the_dedup_file_defaults_to_one_per_group_under_home(tmp_path) -> None:
    settings = Settings.from_env({"REMINDER_PIPELINE_HOME": str(tmp_path)})
    path = default_dedup_path(settings, "notifications/../x")
    assert path.parent == tmp_path / "notifications" and "/" not in path.name


def test_the_consume_command_takes_metrics_port_and_locale(monkeypatch) -> None:
    from reminder_pipeline import consumer
    from reminder_pipeline.cli import main

    calls: list[dict] = []
    monkeypatch.setattr(consumer, "run_consumer", lambda settings, **kw: calls.append(kw))
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9")  # never contacted here
    monkeypatch.delenv("REMINDER_CONSUMER_LOCALE", raising=False)
    assert main(["consume", "--metrics-port", "9465", "--locale", "ru"]) == 0
    assert main(["consume"]) == 0
    assert [(c["metrics_port"], c["locale"]) for c in calls] == [(9465, "ru"), (None, "en")]


def test_the_consume_command_refuses_an_unknown_locale(monkeypatch, capsys) -> None:
    from reminder_pipeline.cli import main

    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9")
    assert main(["consume", "--locale", "de"]) == 2
    err = capsys.readouterr().err
    assert "'de' is not one of 'en', 'ru'" in err and len(err.strip().splitlines()) == 1


def test_the_consume_command_takes_a_shared_dedup_url_from_its_option_or_env(monkeypatch) -> None:
    from reminder_pipeline import consumer
    from reminder_pipeline.cli import main

    calls: list[dict] = []
    monkeypatch.setattr(consumer, "run_consumer", lambda settings, **kw: calls.append(kw))
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9")  # never contacted here
    assert main(["consume", "--dedup-url", "postgresql://a@db/notifications"]) == 0
    monkeypatch.setenv("REMINDER_CONSUMER_DEDUP_URL", "postgresql://b@db/notifications")
    assert main(["consume"]) == 0
    assert [c["dedup_url"] for c in calls] == [
        "postgresql://a@db/notifications",
        "postgresql://b@db/notifications",
    ]


def test_a_dedup_url_and_a_dedup_path_together_are_refused(tmp_path, capsys) -> None:
    from reminder_pipeline.cli.consume import consume_main

    settings = Settings.from_env({"REMINDER_PIPELINE_HOME": str(tmp_path)})
    code = consume_main(
        settings, dedup_path=tmp_path / "d.sqlite3", dedup_url="postgresql://a@db/n"
    )
    assert code == 2
    assert capsys.readouterr().err.strip() == (
        "reminder-pipeline consume: give --dedup-url or --dedup-path, not both"
    )


def test_the_consumer_raises_and_the_command_line_decides_the_code(tmp_path, capsys) -> None:
    from reminder_pipeline.config import ConfigError
    from reminder_pipeline.consumer import run_consumer

    settings = Settings.from_env({"REMINDER_PIPELINE_HOME": str(tmp_path)})
    with pytest.raises(ConfigError, match="give --dedup-url or --dedup-path, not both"):
        run_consumer(settings, dedup_path=tmp_path / "d.sqlite3", dedup_url="postgresql://a@db/n")
    assert capsys.readouterr().err == ""  # no exit-code line: that is the CLI's (cli/exits.py)
