"""``demo``, ``demo cancel`` and ``demo move`` on the embedded development database, as a newcomer
runs them beside ``up``: the calendar's own calls (a cancel skips the event's Pending reminders, a
move re-materialises them for the new start); any other database is refused in one line.

Each test starts the embedded PostgreSQL under its own home on a free port (no broker needed).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa

from reminder_pipeline_tests.support import error_lines, run_cli, up_env

pytestmark = pytest.mark.server


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


def test_a_newcomer_seeds_moves_and_cancels_an_event(embedded):
    env, engine = embedded
    seeded = run_cli("demo", "--upcoming", "3", env=env)
    assert seeded.returncode == 0, seeded.stderr[-2000:]
    with engine.connect() as conn:
        event_id = str(
            conn.execute(
                sa.text(
                    "SELECT r.calendar_event_id FROM event_reminders r "
                    "JOIN calendar_events e ON e.id = r.calendar_event_id "
                    "WHERE r.status = 'Pending' AND e.status = 'Planned' "
                    "ORDER BY r.due_at DESC LIMIT 1"
                )
            ).scalar_one()
        )
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
