"""The pure mapping of the consumer: parsing a reminder-due message and building its notifications."""

from __future__ import annotations

import dataclasses
import json
import pickle
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reminder_pipeline.consumer.notifications import (
    NOTIFICATION_NAMESPACE,
    WARNING_TIME_ZONE_FALLBACK,
    WARNING_UNKNOWN_KIND,
    IncompatibleMessage,
    MessageProblem,
    NotificationKind,
    RecipientRole,
    local_time,
    notifications_for,
    parse_reminder,
)
from reminder_pipeline.consumer.texts import Locale, horizon_en, reminder_text
from reminder_pipeline.domain import contract
from reminder_pipeline.domain.model import DueReminder
from reminder_pipeline_tests.oracle import build_payload

from .payloads import payload

START = datetime(2026, 11, 30, 10, 0, tzinfo=UTC)  # payload()'s StartAt


def raw(data: Any) -> bytes:
    return json.dumps(data).encode()


def test_a_valid_payload_parses_into_typed_fields() -> None:
    data = payload(ClientUserId=str(uuid.uuid4()), AppointmentId=str(uuid.uuid4()))
    reminder = parse_reminder(raw(data))
    assert str(reminder.reminder_id) == data["ReminderId"]
    assert str(reminder.client_user_id) == data["ClientUserId"]
    assert reminder.start_at == START
    assert reminder.offset_minutes == 60


def test_what_the_mapping_builds_equals_what_the_constructors_build() -> None:
    # The reminder and its notifications are built without their dataclass __init__ (speed):
    # every field is set, in order, and they compare, hash and pickle as constructed ones.
    data = payload(ClientUserId=str(uuid.uuid4()), AppointmentId=str(uuid.uuid4()))
    mapped = notifications_for(parse_reminder(raw(data)))
    for built in (mapped.reminder, *mapped.notifications):
        again = dataclasses.replace(built)
        assert built == again and hash(built) == hash(again) and repr(built) == repr(again)
        assert list(vars(built)) == [f.name for f in dataclasses.fields(built)]
        assert pickle.loads(pickle.dumps(built)) == built
    ids = [mapped.reminder.reminder_id, *(n.notification_id for n in mapped.notifications)]
    for value in ids:
        assert value == uuid.UUID(str(value)) and hash(value) == hash(uuid.UUID(str(value)))
        assert value.is_safe is uuid.SafeUUID.unknown and pickle.loads(pickle.dumps(value)) == value
    with pytest.raises(dataclasses.FrozenInstanceError):
        mapped.notifications[0].text = "changed"  # type: ignore[misc]


def test_the_producers_payload_is_accepted_by_the_consumer() -> None:
    due = DueReminder(
        reminder_id=str(uuid.uuid4()),
        event_id=str(uuid.uuid4()),
        tenant_id=str(uuid.uuid4()),
        owner_user_id=str(uuid.uuid4()),
        client_user_id=None,
        appointment_id=str(uuid.uuid4()),
        kind="Showing",
        event_status="Planned",
        start_at=START,
        time_zone="Asia/Tokyo",
        offset_minutes=1440,
        due_at=START - timedelta(days=1),
    )
    reminder = parse_reminder(raw(build_payload(due)))
    assert (str(reminder.reminder_id), reminder.start_at, reminder.kind) == (
        due.reminder_id,
        START,
        "Showing",
    )


def test_field_names_in_any_case_are_the_contracts_fields() -> None:
    """System.Text.Json's web defaults write camelCase names: the same fields."""
    data = payload(ClientUserId=str(uuid.uuid4()))
    camel = {name[0].lower() + name[1:]: value for name, value in data.items()}
    assert parse_reminder(raw(camel)) == parse_reminder(raw(data))


def test_one_field_given_twice_with_different_values_is_incompatible() -> None:
    data = {**payload(), "reminderId": str(uuid.uuid4())}
    with pytest.raises(IncompatibleMessage, match="ReminderId") as caught:
        parse_reminder(raw(data))
    assert caught.value.problem is MessageProblem.INCOMPATIBLE


