"""The command line against real servers: a cycle, poison-row handling, and one-line errors for bad settings."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from reminder_pipeline.services import free_port

from ..support import POISON_KIND, make_due_event, outbox_rows, reminders


def run_cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "reminder_pipeline.cli", *args],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture
def cli_env(database_url, kafka_settings, tmp_path):
    return {
        "DATABASE_URL": database_url,
        "KAFKA_BOOTSTRAP_SERVERS": kafka_settings.bootstrap_servers,
        "REMINDER_PIPELINE_HOME": str(tmp_path),
    }


def test_dispatch_prints_the_cycle_counts(engine, cli_env):
    event_id = make_due_event(engine)
    result = run_cli("dispatch", env=cli_env)
    assert result.returncode == 0, result.stderr
    counts = json.loads(result.stdout)
    assert counts["sent"] == 1 and counts["published"] == 1
    assert reminders(engine, event_id)[0]["status"] == "Sent"


def test_poison_rows_can_be_listed_retried_and_skipped(engine, cli_env):
    poison = make_due_event(engine, kind=POISON_KIND)
    assert run_cli("dispatch", env=cli_env).returncode == 0
    [row] = reminders(engine, poison)
    listed = json.loads(run_cli("poison", "list", env=cli_env).stdout)
    assert [r["id"] for r in listed] == [str(row["id"])]
    assert "Kind" in listed[0]["last_error"]

    retry = run_cli("poison", "retry", str(row["id"]), env=cli_env)
    assert retry.returncode == 0 and reminders(engine, poison)[0]["next_attempt_at"] is None
    assert "poison row retry" in retry.stderr  # logged

    skip = run_cli("poison", "skip", str(row["id"]), env=cli_env)
    assert skip.returncode == 0
    assert reminders(engine, poison)[0]["status"] == "Skipped"
    assert outbox_rows(engine) == []
    again = run_cli("poison", "skip", str(row["id"]), env=cli_env)
    assert again.returncode == 1  # no longer Pending: nothing changed


@pytest.mark.parametrize(
    ("override", "setting"),
    [
        ({"REMINDER_BATCH_SIZE": "lots"}, "REMINDER_BATCH_SIZE"),
        ({"REMINDER_BATCH_SIZE": "-1"}, "REMINDER_BATCH_SIZE"),
        ({"KAFKA_SECURITY_PROTOCOL": "QUANTUM"}, "KAFKA_SECURITY_PROTOCOL"),
        ({"DATABASE_URL": "sqlite:///x.db"}, "DATABASE_URL"),
        ({"DATABASE_URL": "postgresql+psycopg://nobody@127.0.0.1:{port}/nothing"}, "DATABASE_URL"),
        ({"KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:{port}"}, "KAFKA_BOOTSTRAP_SERVERS"),
    ],
)
def test_bad_settings_are_one_line_errors_and_nothing_is_dispatched(engine, cli_env, override, setting):
    event_id = make_due_event(engine)
    port = str(free_port())  # nothing listens there
    env = {**cli_env, **{k: v.replace("{port}", port) for k, v in override.items()}}
    result = run_cli("dispatch", env=env)
    assert result.returncode == 2
    errors = [line for line in result.stderr.splitlines() if line.startswith("reminder-pipeline: error")]
    assert len(errors) == 1 and setting in errors[0], result.stderr
    assert "Traceback" not in result.stderr
    assert reminders(engine, event_id)[0]["status"] == "Pending"
    assert outbox_rows(engine) == []
