"""A valid contract v1 payload for the consumer's tests, with fields replaced or removed."""

from __future__ import annotations

import uuid
from typing import Any


def payload(**overrides: Any) -> dict[str, Any]:
    """A valid contract v1 payload (fresh ids, a Meeting at 2026-11-30T10:00:00Z, 60 minutes
    before, Europe/Moscow); ``overrides`` replace fields, a value of ``...`` removes one."""
    data: dict[str, Any] = {
        "ReminderId": str(uuid.uuid4()),
        "EventId": str(uuid.uuid4()),
        "TenantId": str(uuid.uuid4()),
        "OwnerUserId": str(uuid.uuid4()),
        "ClientUserId": None,
        "Kind": "Meeting",
        "StartAt": "2026-11-30T10:00:00Z",
        "TimeZone": "Europe/Moscow",
        "OffsetMinutes": 60,
        "AppointmentId": None,
        **overrides,
    }
    return {k: v for k, v in data.items() if v is not ...}
