"""Reminder texts in English and Russian (``consume --locale``), and ``--locale ru`` end to end.

The seed words its examples in Russian: «через сутки» (OffsetMinutes 1440), «через час» (60) and
the neutral «событие календаря скоро начнётся» for an unknown Kind; the Russian texts use exactly
those words, with the plural forms Russian needs elsewhere. The last test runs ``consume_main``
with ``locale="ru"`` against the real broker and reads what it prints.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from reminder_pipeline.cli.consume import consume_main
from reminder_pipeline.config import Settings
from reminder_pipeline.consumer import notifications_for, parse_reminder
from reminder_pipeline.consumer.texts import KNOWN_KINDS, Locale, horizon_ru, plural_ru, texts

from .lane import Lane, a_payload
from .payloads import payload

START = "2026-11-30T06:03:00Z"  # 09:03 in Moscow


def text_of(locale: str, **overrides: object) -> str:
    data = payload(**{"Kind": "Showing", "StartAt": START, **overrides})
    (notification,) = notifications_for(parse_reminder(json.dumps(data)), locale).notifications
    return notification.text


@pytest.mark.parametrize(
    "minutes, text",
    [
        (1440, "через сутки"),
        (60, "через час"),
        (0, "сейчас"),
        (1, "через минуту"),
        (2, "через 2 минуты"),
        (5, "через 5 минут"),
        (11, "через 11 минут"),
        (15, "через 15 минут"),
        (21, "через 21 минуту"),
        (22, "через 22 минуты"),
        (90, "через 1 час 30 минут"),
        (120, "через 2 часа"),
        (300, "через 5 часов"),
        (1260, "через 21 час"),
        (1500, "через 1 день 1 час"),
        (2880, "через 2 дня"),
        (7200, "через 5 дней"),
        (10080, "через неделю"),
        (20160, "через 2 недели"),
    ],
)
def test_russian_horizons(minutes: int, text: str) -> None:
    assert horizon_ru(minutes) == text


@pytest.mark.parametrize(
    "n, form",
    [
        (1, "one"),
        (21, "one"),
        (101, "one"),
        (2, "few"),
        (4, "few"),
        (24, "few"),
        (5, "many"),
        (11, "many"),
        (12, "many"),
        (14, "many"),
        (20, "many"),
        (111, "many"),
    ],
)
def test_russian_plural_forms(n: int, form: str) -> None:
    assert plural_ru(n, "one", "few", "many") == form


@pytest.mark.parametrize(
    "kind, offset, text",
    [
        ("Showing", 60, "Показ объекта начнётся через час, 30.11.2026 в 09:03 (Europe/Moscow)"),
        (
            "Consultation",
            1440,
            "Консультация начнётся через сутки, 30.11.2026 в 09:03 (Europe/Moscow)",
        ),
        ("Meeting", 15, "Встреча начнётся через 15 минут, 30.11.2026 в 09:03 (Europe/Moscow)"),
        ("Task", 60, "Задача начнётся через час, 30.11.2026 в 09:03 (Europe/Moscow)"),
        (
            "BookingDeadline",
            1440,
            "Срок бронирования истекает через сутки, 30.11.2026 в 09:03 (Europe/Moscow)",
        ),
        (
            "Webinar",
            60,
            "Напоминание: событие календаря скоро начнётся, 30.11.2026 в 09:03 (Europe/Moscow)",
        ),
    ],
)
def test_russian_texts(kind: str, offset: int, text: str) -> None:
    assert text_of("ru", Kind=kind, OffsetMinutes=offset) == text


@pytest.mark.parametrize(
    "kind, offset, text",
    [
        ("Showing", 60, "Property showing starts in an hour, at 2026-11-30 09:03 (Europe/Moscow)"),
        ("Consultation", 1440, "Consultation starts in a day, at 2026-11-30 09:03 (Europe/Moscow)"),
        (
            "BookingDeadline",
            120,
            "Booking deadline is in 2 hours, at 2026-11-30 09:03 (Europe/Moscow)",
        ),
        ("Webinar", 60, "A calendar event starts soon, at 2026-11-30 09:03 (Europe/Moscow)"),
    ],
)
def test_english_texts_are_as_before(kind: str, offset: int, text: str) -> None:
    assert text_of("en", Kind=kind, OffsetMinutes=offset) == text


def test_the_seeds_neutral_words_appear_verbatim() -> None:
    assert "событие календаря скоро начнётся" in text_of("ru", Kind="Webinar")


def test_every_known_kind_has_a_text_in_every_locale() -> None:
    for locale in Locale:
        assert set(texts(locale).kinds) == set(KNOWN_KINDS)


def test_an_unknown_locale_is_refused_in_one_line() -> None:
    with pytest.raises(ValueError, match=r"^locale 'de' is not one of en, ru$"):
        texts("de")


def test_consume_with_locale_ru_prints_russian_reminders(
    lane: Lane, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``consume --locale ru`` through the broker: the seed's horizons, in the printed lines."""
    start = datetime(2026, 11, 30, 6, 3, tzinfo=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    day = a_payload(Kind="Consultation", StartAt=start, OffsetMinutes=1440)
    hour = a_payload(Kind="Webinar", StartAt=start, OffsetMinutes=60, EventId=day["EventId"])
    lane.produce(day)
    lane.produce(hour)
    settings = Settings.from_env(
        {
            "KAFKA_BOOTSTRAP_SERVERS": lane.kafka.bootstrap_servers,
            "REMINDER_PIPELINE_HOME": str(tmp_path),
        }
    )
    code = consume_main(
        settings,
        group_id=lane.group_id,
        once=True,
        locale="ru",
        # A fixed StartAt (the texts are asserted word for word), now passed: never dropped here.
        options=lane.options(once_idle_seconds=1.0, drop_after_start_seconds=None),
    )
    assert code == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line]
    assert len(lines) == 2
    assert "| Консультация начнётся через сутки, 30.11.2026 в 09:03 (Europe/Moscow) |" in lines[0]
    assert (
        "| Напоминание: событие календаря скоро начнётся, 30.11.2026 в 09:03 (Europe/Moscow) |"
    ) in lines[1]
    assert f"reminder={day['ReminderId']}" in lines[0]