def test_an_integral_float_offset_is_the_same_integer() -> None:
    assert parse_reminder(raw(payload(OffsetMinutes=60.0))).offset_minutes == 60


@pytest.mark.parametrize("kind", [3, "", "showing", "BOOKINGDEADLINE", ["Showing"]])
def test_a_kind_of_another_type_or_case_is_read_fail_safe(kind: Any) -> None:
    """Kind is additive: an unknown or odd value gets the neutral text; another case is the kind."""
    mapped = notifications_for(parse_reminder(raw(payload(Kind=kind))))
    expected_known = isinstance(kind, str) and kind.lower() in ("showing", "bookingdeadline")
    assert mapped.known_kind is expected_known
    assert mapped.notifications[0].text.startswith(
        ("Property showing", "Booking deadline") if expected_known else "A calendar event"
    )


def test_unknown_extra_fields_and_absent_optional_fields_are_accepted() -> None:
    """The contract is additive: new optional fields must not break an old consumer."""
    data = payload(Priority="high", ClientUserId=..., AppointmentId=...)
    reminder = parse_reminder(raw(data))
    assert reminder.client_user_id is None and reminder.appointment_id is None


def test_the_consumers_leniency_leaves_the_producers_contract_strict() -> None:
    """Extra fields, upper-case GUIDs and +00:00 are read here, and still refused for our output."""
    lenient = payload(Priority="high")
    parse_reminder(raw(lenient))
    with pytest.raises(contract.ContractViolation):
        contract.validate(lenient)
    for field, value in (
        ("ReminderId", str(uuid.uuid4()).upper()),
        ("StartAt", "2026-11-30T10:00:00.1234567+00:00"),
    ):
        parse_reminder(raw(payload(**{field: value})))
        with pytest.raises(contract.ContractViolation):
            contract.validate(payload(**{field: value}))


@pytest.mark.parametrize("missing", contract.REQUIRED_FIELDS)
def test_a_missing_required_field_is_incompatible(missing: str) -> None:
    with pytest.raises(IncompatibleMessage) as caught:
        parse_reminder(raw(payload(**{missing: ...})))
    assert caught.value.problem is MessageProblem.INCOMPATIBLE
    assert missing in str(caught.value)


@pytest.mark.parametrize(
    "field, value",
    [
        ("OffsetMinutes", "60"),
        ("OffsetMinutes", -5),
        ("OffsetMinutes", 1.5),
        ("OffsetMinutes", True),
        ("OffsetMinutes", 2**31),
        ("ReminderId", "not-a-guid"),
        ("EventId", 12345),
        ("StartAt", "2026-11-30 10:00"),
        ("StartAt", "2026-13-30T10:00:00Z"),
        ("StartAt", "2026-11-30T10:00:00"),
        ("StartAt", "0001-01-01T00:30:00+01:00"),
        ("ClientUserId", 42),
        ("AppointmentId", ""),
    ],
)
def test_a_wrong_type_or_shape_is_incompatible(field: str, value: Any) -> None:
    with pytest.raises(IncompatibleMessage) as caught:
        parse_reminder(raw(payload(**{field: value})))
    assert caught.value.problem is MessageProblem.INCOMPATIBLE
    assert field in str(caught.value)


@pytest.mark.parametrize("value", [None, b"", b"{not json", b"\xff\xfe", b"[1, 2]", b'"text"'])
def test_garbage_is_unparseable(value: bytes | None) -> None:
    with pytest.raises(IncompatibleMessage) as caught:
        parse_reminder(value)
    assert caught.value.problem is MessageProblem.UNPARSEABLE


@pytest.mark.parametrize(
    "minutes, text",
    [
        (0, "now"),
        (1, "in a minute"),
        (15, "in 15 minutes"),
        (60, "in an hour"),
        (90, "in 1 hour 30 minutes"),
        (120, "in 2 hours"),
        (1440, "in a day"),
        (1500, "in 1 day 1 hour"),
        (2880, "in 2 days"),
        (10080, "in a week"),
        (20160, "in 2 weeks"),
    ],
)
def test_horizon_text(minutes: int, text: str) -> None:
    assert horizon_en(minutes) == text


