"""Shared parts of the crash tests: mixed rows, worker processes, and the invariants to check."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timedelta

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from reminder_pipeline import cycle
from reminder_pipeline.store.tables import event_reminders, outbox

from ..support import POISON_KIND, KafkaReader, make_event, utcnow


@dataclass
class Scenario:
    """Rows of one test: all under one tenant, so its messages can be told apart on the topic."""

    tenant_id: uuid.UUID = field(default_factory=uuid.uuid4)
    poison_events: set[uuid.UUID] = field(default_factory=set)
    future_events: set[uuid.UUID] = field(default_factory=set)
    #: Events the calendar cancelled or moved during the run: their rows changed legitimately.
    touched_events: set[uuid.UUID] = field(default_factory=set)
    events: list[uuid.UUID] = field(default_factory=list)


def seed_mixed(engine: Engine, n_events: int, *, seed: int = 7) -> Scenario:
    """Live, cancelled-without-cascade, poison and future rows, set-based for speed."""
    import random

    rng = random.Random(seed)
    scenario = Scenario()
    now = utcnow()
    for _i in range(n_events):
        roll = rng.random()
        kw: dict = {"tenant_id": scenario.tenant_id}
        if roll < 0.1:
            kw["kind"] = POISON_KIND  # poison: breaks the contract
        elif roll < 0.25:
            kw["status"] = "Cancelled"  # the cascade never ran: the dispatcher must skip
        start = now + timedelta(minutes=rng.uniform(1, 59))
        offsets = (60, 90) if rng.random() < 0.5 else (60,)
        if roll > 0.9:
            start = now + timedelta(days=2)  # future
        event_id = make_event(
            engine, start_at=start, offsets=offsets, now=now - timedelta(days=1), **kw
        )
        scenario.events.append(event_id)
        if roll < 0.1:
            scenario.poison_events.add(event_id)
        if roll > 0.9:
            scenario.future_events.add(event_id)
    return scenario


def spawn_worker(
    database_url: str,
    bootstrap: str,
    *,
    crash_at: str | None = None,
    loop: bool = False,
    batch_size: int = 50,
) -> subprocess.Popen:
    """Start a dispatcher process (see worker.py)."""
    cmd = [
        sys.executable,
        "-m",
        "reminder_pipeline_tests.chaos.worker",
        database_url,
        bootstrap,
        "--batch-size",
        str(batch_size),
    ]
    if crash_at:
        cmd += ["--crash-at", crash_at]
    if loop:
        cmd.append("--loop")
    return subprocess.Popen(
        cmd,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=os.environ.copy(),
        cwd=os.getcwd(),
    )


def final_clean_cycles(engine: Engine, publisher) -> datetime:
    """The survivor: cycles until nothing is due (poison rows back off), nothing is still held by
    a dying worker's session, and all is published; returns the last cycle's AsOf."""
    for _ in range(1000):
        report = cycle.run_cycle(
            engine, publisher, batch_size=500, max_batches=50, budget_seconds=120
        )
        counts = report.counts
        if counts.sent + counts.skipped + counts.skipped_locked == 0 and report.relay.failed == 0:
            return report.as_of
    raise AssertionError("the final cycles did not converge")


@dataclass
class Verdict:
    """What the invariant check found."""

    sent: int
    skipped: int
    poison_pending: int
    duplicates: int


def check_invariants(
    engine: Engine, reader: KafkaReader, scenario: Scenario, as_of: datetime | None = None
) -> Verdict:
    """The design's promises, checked on the database and on the topic, for the rows due before
    ``as_of`` (the last cycle's; a rescheduled row may fall due after it)."""
    now = as_of or utcnow()
    with engine.connect() as conn:
        rows = [dict(r._mapping) for r in conn.execute(sa.select(event_reminders))]
        out = [dict(r._mapping) for r in conn.execute(sa.select(outbox))]
    by_id = {r["id"]: r for r in rows}
    poison_pending = 0
    for r in rows:
        event_id = r["calendar_event_id"]
        if event_id in scenario.poison_events and r["status"] == "Pending" and r["due_at"] < now:
            assert r["attempts"] >= 1 and r["last_error"], f"poison row {r['id']} not counted"
            poison_pending += 1
        elif event_id in scenario.future_events and event_id not in scenario.touched_events:
            assert r["status"] == "Pending" and r["attempts"] == 0, f"future row {r['id']} touched"
            assert r["updated_at"] == r["created_at"], f"future row {r['id']} updated"
        elif r["due_at"] < now:
            assert r["status"] in ("Sent", "Skipped"), f"due row {r['id']} stuck in {r['status']}"
            if r["status"] == "Sent":
                assert r["sent_at"] is not None
    sent = {r["id"] for r in rows if r["status"] == "Sent"}
    skipped = {r["id"] for r in rows if r["status"] == "Skipped"}
    outbox_ids = Counter(o["reminder_id"] for o in out)
    assert set(outbox_ids) == sent, "outbox rows and Sent reminders differ"
    assert max(outbox_ids.values(), default=1) == 1, "a reminder has two outbox rows"
    assert not skipped & set(outbox_ids), "a Skipped reminder has an outbox row"
    assert all(o["published_at"] is not None for o in out), "an outbox row never reached the broker"
    reader.wait_for(sent, timeout=120)
    mine = [m for m in reader.messages if m.value.get("TenantId") == str(scenario.tenant_id)]
    seen = Counter(m.value["ReminderId"] for m in mine)
    assert set(seen) == {str(i) for i in sent}, (
        "messages on the topic differ from the Sent reminders"
    )
    for reminder_id in seen:
        assert by_id[uuid.UUID(reminder_id)]["status"] == "Sent"
    return Verdict(
        sent=len(sent),
        skipped=len(skipped),
        poison_pending=poison_pending,
        duplicates=sum(seen.values()) - len(seen),
    )
