"""``demo``, ``demo cancel`` and ``demo move`` on the embedded development database, as a newcomer
runs them beside ``up``: the calendar's own calls (a cancel skips the event's Pending reminders,
and the trace names the calendar as its writer; a move re-materialises them for the new start);
``demo`` makes exactly what it is asked for and says what it made, kind by kind; the first ten
minutes' ``psql`` query (docs/operations.md) picks a reminder the next cycle cannot send first;
any other database is refused in one line.

Each test starts the embedded PostgreSQL under its own home on a free port (no broker needed).
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa

from reminder_pipeline_tests.support import error_lines, run_cli, up_env

pytestmark = pytest.mark.server

DOCS = Path(__file__).resolve().parents[2] / "docs"


@pytest.fixture
def embedded(tmp_path: Path) -> Iterator[tuple[dict[str, str], sa.Engine]]:
    """A migrated embedded database under a temporary home; its environment and an engine."""
    env = up_env(tmp_path / "home")
    try:
        upgraded = run_cli("db", "upgrade", env=env)
        assert upgraded.returncode == 0, upgraded.stderr[-2000:]
        url = f"postgresql+psycopg://postgres@127.0.0.1:{env['REMINDER_EMBEDDED_PG_PORT']}/calendar"
        engine = sa.create_engine(url)
        yield env, engine
        engine.dispose()
    finally:
        run_cli("services", "stop", env=env)


def _pending(engine: sa.Engine, event_id: str) -> list[sa.Row]:
    with engine.connect() as conn:
        return conn.execute(
            sa.text(
                "SELECT due_at FROM event_reminders "
                "WHERE calendar_event_id = :id AND status = 'Pending' ORDER BY due_at"
            ),
            {"id": event_id},
        ).all()


def _first_ten_minutes_query() -> str:
    """The ``psql`` query of docs/operations.md's first ten minutes, as written there."""
    text = (DOCS / "operations.md").read_text()
    steps = text.split("## Your first ten minutes", 1)[1].split("\n## ", 1)[0]
    [query] = re.findall(r"```sql\n(.*?)```", steps, flags=re.DOTALL)
    return query.strip().rstrip(";")


def test_demo_makes_exactly_what_it_is_asked_for_and_says_so(embedded):
    """``demo --overdue 2`` makes two overdue events and nothing else, and prints how many of
    each kind it made (it printed ``live=.. cancelled=..`` and silently added 30 upcoming)."""
    env, engine = embedded
    made = run_cli("demo", "--overdue", "2", "--json", env=env)
    assert made.returncode == 0, made.stderr[-2000:]
    data = json.loads(made.stdout)
    kinds = data["kinds"]
    assert (kinds["overdue"]["events"], kinds["due_now"]["events"]) == (2, 0)
    assert kinds["upcoming"]["events"] == 0 and data["events"] == 2
    with engine.connect() as conn:
        events = conn.execute(sa.text("SELECT count(*) FROM calendar_events")).scalar_one()
        overdue = conn.execute(
            sa.text(
                "SELECT count(*) FROM event_reminders WHERE status = 'Pending' AND due_at < now()"
            )
        ).scalar_one()
    assert (events, overdue) == (2, kinds["overdue"]["pending_reminders"])
    assert (
        data["live"] == kinds["overdue"]["live"]
        and data["live"] + data["cancelled"] + data["completed"] == 2
    )

    alone = run_cli("demo", env=env)  # the default calendar, named as such, kind by kind
    assert alone.returncode == 0, alone.stderr[-2000:]
    first, *kinds_made = alone.stdout.splitlines()
    assert first.startswith("demo made 33 events (demo alone: the default calendar; ")
    assert [line.split()[:3] for line in kinds_made] == [
        ["due_now", "3", "events,"],
        ["upcoming", "30", "events,"],
    ]
    assert "reminders Pending, falling due 6 a minute from a minute on" in kinds_made[1]


def test_a_newcomer_seeds_moves_and_cancels_an_event(embedded):
    env, engine = embedded
    seeded = run_cli("demo", "--upcoming", "30", env=env)  # from a minute to 5.8 minutes ahead
    assert seeded.returncode == 0, seeded.stderr[-2000:]
    # The first ten minutes' query picks one the next cycle cannot send first.
    with engine.connect() as conn:
        picked = conn.execute(sa.text(_first_ten_minutes_query())).all()
        now = conn.execute(sa.text("SELECT now()")).scalar_one()
    assert picked and all(due > now + timedelta(minutes=3) for _, due in picked)
    event_id = str(picked[0][0])
    before = _pending(engine, event_id)

    moved = run_cli("demo", "move", event_id, "--minutes", "7", env=env)
    assert moved.returncode == 0, moved.stderr[-2000:]
    assert moved.stdout.startswith(f"event {event_id} moved by 7 min:")
    after = _pending(engine, event_id)
    assert [r.due_at for r in after] == [r.due_at + timedelta(minutes=7) for r in before]

    back = run_cli("demo", "--json", "move", event_id, "--minutes", "-7", env=env)
    assert back.returncode == 0, back.stderr[-2000:]
    moved_back = json.loads(back.stdout)  # --json is honoured by the subcommands too
    assert (moved_back["event_id"], moved_back["minutes"]) == (event_id, -7)
    assert moved_back["reminders"] and all(uuid.UUID(r) for r in moved_back["reminders"])
    after = _pending(engine, event_id)

    cancelled = run_cli("demo", "cancel", event_id, env=env)
    assert cancelled.returncode == 0, cancelled.stderr[-2000:]
    assert f"{len(after)} pending reminder(s) skipped" in cancelled.stdout
    assert _pending(engine, event_id) == []
    # The trace says it was the calendar's cancel, in the reason and as the writer (it said
    # "moved by -"), from the running embedded database (a look-up starts none).
    traced = run_cli("trace", event_id, "--json", env=env)
    assert traced.returncode == 0, traced.stderr[-2000:]
    skipped = [r for r in json.loads(traced.stdout)["reminders"] if r["status"] == "Skipped"]
    assert skipped and all(r["moved_by"] == "calendar" for r in skipped)
    assert any(r["reason"].startswith("skipped by the cancel of the event at ") for r in skipped)
    text = run_cli("trace", event_id, env=env).stdout
    assert "moved by       the calendar (it records no writer" in text
    again = run_cli("demo", "--json", "cancel", event_id, env=env)
    assert again.returncode == 0, again.stderr[-2000:]
    assert json.loads(again.stdout) == {"event_id": event_id, "cancelled": True, "skipped": 0}

    unknown = run_cli("demo", "cancel", str(uuid.uuid4()), env=env)
    assert unknown.returncode == 1 and len(error_lines(unknown)) == 1
    assert "does not exist" in error_lines(unknown)[0]


def test_demo_commands_refuse_any_database_but_the_embedded_one(tmp_path):
    env = {
        **up_env(tmp_path / "home"),
        "DATABASE_URL": "postgresql+psycopg://u@db.example/calendar",
    }
    for args in (
        ("demo",),
        ("demo", "cancel", str(uuid.uuid4())),
        ("demo", "move", str(uuid.uuid4()), "--minutes", "3"),
    ):
        result = run_cli(*args, env=env)
        assert result.returncode == 2
        assert error_lines(result) == [
            "reminder-pipeline: error: demo changes only the embedded development database: "
            "unset DATABASE_URL"
        ]
    assert not (tmp_path / "home").exists()  # nothing was started