def test_an_appointment_reminder_goes_to_owner_and_client_in_local_time() -> None:
    data = payload(
        Kind="Consultation",
        ClientUserId=str(uuid.uuid4()),
        AppointmentId=str(uuid.uuid4()),
        TimeZone="Asia/Yekaterinburg",
    )
    mapped = notifications_for(parse_reminder(raw(data)))
    assert mapped.warnings == ()
    assert [(n.kind, n.recipient_role, str(n.recipient_user_id)) for n in mapped.notifications] == [
        (NotificationKind.APPOINTMENT_REMINDER, RecipientRole.OWNER, data["OwnerUserId"]),
        (NotificationKind.APPOINTMENT_REMINDER, RecipientRole.CLIENT, data["ClientUserId"]),
    ]
    owner = mapped.notifications[0]
    assert owner.local_start == START.astimezone(ZoneInfo("Asia/Yekaterinburg"))
    assert owner.text == "Consultation starts in an hour, at 2026-11-30 15:00 (Asia/Yekaterinburg)"
    assert len({n.notification_id for n in mapped.notifications}) == 2


def test_an_appointment_without_a_client_notifies_the_owner_only() -> None:
    mapped = notifications_for(parse_reminder(raw(payload(AppointmentId=str(uuid.uuid4())))))
    assert [(n.kind, n.recipient_role) for n in mapped.notifications] == [
        (NotificationKind.APPOINTMENT_REMINDER, RecipientRole.OWNER)
    ]


def test_a_task_without_a_client_is_a_calendar_reminder_to_the_owner_only() -> None:
    data = payload(Kind="Task", OffsetMinutes=15)
    mapped = notifications_for(parse_reminder(raw(data)))
    assert [(n.kind, str(n.recipient_user_id)) for n in mapped.notifications] == [
        (NotificationKind.CALENDAR_REMINDER, data["OwnerUserId"])
    ]
    assert (
        mapped.notifications[0].text
        == "Task starts in 15 minutes, at 2026-11-30 13:00 (Europe/Moscow)"
    )


def test_a_calendar_event_with_a_client_adds_the_client() -> None:
    mapped = notifications_for(parse_reminder(raw(payload(ClientUserId=str(uuid.uuid4())))))
    assert [(n.kind, n.recipient_role) for n in mapped.notifications] == [
        (NotificationKind.CALENDAR_REMINDER, RecipientRole.OWNER),
        (NotificationKind.CALENDAR_REMINDER, RecipientRole.CLIENT),
    ]


def test_a_client_who_is_the_owner_is_notified_once() -> None:
    owner = str(uuid.uuid4())
    mapped = notifications_for(parse_reminder(raw(payload(OwnerUserId=owner, ClientUserId=owner))))
    assert len(mapped.notifications) == 1


def test_an_unknown_kind_gets_the_neutral_text_and_a_warning() -> None:
    mapped = notifications_for(parse_reminder(raw(payload(Kind="Webinar"))))
    (notification,) = mapped.notifications
    assert notification.text == "A calendar event starts soon, at 2026-11-30 13:00 (Europe/Moscow)"
    assert notification.known_kind is False and notification.event_kind == "Webinar"
    assert mapped.warnings == (WARNING_UNKNOWN_KIND,) and mapped.known_kind is False


@pytest.mark.parametrize(
    "zone",
    [
        "Mars/Olympus_Mons",
        "localtime",
        "posixrules",
        "Factory",
        "posix/Europe/Moscow",
        "right/Asia/Tokyo",
        "europe/moscow",
        "../../etc/passwd",
        "",
        3,
    ],
)
def test_a_time_zone_that_is_not_a_canonical_iana_name_falls_back_to_utc(zone: Any) -> None:
    """Issue 14's policy: delivered, local time shown in UTC, warned (never the host's files)."""
    mapped = notifications_for(parse_reminder(raw(payload(TimeZone=zone))))
    (notification,) = mapped.notifications
    assert notification.time_zone == "UTC" and notification.local_start == START
    assert notification.text == "Meeting starts in an hour, at 2026-11-30 10:00 (UTC)"
    assert mapped.warnings == (WARNING_TIME_ZONE_FALLBACK,) and mapped.time_zone_fallback


