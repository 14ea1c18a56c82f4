"""Quiet, true terminals (issue 35): a command prints its answer and nothing else.

Against the real servers, each command a subprocess as an operator runs it: no log line on stderr
below WARNING unless asked (``--verbose``, before or after the command, or REMINDER_LOG_LEVEL);
``services status`` shows the app database as a URL psql takes, as ``up`` does; ``forecast``
lists the coming minutes in time order with the busiest marked; a broker that cannot be reached
is the one error line, librdkafka's own lines only at DEBUG; a bad value is named as it was
given (the option, or its environment variable).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import psycopg
import pytest
from sqlalchemy.engine import make_url

from reminder_pipeline.local.servers import free_port

from ..observability.test_forecast import iso, plant
from ..support import SERVER_VARIABLES, make_due_event, run_cli, up_env


@pytest.fixture
def cli_env(database_url, kafka_settings, tmp_path):
    return {
        "DATABASE_URL": database_url,
        "KAFKA_BOOTSTRAP_SERVERS": kafka_settings.bootstrap_servers,
        "REMINDER_PIPELINE_HOME": str(tmp_path / "home"),
    }


def _json_lines(stderr: str) -> list[dict]:
    return [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]


def test_a_command_prints_only_its_answer_unless_asked_for_more(engine, cli_env):
    make_due_event(engine)
    quiet = run_cli("dispatch", env=cli_env)
    assert quiet.returncode == 0, quiet.stderr
    assert "sent=1 " in quiet.stdout
    assert quiet.stderr == ""  # the cycle's INFO lines are not the answer

    asked = {
        "root option": ("--verbose", "dispatch"),
        "after the command": ("dispatch", "--verbose", "--json"),
        "setting": ("dispatch",),
    }
    for how, args in asked.items():
        make_due_event(engine)
        env = {**cli_env, "REMINDER_LOG_LEVEL": "info"} if how == "setting" else cli_env
        result = run_cli(*args, env=env)
        assert result.returncode == 0, (how, result.stderr)
        sent = [line for line in _json_lines(result.stderr) if line["msg"] == "reminder sent"]
        assert len(sent) == 1 and sent[0]["level"] == "INFO", (how, result.stderr)
        if "--json" in args:
            assert json.loads(result.stdout)["sent"] == 1  # the answer, still on stdout


def test_services_status_shows_the_database_as_up_does_a_url_psql_takes(database_url, tmp_path):
    port = free_port()
    embedded = run_cli(
        "services",
        "status",
        "--json",
        env={
            "REMINDER_PIPELINE_HOME": str(tmp_path / "home"),
            "REMINDER_EMBEDDED_PG_PORT": str(port),
        },
    )
    assert embedded.returncode == 0, embedded.stderr
    # up's "Database:" line for the embedded default: the app database, libpq's form.
    assert json.loads(embedded.stdout)["postgres"]["url"] == (
        f"postgresql://postgres@127.0.0.1:{port}/calendar"
    )

    named = run_cli(
        "services",
        "status",
        env={"REMINDER_PIPELINE_HOME": str(tmp_path / "home"), "DATABASE_URL": database_url},
    )
    assert named.returncode == 0, named.stderr
    [line] = [line for line in named.stdout.splitlines() if line.startswith("postgres:")]
    url = line.split("url=")[1].split()[0]
    assert "+psycopg" not in url
    with psycopg.connect(url, connect_timeout=10) as conn:  # psql's library takes it as printed
        name = conn.execute("SELECT current_database()").fetchone()
    assert name == (make_url(database_url).database,)


def test_forecast_lists_the_coming_minutes_in_time_order_with_the_busiest_marked(
    engine, database_url
):
    later, sooner, busiest = plant(engine, 2, 50), plant(engine, 1, 20), plant(engine, 5, 35)
    result = run_cli("forecast", "--hours", "2", env={"DATABASE_URL": database_url})
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("coming minute (UTC)"))
    assert lines[header].split() == ["coming", "minute", "(UTC)", "due", "busiest"]
    rows = [line.split() for line in lines[header + 1 :]]
    assert rows == [
        [iso(sooner), "1", "#3"],
        [iso(busiest), "5", "peak"],
        [iso(later), "2", "#2"],
    ]


def test_a_bad_value_is_named_as_it_was_given():
    typed = run_cli("forecast", "--hours", "0", env={})
    from_env = run_cli("forecast", env={"REMINDER_FORECAST_HOURS": "500"})
    for result in (typed, from_env):
        assert result.returncode == 2 and len(result.stderr.splitlines()) == 1, result.stderr
    assert "'--hours'" in typed.stderr and "REMINDER_FORECAST_HOURS" not in typed.stderr
    assert "'REMINDER_FORECAST_HOURS'" in from_env.stderr and "--hours" not in from_env.stderr


BROKER_COMMANDS = {
    "dlq list": ("dlq", "list"),
    "dlq replay": ("dlq", "replay", "--all", "--dry-run"),
    "dispatch": ("dispatch",),
    "relay": ("relay",),
    "consume": ("consume", "--once"),
}


def test_a_broker_that_cannot_be_reached_is_one_line(database_url, tmp_path):
    """Each command waits out its own timeout (10-15 s): they run side by side."""
    closed = f"127.0.0.1:{free_port()}"
    env = {
        "DATABASE_URL": database_url,
        "KAFKA_BOOTSTRAP_SERVERS": closed,
        "REMINDER_PIPELINE_HOME": str(tmp_path / "home"),
    }
    base = {k: v for k, v in os.environ.items() if k not in SERVER_VARIABLES}
    runs = {
        name: subprocess.Popen(
            [sys.executable, "-m", "reminder_pipeline.cli", *args],
            env={**base, **env},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name, args in BROKER_COMMANDS.items()
    }
    for name, proc in runs.items():
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 1, (name, err[-2000:])
        assert "%3|" not in err and "rdkafka" not in err, (name, err[:500])
        [line] = err.splitlines()
        assert f"KAFKA_BOOTSTRAP_SERVERS: the broker at {closed} did not answer" in line, name


def test_up_keeps_its_terminal_for_people_and_its_json_log_in_its_file(tmp_path):
    """``up`` ends right after its take-over (the PostgreSQL port taken): no server starts, yet
    the malformed stack record it sets aside is a warning, one line on the terminal for a person
    and a JSON line in the log file whose path it printed once."""
    home = tmp_path / "home"
    home.mkdir()
    (home / "up.json").write_bytes(b"{not json")
    env = up_env(home)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", int(env["REMINDER_EMBEDDED_PG_PORT"])))
        taken.listen(1)
        result = run_cli("up", "--no-demo", env=env)

    assert result.returncode == 1, result.stderr
    log_file = home / "logs" / "up.log"
    assert result.stdout.count(f"Log: {log_file}") == 1, result.stdout
    terminal = result.stdout.splitlines() + result.stderr.splitlines()
    assert not [line for line in terminal if line.startswith("{")], terminal
    [warning] = [line for line in result.stderr.splitlines() if "set aside" in line]
    assert warning.startswith("reminder-pipeline: warning: ") and "up.json.bad-" in warning
    [error] = [line for line in result.stderr.splitlines() if "error:" in line]
    assert "already in use" in error
    logged = [json.loads(line) for line in log_file.read_text().splitlines()]
    assert [line["level"] for line in logged if "set aside" in line["msg"]] == ["WARNING"]
