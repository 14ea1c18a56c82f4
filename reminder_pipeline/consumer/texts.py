"""Reminder texts per locale: the kind of event, the horizon (OffsetMinutes) and the local time.

``en`` is the reference consumer's original wording; ``ru`` follows docs/contract.md, which words
its examples in Russian: horizons such as «через сутки» (1440) and «через час» (60), and the
neutral text «событие календаря скоро начнётся» for a Kind this consumer does not know (the
contract's fail-safe: a reminder matters more than its exact wording).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum


class Locale(StrEnum):
    """The languages reminders can be written in (``consume --locale``)."""

    EN = "en"
    RU = "ru"


#: The EventKind values of contract v1, as the contract spells them.
KNOWN_KINDS: tuple[str, ...] = ("Showing", "Consultation", "Meeting", "Task", "BookingDeadline")
_KIND_BY_FOLDED = {kind.casefold(): kind for kind in KNOWN_KINDS}


def known_kind(kind: str) -> str | None:
    """The contract's spelling of ``kind`` (case-insensitive: ``showing`` from a camelCase
    serializer is Showing), or None for a Kind this consumer does not know."""
    return _KIND_BY_FOLDED.get(kind.casefold())


@dataclass(frozen=True)
class Texts:
    """One locale's wording; templates take ``{horizon}`` and ``{when}``."""

    kinds: Mapping[str, str]
    neutral: str
    horizon: Callable[[int], str]
    when: Callable[[datetime, str], str]


def offset_units(offset_minutes: int) -> list[tuple[int, str]]:
    """A positive horizon in whole units, largest first: whole weeks alone (10080 → 1 week),
    else the days, hours and minutes that are not 0 (1530 → 1 day, 1 hour, 30 minutes)."""
    weeks, rest = divmod(offset_minutes, 7 * 24 * 60)
    if rest == 0:
        return [(weeks, "week")]
    days, rest = divmod(offset_minutes, 24 * 60)
    hours, minutes = divmod(rest, 60)
    return [(n, unit) for n, unit in ((days, "day"), (hours, "hour"), (minutes, "minute")) if n]


# -- English ------------------------------------------------------------------------------------

_EN_ARTICLE = {"week": "a", "day": "a", "hour": "an", "minute": "a"}


def horizon_en(offset_minutes: int) -> str:
    """1440 → "in a day", 60 → "in an hour", 90 → "in 1 hour 30 minutes", 0 → "now"."""
    if offset_minutes <= 0:
        return "now"
    units = offset_units(offset_minutes)
    if len(units) == 1:
        n, unit = units[0]
        return "in " + (f"{_EN_ARTICLE[unit]} {unit}" if n == 1 else f"{n} {unit}s")
    return "in " + " ".join(f"{n} {unit}{'' if n == 1 else 's'}" for n, unit in units)


def _when_en(local_start: datetime, zone: str) -> str:
    return f"at {local_start:%Y-%m-%d %H:%M} ({zone})"


EN = Texts(
    kinds={
        "Showing": "Property showing starts {horizon}, {when}",
        "Consultation": "Consultation starts {horizon}, {when}",
        "Meeting": "Meeting starts {horizon}, {when}",
        "Task": "Task starts {horizon}, {when}",
        "BookingDeadline": "Booking deadline is {horizon}, {when}",
    },
    neutral="A calendar event starts soon, {when}",
    horizon=horizon_en,
    when=_when_en,
)


# -- Russian ------------------------------------------------------------------------------------


def plural_ru(n: int, one: str, few: str, many: str) -> str:
    """The Russian form agreeing with ``n``: 1/21 минута → one, 2–4/22 → few, 5–20/11–14 → many."""
    if n % 10 == 1 and n % 100 != 11:
        return one
    if 2 <= n % 10 <= 4 and not 12 <= n % 100 <= 14:
        return few
    return many


_RU_UNITS = {
    "week": ("неделю", "недели", "недель"),
    "day": ("день", "дня", "дней"),
    "hour": ("час", "часа", "часов"),
    "minute": ("минуту", "минуты", "минут"),
}
#: A single unit of one reads without the numeral, as docs/contract.md words it: «через сутки»,
#: «через час».
_RU_ONE = {
    "week": "через неделю",
    "day": "через сутки",
    "hour": "через час",
    "minute": "через минуту",
}


def _ru_count(n: int, unit: str) -> str:
    return f"{n} {plural_ru(n, *_RU_UNITS[unit])}"


def horizon_ru(offset_minutes: int) -> str:
    """1440 → «через сутки», 60 → «через час», 90 → «через 1 час 30 минут», 0 → «сейчас»."""
    if offset_minutes <= 0:
        return "сейчас"
    units = offset_units(offset_minutes)
    if len(units) == 1 and units[0][0] == 1:
        return _RU_ONE[units[0][1]]
    return "через " + " ".join(_ru_count(n, unit) for n, unit in units)


def _when_ru(local_start: datetime, zone: str) -> str:
    return f"{local_start:%d.%m.%Y} в {local_start:%H:%M} ({zone})"


RU = Texts(
    kinds={
        "Showing": "Показ объекта начнётся {horizon}, {when}",
        "Consultation": "Консультация начнётся {horizon}, {when}",
        "Meeting": "Встреча начнётся {horizon}, {when}",
        "Task": "Задача начнётся {horizon}, {when}",
        "BookingDeadline": "Срок бронирования истекает {horizon}, {when}",
    },
    # The contract's neutral words verbatim, after a lead-in that makes them a sentence.
    neutral="Напоминание: событие календаря скоро начнётся, {when}",
    horizon=horizon_ru,
    when=_when_ru,
)

_TEXTS: Mapping[Locale, Texts] = {Locale.EN: EN, Locale.RU: RU}


def parse_locale(value: str) -> Locale:
    """The :class:`Locale` named ``value``; a one-line ``ValueError`` naming the choices if none."""
    try:
        return Locale(value)
    except ValueError:
        choices = ", ".join(locale.value for locale in Locale)
        raise ValueError(f"locale {value!r} is not one of {choices}") from None


def texts(locale: Locale | str) -> Texts:
    """The wording of ``locale``."""
    return _TEXTS[parse_locale(locale) if not isinstance(locale, Locale) else locale]


@dataclass(frozen=True)
class ReminderText:
    """A reminder's text and the parts it was built from."""

    text: str
    horizon: str
    known_kind: bool


def reminder_text(
    kind: str, offset_minutes: int, local_start: datetime, zone: str, locale: Locale | str
) -> ReminderText:
    """The text for one reminder; an unknown ``kind`` gets the locale's neutral text."""
    wording = texts(locale)
    horizon = wording.horizon(offset_minutes)
    when = wording.when(local_start, zone)
    spelled = known_kind(kind)
    if spelled is None:
        return ReminderText(wording.neutral.format(when=when), horizon, False)
    return ReminderText(wording.kinds[spelled].format(horizon=horizon, when=when), horizon, True)
