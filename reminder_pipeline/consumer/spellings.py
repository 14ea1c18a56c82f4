"""The spellings of the contract's types that other producers write, read into one meaning each.

The contract's types are .NET's: ``Guid`` and ``DateTimeOffset`` (an instant, published in UTC).
Our producer writes one exact form (lower-case GUIDs, ``…Z`` with at most 6 fraction digits,
see :mod:`reminder_pipeline.domain.contract`); other producers of the same contract write
others, all meaning the same values:

* an instant: any ISO-8601 calendar date and time of day **with** a UTC offset: extended
  (``2026-11-30T23:11:55.1234567+00:00``) or basic (``20261130T231155Z``) format, ``T`` or ``t``,
  seconds optional, a fraction of any length after ``.`` or ``,``, the offset as ``Z``/``z``,
  ``±HH:MM``, ``±HHMM`` or ``±HH``. Digits beyond the microsecond are truncated (Python's
  resolution; .NET's ticks are 100 ns). A time without an offset is not an instant: refused.
* a GUID: the 32 hex digits in any case, hyphenated (``D``), bare (``N``), or in braces or
  parentheses (``B``, ``P``), i.e. what .NET's ``Guid.Parse`` reads, except its hex-struct form.
"""

from __future__ import annotations

import re
import uuid
from datetime import UTC, datetime, timedelta, timezone
from functools import lru_cache

_FRACTION = r"(?:[.,](?P<fraction>[0-9]+))?"
_OFFSET = r"(?P<offset>[Zz]|(?P<sign>[+-])(?P<oh>[0-9]{2})(?::?(?P<om>[0-9]{2}))?)"
_EXTENDED = re.compile(
    r"(?P<year>[0-9]{4})-(?P<month>[0-9]{2})-(?P<day>[0-9]{2})[Tt]"
    r"(?P<hour>[0-9]{2}):(?P<minute>[0-9]{2})(?::(?P<second>[0-9]{2})" + _FRACTION + r")?" + _OFFSET
)
_BASIC = re.compile(
    r"(?P<year>[0-9]{4})(?P<month>[0-9]{2})(?P<day>[0-9]{2})[Tt]"
    r"(?P<hour>[0-9]{2})(?P<minute>[0-9]{2})(?:(?P<second>[0-9]{2})" + _FRACTION + r")?" + _OFFSET
)
_GUID = re.compile(
    r"(?P<hex>[0-9A-Fa-f]{8}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{12}"
    r"|[0-9A-Fa-f]{32})"
)


class SpellingError(ValueError):
    """A value is not a spelling of the type the contract names; str() says why, in one line,
    never quoting the value (a faulty producer may have put a name or a phone number there:
    the error goes to logs and to the dead letter's ``dlq-error`` header)."""


def _shape(value: str) -> str:
    """What an error may say of a refused text: its length, never its characters."""
    return f"{len(value)} characters"


def parse_instant(value: object) -> datetime:
    """The UTC instant of an ISO-8601 date-time with an offset; :class:`SpellingError` if none."""
    if not isinstance(value, str):
        raise SpellingError(f"is a {type(value).__name__}, not an ISO-8601 date-time string")
    return _instant(value)


# A burst's reminders share few StartAts: each spelling is read once (a refusal is not cached).
@lru_cache(maxsize=4096)
def _instant(value: str) -> datetime:
    match = _EXTENDED.fullmatch(value) or _BASIC.fullmatch(value)
    if match is None:
        raise SpellingError(f"is not an ISO-8601 date-time with a UTC offset ({_shape(value)})")
    fraction = (match["fraction"] or "")[:6].ljust(6, "0")
    if match["offset"] in ("Z", "z"):
        offset = timedelta(0)
    else:
        hours, minutes = int(match["oh"]), int(match["om"] or 0)
        if hours > 23 or minutes > 59:
            raise SpellingError("has a UTC offset out of range")
        offset = timedelta(hours=hours, minutes=minutes) * (-1 if match["sign"] == "-" else 1)
    try:
        local = datetime(
            int(match["year"]),
            int(match["month"]),
            int(match["day"]),
            int(match["hour"]),
            int(match["minute"]),
            int(match["second"] or 0),
            int(fraction),
            tzinfo=timezone(offset),
        )
        return local.astimezone(UTC)
    except (ValueError, OverflowError) as exc:
        # Month 13, 25:00, or an instant outside years 1..9999 once in UTC.
        raise SpellingError(f"is not a valid instant ({exc})") from None


_new = object.__new__
_set = object.__setattr__
_UNKNOWN_SAFETY = uuid.SafeUUID.unknown


class Guid(uuid.UUID):
    """A :class:`uuid.UUID` that keeps its text: ``str()`` of a message's ids is on the path of
    every message several times (the de-dup store's rows, the notification id, log identifiers).

    Equal to, hashed and ordered as the UUID of the same value, and shown as one (``repr`` is
    ``UUID('…')``); the text is the one ``uuid.UUID`` gives, taken from the message when it is
    spelled that way (36 characters, lowercase) and made once otherwise.
    """

    __slots__ = ("_text",)
    _text: str

    def __str__(self) -> str:
        try:
            return self._text
        except AttributeError:  # made by uuid_from_int, or unpickled: made once, then kept
            text = super().__str__()
            _set(self, "_text", text)
            return text

    def __repr__(self) -> str:
        return f"UUID({str(self)!r})"


def uuid_from_int(value: int, text: str | None = None) -> uuid.UUID:
    """``uuid.UUID(int=value)`` for a ``value`` known to be in 0..2**128-1, without the
    constructor's argument checks (it is on the path of every message, several times): a
    :class:`Guid`, which keeps ``text`` when the caller has it (already ``str()``'s form).
    """
    result = _new(Guid)
    _set(result, "int", value)
    _set(result, "is_safe", _UNKNOWN_SAFETY)
    if text is not None:
        _set(result, "_text", text)
    return result


def parse_guid(value: object) -> uuid.UUID:
    """The GUID ``value`` spells (any case; D, N, B or P form); :class:`SpellingError` if none."""
    if not isinstance(value, str):
        raise SpellingError(f"is a {type(value).__name__}, not a GUID string")
    if len(value) == 36 and value[8] == value[13] == value[18] == value[23] == "-":
        # The D form, what every producer here writes: 32 ASCII letters or digits around the
        # four hyphens, which int() then takes as hex only if each is a hex digit (ASCII: no
        # other script's digits; alphanumeric: no sign, underscore or space int() would allow).
        digits = value.replace("-", "")
        if len(digits) == 32 and digits.isascii() and digits.isalnum():
            try:
                number = int(digits, 16)
            except ValueError:
                pass  # a letter past f: the pattern below refuses it in its own words
            else:
                return uuid_from_int(number, value if value.islower() else None)
    text = value
    if len(text) >= 2 and (text[0], text[-1]) in (("{", "}"), ("(", ")")):
        text = text[1:-1]
        if len(text) != 36:  # braces and parentheses wrap the hyphenated form only
            raise SpellingError(f"is not a GUID ({_shape(value)})")
    match = _GUID.fullmatch(text)
    if match is None:
        raise SpellingError(f"is not a GUID ({_shape(value)})")
    # The pattern admits exactly 32 hex digits (hyphens only where the D form has them).
    return uuid_from_int(int(text.replace("-", ""), 16))