def test_a_link_name_from_ianas_backward_file_is_canonical() -> None:
    mapped = notifications_for(parse_reminder(raw(payload(TimeZone="Europe/Kiev"))))
    assert mapped.notifications[0].time_zone == "Europe/Kiev" and not mapped.time_zone_fallback


def test_local_time_follows_daylight_saving() -> None:
    summer = notifications_for(
        parse_reminder(raw(payload(StartAt="2026-07-01T16:00:00Z", TimeZone="America/New_York")))
    )
    winter = notifications_for(
        parse_reminder(raw(payload(StartAt="2026-12-01T16:00:00Z", TimeZone="America/New_York")))
    )
    assert "12:00 (America/New_York)" in summer.notifications[0].text
    assert "11:00 (America/New_York)" in winter.notifications[0].text


@settings(max_examples=200, deadline=None)
@given(
    kind=st.text(min_size=1, max_size=64),
    zone=st.text(min_size=1, max_size=64),
    offset=st.integers(min_value=0, max_value=2**31 - 1),
    client=st.booleans(),
    appointment=st.booleans(),
)
def test_any_valid_payload_maps_without_failing(
    kind: str, zone: str, offset: int, client: bool, appointment: bool
) -> None:
    """Fail safe: whatever Kind, TimeZone and offset arrive, the owner gets a reminder."""
    data = payload(
        Kind=kind,
        TimeZone=zone,
        OffsetMinutes=offset,
        ClientUserId=str(uuid.uuid4()) if client else None,
        AppointmentId=str(uuid.uuid4()) if appointment else None,
    )
    mapped = notifications_for(parse_reminder(raw(data)))
    assert mapped.notifications[0].recipient_role is RecipientRole.OWNER
    assert len(mapped.notifications) == 1 + client
    assert all(n.text and n.horizon for n in mapped.notifications)


def test_the_notification_id_is_uuid5_of_reminder_and_recipient() -> None:
    """The channel's idempotency key: computed without uuid.uuid5, it must stay its exact value."""
    for _ in range(200):
        data = payload(ClientUserId=str(uuid.uuid4()))
        mapped = notifications_for(parse_reminder(raw(data)))
        for notification in mapped.notifications:
            name = f"{data['ReminderId']}/{notification.recipient_user_id}"
            assert notification.notification_id == uuid.uuid5(NOTIFICATION_NAMESPACE, name)
            assert notification.notification_id.version == 5


@settings(max_examples=200, deadline=None)
@given(
    kind=st.sampled_from(["Meeting", "meeting", "Showing", "Lunch"]),
    zone=st.sampled_from(["Europe/Moscow", "Asia/Tokyo", "UTC", "Mars/Olympus", "localtime"]),
    offset=st.sampled_from([0, 1, 60, 90, 1440, 10080]),
    start=st.sampled_from(["2026-11-30T10:00:00Z", "2026-11-30T13:00:00+03:00", "20261130T1000Z"]),
    locale=st.sampled_from(list(Locale)),
)
def test_texts_read_again_from_the_cache_are_the_ones_computed_afresh(
    kind: str, zone: str, offset: int, start: str, locale: Locale
) -> None:
    """A burst shares StartAts, zones and kinds: what is computed once per distinct value (the
    instant, the local time, the text) is what the uncached functions give for each reminder."""
    reminder = parse_reminder(
        raw(payload(Kind=kind, TimeZone=zone, OffsetMinutes=offset, StartAt=start))
    )
    mapped = notifications_for(reminder, locale)
    local_start, shown, fallback = local_time(reminder.start_at, zone)
    expected = reminder_text(kind, offset, local_start, shown, locale)
    (notification,) = mapped.notifications
    assert reminder.start_at == datetime(2026, 11, 30, 10, 0, tzinfo=UTC)
    assert (notification.text, notification.horizon) == (expected.text, expected.horizon)
    assert (notification.local_start, notification.time_zone) == (local_start, shown)
    assert notification.local_start.utcoffset() == local_start.utcoffset()
    assert mapped.time_zone_fallback is fallback and notification.locale is locale
