"""Lenient reading of the contract's types: every spelling other producers write means the same value.

Property tests: an instant is written in any ISO-8601 spelling with an offset (extended or basic,
any fraction length, any offset form) and must read back as the same instant (to the
microsecond, digits beyond it truncated); a GUID in any case and form must read back as the same
id; what is not an instant or a GUID is refused with a one-line reason.
"""

from __future__ import annotations

import json
import pickle
import uuid
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from reminder_pipeline.consumer.notifications import (
    IncompatibleMessage,
    MessageProblem,
    parse_reminder,
)
from reminder_pipeline.consumer.spellings import SpellingError, parse_guid, parse_instant

# -- instants ------------------------------------------------------------------------------------

offsets = st.integers(min_value=-(23 * 60 + 59), max_value=23 * 60 + 59).map(
    lambda minutes: timedelta(minutes=minutes)
)


@st.composite
def instant_spellings(draw: st.DrawFn) -> tuple[str, datetime]:
    """(a spelling, the UTC instant it means) for an arbitrary date-time and offset."""
    offset = draw(offsets)
    local = draw(st.datetimes(min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30)))
    if draw(st.booleans()):
        local = local.replace(microsecond=0)
    if draw(st.booleans()):
        local = local.replace(second=0, microsecond=0)
    expected = local.replace(tzinfo=timezone(offset)).astimezone(UTC)

    basic = draw(st.booleans())
    # Not strftime's %Y, which does not pad years before 1000 to four digits.
    ymd = (f"{local.year:04d}", f"{local.month:02d}", f"{local.day:02d}")
    date = "".join(ymd) if basic else "-".join(ymd)
    hm = f"{local:%H%M}" if basic else f"{local:%H:%M}"
    seconds = ""
    if local.second or local.microsecond or draw(st.booleans()):
        seconds = f"{local:%S}" if basic else f":{local:%S}"
        extra = draw(st.text("0123456789", max_size=4))  # digits past the microsecond (ticks, ns)
        digits = f"{local.microsecond:06d}" + extra
        if local.microsecond or extra or draw(st.booleans()):
            keep = draw(st.integers(min_value=len(digits.rstrip("0")) or 1, max_value=len(digits)))
            seconds += draw(st.sampled_from(".,")) + digits[:keep]

    sign = "-" if offset < timedelta(0) else "+"
    hours, minutes = divmod(abs(int(offset.total_seconds())) // 60, 60)
    forms = [f"{sign}{hours:02d}:{minutes:02d}", f"{sign}{hours:02d}{minutes:02d}"]
    if minutes == 0:
        forms.append(f"{sign}{hours:02d}")
    if offset == timedelta(0):
        forms += ["Z", "z", "-00:00"]
    spelled = date + draw(st.sampled_from("Tt")) + hm + seconds + draw(st.sampled_from(forms))
    return spelled, expected


@settings(max_examples=500, deadline=None)
@given(instant_spellings())
def test_every_iso_8601_spelling_with_an_offset_is_the_same_instant(
    case: tuple[str, datetime],
) -> None:
    spelled, expected = case
    assume(datetime(1, 1, 1, 0, 0, tzinfo=UTC) < expected < datetime(9999, 12, 31, tzinfo=UTC))
    parsed = parse_instant(spelled)
    assert parsed == expected and parsed.tzinfo is UTC, spelled


@pytest.mark.parametrize(
    "spelled, expected",
    [
        # What a .NET producer of the same contract writes (DateTimeOffset, "o" format).
        ("2026-11-30T23:11:55.1234567+00:00", datetime(2026, 11, 30, 23, 11, 55, 123456, UTC)),
        ("2026-11-30T23:11:55+00:00", datetime(2026, 11, 30, 23, 11, 55, tzinfo=UTC)),
        ("2026-12-01T02:11:55.1234567+03:00", datetime(2026, 11, 30, 23, 11, 55, 123456, UTC)),
        # Java's Instant (nanoseconds), JavaScript's toISOString, Go's RFC 3339.
        ("2026-11-30T23:11:55.123456789Z", datetime(2026, 11, 30, 23, 11, 55, 123456, UTC)),
        ("2026-11-30T23:11:55.123Z", datetime(2026, 11, 30, 23, 11, 55, 123000, UTC)),
        ("2026-11-30T18:11:55-05:00", datetime(2026, 11, 30, 23, 11, 55, tzinfo=UTC)),
        ("20261130T231155Z", datetime(2026, 11, 30, 23, 11, 55, tzinfo=UTC)),
        # Our own producer's form.
        ("2026-11-30T23:11:55Z", datetime(2026, 11, 30, 23, 11, 55, tzinfo=UTC)),
        ("9999-12-31T23:00:00Z", datetime(9999, 12, 31, 23, 0, tzinfo=UTC)),
    ],
)
def test_the_spellings_real_producers_write(spelled: str, expected: datetime) -> None:
    assert parse_instant(spelled) == expected


@pytest.mark.parametrize(
    "value",
    [
        "2026-11-30T23:11:55",  # no offset: a local time, not an instant
        "2026-11-30 23:11:55Z",
        "2026-11-30",
        "2026-13-30T10:00:00Z",
        "2026-11-31T10:00:00Z",
        "2026-11-30T24:00:00Z",
        "2026-11-30T23:11:55+24:00",
        "2026-11-30T23:11:55.Z",
        "0001-01-01T00:30:00+01:00",  # before year 1 in UTC
        "9999-12-31T23:59:59-01:00",  # after year 9999 in UTC
        "2026-11-30T23:11:55Z trailing",
        "２０２６-11-30T23:11:55Z",  # non-ASCII digits
        "",
        1796079160,
        None,
    ],
)
def test_what_is_not_an_instant_with_an_offset_is_refused(value: Any) -> None:
    with pytest.raises(SpellingError) as caught:
        parse_instant(value)
    assert "\n" not in str(caught.value) and len(str(caught.value)) < 120


# -- GUIDs ---------------------------------------------------------------------------------------


@st.composite
def guid_spellings(draw: st.DrawFn) -> tuple[str, uuid.UUID]:
    value = draw(st.uuids())
    text = draw(st.sampled_from([str(value), value.hex]))
    text = "".join(c.upper() if draw(st.booleans()) else c for c in text)
    if "-" in text:
        opening = draw(st.sampled_from(["", "{", "("]))
        text = opening + text + {"": "", "{": "}", "(": ")"}[opening]
    return text, value


@settings(max_examples=300, deadline=None)
@given(guid_spellings())
def test_a_guid_in_any_case_and_form_is_the_same_id(case: tuple[str, uuid.UUID]) -> None:
    spelled, expected = case
    parsed = parse_guid(spelled)
    # The same id whatever the spelling: equal, hashed, shown and pickled as the UUID would be.
    assert parsed == expected and hash(parsed) == hash(expected)
    assert str(parsed) == str(expected) and repr(parsed) == repr(expected)
    again = pickle.loads(pickle.dumps(parsed))
    assert again == expected and str(again) == str(expected)


@pytest.mark.parametrize(
    "value",
    [
        "not-a-guid",
        "0b6f5d0e-3c55-4d39-9a52-7e2d1f0c8a4",
        "0b6f5d0e-3c55-4d39-9a52-7e2d1f0c8a41x",
        "{0b6f5d0e3c554d399a527e2d1f0c8a41}",
        "{0b6f5d0e-3c55-4d39-9a52-7e2d1f0c8a41)",
        "urn:uuid:0b6f5d0e-3c55-4d39-9a52-7e2d1f0c8a41",
        "g" * 32,
        # 36 characters with the D form's hyphens, but what int(..., 16) would also take.
        " 0b6f5d0-3c55-4d39-9a52-7e2d1f0c8a41",
        "+0b6f5d0-3c55-4d39-9a52-7e2d1f0c8a41",
        "0b6f_d0e-3c55-4d39-9a52-7e2d1f0c8a41",
        "\u0663b6f5d0e-3c55-4d39-9a52-7e2d1f0c8a41",
        "0b6f5d0g-3c55-4d39-9a52-7e2d1f0c8a41",
        "-" * 36,
        "",
        42,
        None,
    ],
)
def test_what_is_not_a_guid_is_refused(value: Any) -> None:
    with pytest.raises(SpellingError):
        parse_guid(value)


# -- whole messages ------------------------------------------------------------------------------


def _message(**overrides: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "ReminderId": "4dfec947-5a4c-4f0e-9a3b-2c1d0e9f8a7b",
        "EventId": "3ee986e1-1b2c-4d3e-8f4a-5b6c7d8e9f00",
        "TenantId": "39118cb0-aaaa-4bbb-8ccc-dddddddddddd",
        "OwnerUserId": "b2948c04-1111-4222-8333-444444444444",
        "ClientUserId": "616ccf08-5555-4666-8777-888888888888",
        "Kind": "Showing",
        "StartAt": "2026-11-30T06:03:00Z",
        "TimeZone": "Europe/Moscow",
        "OffsetMinutes": 60,
        "AppointmentId": "9c31829a-9999-4aaa-8bbb-cccccccccccc",
    }
    data.update(overrides)
    return data


@settings(max_examples=200, deadline=None)
@given(ids=st.lists(guid_spellings(), min_size=6, max_size=6), start=instant_spellings())
def test_a_message_in_other_spellings_reads_as_the_same_reminder(
    ids: list[tuple[str, uuid.UUID]], start: tuple[str, datetime]
) -> None:
    names = ("ReminderId", "EventId", "TenantId", "OwnerUserId", "ClientUserId", "AppointmentId")
    assume(datetime(1, 1, 1, tzinfo=UTC) < start[1] < datetime(9999, 12, 31, tzinfo=UTC))
    ours = _message(
        **{name: str(value) for name, (_, value) in zip(names, ids, strict=False)},
        StartAt=start[1].isoformat().replace("+00:00", "Z"),
    )
    theirs = _message(
        **{name: spelled for name, (spelled, _) in zip(names, ids, strict=False)}, StartAt=start[0]
    )
    assert parse_reminder(json.dumps(theirs)) == parse_reminder(json.dumps(ours))


@pytest.mark.parametrize(
    "overrides, field",
    [
        ({"StartAt": "2026-11-30T06:03:00"}, "StartAt"),
        ({"StartAt": "tomorrow"}, "StartAt"),
        ({"ReminderId": "4dfec947"}, "ReminderId"),
        ({"OwnerUserId": None}, "OwnerUserId"),
        ({"ClientUserId": "someone"}, "ClientUserId"),
        ({"OffsetMinutes": "sixty"}, "OffsetMinutes"),
    ],
)
def test_a_genuinely_broken_message_is_still_incompatible(
    overrides: dict[str, Any], field: str
) -> None:
    with pytest.raises(IncompatibleMessage) as caught:
        parse_reminder(json.dumps(_message(**overrides)))
    assert caught.value.problem is MessageProblem.INCOMPATIBLE
    assert str(caught.value).startswith(f"{field}: ")
