"""The demo calendar ``up`` feeds is healthy, on the real database: reminders fall due ahead at a
steady rate and none is overdue, so the dispatcher's checks are green and true on first look;
overdue reminders come only when asked for (``seed(overdue=...)``)."""

from __future__ import annotations

from datetime import timedelta

import sqlalchemy as sa

from reminder_pipeline.local import demo
from reminder_pipeline_tests.support import utcnow


def _pending_dues(engine: sa.Engine) -> list:
    with engine.connect() as conn:
        return list(
            conn.execute(
                sa.text(
                    "SELECT due_at FROM event_reminders WHERE status = 'Pending' ORDER BY due_at"
                )
            ).scalars()
        )


def test_the_feeder_lays_out_the_coming_minutes_at_a_steady_rate_and_nothing_overdue(engine):
    now = utcnow()
    feeder = demo.DemoFeeder(engine)
    feeder.tick(now)
    dues = _pending_dues(engine)
    assert dues and min(dues) > now  # nothing already due, let alone overdue
    # Laid out up to the horizon; a tick may also move one event a few minutes later, so its
    # reminder alone may lie beyond it.
    beyond = [d for d in dues if d > now + demo.HORIZON + timedelta(seconds=30)]
    assert len(beyond) <= 1, beyond
    moved_at_most = timedelta(minutes=max(demo.MOVE_MINUTES))
    assert max(dues) <= now + demo.HORIZON + timedelta(seconds=30) + moved_at_most
    # Steady: every minute of the horizon has reminders falling due (a few were cancelled).
    minutes = {int((d - now).total_seconds() // 60) for d in dues}
    assert minutes >= set(range(1, int(demo.HORIZON.total_seconds() // 60)))
    assert len(dues) <= demo.RATE_PER_MINUTE * 11

    # A later tick only tops the horizon up: nothing laid out twice.
    feeder.tick(now + timedelta(minutes=1))
    later = _pending_dues(engine)
    assert len(later) - len(dues) <= demo.RATE_PER_MINUTE + 2


def test_the_seed_is_due_now_and_ahead_and_overdue_only_when_asked(engine):
    now = utcnow()
    made = demo.seed(engine, upcoming=6, seed_value=1)
    assert all(d > now - timedelta(seconds=30) for d in _pending_dues(engine))
    assert [made["kinds"][k]["events"] for k in demo.SEED_KINDS] == [0, demo.DUE_NOW, 6]
    demo.seed(engine, overdue=5, upcoming=0, due_now=0, seed_value=2)
    assert any(d < now - timedelta(seconds=30) for d in _pending_dues(engine))


def test_the_seed_says_exactly_what_it_made(engine):
    """Its counts are the rows: 300 upcoming reach 50 minutes ahead, where an event's longer
    offset is still ahead too (two Pending reminders), so no count is one per event by rule."""
    made = demo.seed(engine, overdue=4, upcoming=300, seed_value=3)
    pending = sum(kind["pending_reminders"] for kind in made["kinds"].values())
    assert pending == len(_pending_dues(engine)) > made["live"]
    assert made["events"] == 4 + demo.DUE_NOW + 300
    assert made["events"] == made["live"] + made["cancelled"] + made["completed"]
    assert demo.seed_plan(None, None) == {
        "overdue": 0,
        "due_now": demo.DUE_NOW,
        "upcoming": demo.DEFAULT_UPCOMING,
    }
    assert demo.seed_plan(20, None) == {"overdue": 20, "due_now": 0, "upcoming": 0}
