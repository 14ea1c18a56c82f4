"""Domain rules without any server: transitions, decisions, payloads, the contract's schema."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta, timezone

import pytest

from reminder_pipeline.domain import contract
from reminder_pipeline.domain.model import Action, DueReminder, EventStatus, ReminderStatus
from reminder_pipeline.domain.transitions import action_for
from reminder_pipeline_tests.oracle import (
    PayloadError,
    TransitionError,
    build_payload,
    check_transition,
    decide,
    iso_utc,
    plan_batch,
)


def reminder(**overrides) -> DueReminder:
    base = DueReminder(
        reminder_id=str(uuid.uuid4()),
        event_id=str(uuid.uuid4()),
        tenant_id=str(uuid.uuid4()),
        owner_user_id=str(uuid.uuid4()),
        client_user_id=None,
        appointment_id=None,
        kind="Meeting",
        event_status="Planned",
        start_at=datetime(2026, 12, 1, 9, 30, tzinfo=UTC),
        time_zone="Europe/Moscow",
        offset_minutes=60,
        due_at=datetime(2026, 12, 1, 8, 30, tzinfo=UTC),
    )
    return base._replace(**overrides)


@pytest.mark.parametrize(
    ("status", "action"),
    [
        (EventStatus.PLANNED, Action.SEND),
        (EventStatus.IN_PROGRESS, Action.SEND),
        (EventStatus.CANCELLED, Action.SKIP),
        (EventStatus.COMPLETED, Action.SKIP),
        ("SomethingNew", Action.SKIP),
    ],
)
def test_decision_follows_the_event_status(status, action):
    assert action_for(str(status)) is action  # the cycle's rule
    decision = decide(reminder(event_status=str(status)))  # the tests' oracle
    assert decision.action is action
    expected = ReminderStatus.SENT if action is Action.SEND else ReminderStatus.SKIPPED
    assert decision.target_status is expected


def test_only_pending_rows_move_and_terminal_states_stay():
    check_transition("Pending", "Sent")
    check_transition("Pending", "Skipped")
    for current, target in [
        ("Sent", "Pending"),
        ("Skipped", "Sent"),
        ("Sent", "Skipped"),
        ("Pending", "Pending"),
    ]:
        with pytest.raises(TransitionError):
            check_transition(current, target)


def test_payload_has_exactly_the_contract_fields_and_validates():
    r = reminder(client_user_id=str(uuid.uuid4()), appointment_id=str(uuid.uuid4()))
    payload = build_payload(r)
    assert tuple(payload) == contract.PAYLOAD_FIELDS
    assert payload["EventId"] == str(r.event_id)
    assert payload["StartAt"] == "2026-12-01T09:30:00Z"
    assert payload["OffsetMinutes"] == 60
    contract.validate(payload)


def test_payload_nulls_optional_fields():
    payload = build_payload(reminder())
    assert payload["ClientUserId"] is None and payload["AppointmentId"] is None


def test_start_at_is_rendered_in_utc_whatever_the_input_offset():
    msk = timezone(timedelta(hours=3))
    assert iso_utc(datetime(2026, 12, 1, 12, 30, tzinfo=msk)) == "2026-12-01T09:30:00Z"
    assert (
        iso_utc(datetime(2026, 12, 1, 9, 30, 0, 500, tzinfo=UTC)) == "2026-12-01T09:30:00.000500Z"
    )


def test_unknown_kind_is_allowed_by_the_additive_contract():
    payload = build_payload(reminder(kind="Inspection"))
    assert payload["Kind"] == "Inspection"


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        ({"start_at": None}, "StartAt"),
        ({"offset_minutes": -5}, "OffsetMinutes"),
        ({"kind": ""}, "Kind"),
        ({"kind": "K" * 500}, "contract"),
    ],
)
def test_poison_rows_raise_a_one_line_payload_error(overrides, needle):
    with pytest.raises(PayloadError) as info:
        build_payload(reminder(**overrides))
    assert needle in str(info.value)
    assert "\n" not in str(info.value)


def test_schema_rejects_extra_fields_and_missing_required_ones():
    payload = build_payload(reminder())
    with pytest.raises(contract.ContractViolation):
        contract.validate({**payload, "Title": "x"})
    missing = dict(payload)
    del missing["TenantId"]
    with pytest.raises(contract.ContractViolation):
        contract.validate(missing)


def test_headers_carry_version_type_and_reminder_id():
    h = contract.headers("abc", "run-1")
    assert h["contract-version"] == "1"
    assert h["event-type"] == "pin.calendar.reminder-due"
    assert h["reminder-id"] == "abc"
    assert h["correlation-id"] == "run-1"


@pytest.mark.parametrize(
    "zone",
    [
        "Mars/Olympus_Mons",
        "",
        "../../etc/passwd",
        "localtime",
        "posixrules",
        "Factory",
        "posix/Europe/Moscow",
        "right/UTC",
        "europe/moscow",
        None,
    ],
)
def test_a_zone_that_is_not_canonical_iana_is_sent_as_utc_never_held_back(zone):
    # The time-zone policy: the reminder matters more than its wording (docs/design.md).
    payload = build_payload(reminder(time_zone=zone))
    assert payload["TimeZone"] == "UTC"
    contract.validate(payload)
    plan = plan_batch([reminder(time_zone=zone)])
    assert len(plan.sends) == 1 and plan.poison == []
    assert len(plan.time_zone_fallbacks) == 1


@pytest.mark.parametrize(
    "zone",
    ["Europe/Moscow", "UTC", "America/Argentina/ComodRivadavia", "Europe/Kiev", "Etc/GMT+12"],
)
def test_a_canonical_zone_is_sent_as_is(zone):
    assert build_payload(reminder(time_zone=zone))["TimeZone"] == zone
    assert plan_batch([reminder(time_zone=zone)]).time_zone_fallbacks == []


def test_the_plan_decides_each_row_on_its_own_state():
    live, closed = reminder(), reminder(event_status="Cancelled")
    poison = reminder(kind="K" * 65)
    plan = plan_batch([live, closed, poison], run_id="run-1", trace={"traceparent": "x"})
    [(sent, message)] = plan.sends
    assert sent is live and message.message_key == live.event_id
    assert message.headers["correlation-id"] == "run-1" and message.headers["traceparent"] == "x"
    assert plan.skips == [closed]
    assert [p.reminder_id for p in plan.poison] == [poison.reminder_id]
    assert "Kind" in plan.poison[0].error
    assert [(r.reminder_id, s.value) for r, s, _ in plan.transitions()] == [
        (live.reminder_id, "Sent"),
        (closed.reminder_id, "Skipped"),
    ]
