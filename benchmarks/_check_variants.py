"""Checks that the prototyped fixes in ``_variants`` do what the code they replace does.

``python -m benchmarks._check_variants`` - on a scratch database: (1) the fast contract check
accepts and refuses exactly what jsonschema does on random and mutated payloads; (2) the SQL-built
payload (``sqlpayload``) equals ``build_payload``'s for every row of a varied backlog, and the
outbox/status outcome equals the current code's.
"""

from __future__ import annotations

import json
import random
import uuid
from datetime import UTC, datetime, timedelta

import psycopg

from reminder_pipeline import cycle
from reminder_pipeline.calendar import NewEvent, create_event
from reminder_pipeline.db import make_engine
from reminder_pipeline.domain import contract
from reminder_pipeline.domain.payload import build_payload
from reminder_pipeline.store import migrate, repository

from . import _variants
from ._infra import progress, servers


def check_validator(n: int = 5000) -> int:
    rng = random.Random(3)
    mutations = [
        lambda p: p.pop(rng.choice(list(p))),
        lambda p: p.__setitem__("Extra", 1),
        lambda p: p.__setitem__("OffsetMinutes", rng.choice([-1, True, 1.5, "5", 2**31])),
        lambda p: p.__setitem__("Kind", rng.choice(["", "x" * 65, "é" * 64, None, 3])),
        lambda p: p.__setitem__("StartAt", rng.choice(["2026-01-01T10:00:00", "2026-01-01T10:00:00.1234567Z",
                                                      "2026-01-01T10:00:00Z\n", "2026-01-01 10:00:00Z"])),
        lambda p: p.__setitem__(rng.choice(["ReminderId", "ClientUserId"]),
                                rng.choice([str(uuid.uuid4()).upper(), "x", None, ""])),
        lambda p: p.__setitem__("TimeZone", rng.choice(["", "z" * 65, None])),
        lambda p: None,
    ]
    disagreements = 0
    reference = contract._validator()  # jsonschema over the shipped schema
    for _ in range(n):
        p = {
            "ReminderId": str(uuid.uuid4()), "EventId": str(uuid.uuid4()),
            "TenantId": str(uuid.uuid4()), "OwnerUserId": str(uuid.uuid4()),
            "ClientUserId": rng.choice([None, str(uuid.uuid4())]), "Kind": "Meeting",
            "StartAt": "2026-01-01T10:00:00Z", "TimeZone": "UTC", "OffsetMinutes": 15,
            "AppointmentId": None,
        }
        for _ in range(rng.randint(0, 2)):
            rng.choice(mutations)(p)
        ok_ref = not any(True for _ in reference.iter_errors(p))
        try:
            contract.validate(p)
            ok_fast = True
        except contract.ContractViolation:
            ok_fast = False
        if ok_ref != ok_fast:
            disagreements += 1
            if disagreements <= 5:
                print("validator disagreement:", json.dumps(p), ok_ref, ok_fast)
    return disagreements


def check_sqlpayload(srv) -> tuple[int, int]:
    db = srv.create_database("check")
    engine = make_engine(srv.url(db))
    migrate.upgrade(engine)
    rng = random.Random(5)
    now = datetime.now(UTC)
    for i in range(300):
        start = now - timedelta(minutes=rng.randint(0, 3000), seconds=rng.randint(0, 59),
                                microseconds=rng.choice([0, 0, 1, 500000, 999999, rng.randint(0, 999999)]))
        start += timedelta(minutes=60)
        create_event(engine, NewEvent(
            tenant_id=uuid.uuid4(), owner_user_id=uuid.uuid4(),
            client_user_id=rng.choice([None, uuid.uuid4()]),
            appointment_id=rng.choice([None, uuid.uuid4()]),
            kind=rng.choice(["Meeting", "Showing", "Встреча", "k" * 64]),
            start_at=start, time_zone=rng.choice(["UTC", "Europe/Moscow", "America/St_Johns"]),
            status=rng.choice(["Planned", "InProgress", "Cancelled"]),
        ), (60, 15), now=now - timedelta(days=5))
    # Expected payloads from the current code's rules, read before anything moves.
    with engine.connect() as conn:
        due = repository.select_due_for_update_skip_locked(conn, cycle.now_utc(), 10_000)
        conn.rollback()
    expected = {str(r.reminder_id): build_payload(r) for r in due
                if r.event_status in ("Planned", "InProgress")}
    _variants.apply("sqlpayload")
    cycle.drain(engine, cycle.now_utc(), 1000, max_batches=10)
    with psycopg.connect(srv.dsn(db)) as conn:
        got = {str(r[0]): r[1] for r in conn.execute("SELECT reminder_id, payload FROM outbox")}
    mismatches = 0
    for rid, payload in expected.items():
        if got.get(rid) != payload:
            mismatches += 1
            if mismatches <= 5:
                print("payload mismatch:", rid, payload, got.get(rid))
    mismatches += len(set(got) - set(expected))
    engine.dispose()
    srv.drop_database(db)
    return len(expected), mismatches


def main() -> int:
    bad = check_validator()
    progress(f"contract.validate vs jsonschema: {bad} disagreements over 5,000 payloads")
    with servers() as srv:
        checked, mismatches = check_sqlpayload(srv)
    progress(f"sqlpayload vs build_payload: {mismatches} mismatches over {checked} payloads")
    return 0 if bad == 0 and mismatches == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
