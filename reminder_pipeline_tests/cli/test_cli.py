"""The command line against real servers: a cycle, its exit codes, and every refusal.

Each command runs as a subprocess, as an operator would run it: the output it prints, the exit
code it returns (0 done, 1 runtime failure, 2 bad usage or config, 3 partial publish) and what is
in the database afterwards (a refused command changed nothing).
"""

from __future__ import annotations

import getpass
import json
import os
import signal
import subprocess
import sys
import urllib.request
import uuid
from datetime import timedelta

import psycopg
import pytest
import sqlalchemy as sa
from sqlalchemy.engine import make_url

from reminder_pipeline.local.servers import free_port
from reminder_pipeline.store import migrate
from reminder_pipeline.store.tables import outbox

from ..support import (
    POISON_KIND,
    SERVER_VARIABLES,
    error_lines,
    make_due_event,
    outbox_rows,
    reminders,
    run_cli,
    utcnow,
)
from .produce_refusing_broker import produce_refusing_broker


def log_records(result: subprocess.CompletedProcess[str]) -> list[dict]:
    """The JSON log lines on stderr."""
    return [json.loads(line) for line in result.stderr.splitlines() if line.startswith("{")]


@pytest.fixture
def cli_env(database_url, kafka_settings, tmp_path):
    return {
        "DATABASE_URL": database_url,
        "KAFKA_BOOTSTRAP_SERVERS": kafka_settings.bootstrap_servers,
        "REMINDER_PIPELINE_HOME": str(tmp_path / "home"),
    }


# --- a cycle -----------------------------------------------------------------------------------


def test_dispatch_prints_the_cycle_counts_as_text_and_as_json(engine, cli_env):
    first = make_due_event(engine)
    result = run_cli("dispatch", env=cli_env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("dispatch cycle: sent=1 ")
    assert "published=1" in result.stdout
    assert reminders(engine, first)[0]["status"] == "Sent"

    second = make_due_event(engine)
    result = run_cli("dispatch", "--json", "--batch-size", "5", env=cli_env)
    assert result.returncode == 0, result.stderr
    counts = json.loads(result.stdout)
    assert (counts["sent"], counts["published"], counts["batch_size"]) == (1, 1, 5)
    assert reminders(engine, second)[0]["status"] == "Sent"


def test_dispatch_never_migrates_and_names_the_step_that_does(pg_admin_url, cli_env):
    name = f"rp_empty_{uuid.uuid4().hex[:8]}"
    admin = (
        make_url(pg_admin_url).set(drivername="postgresql").render_as_string(hide_password=False)
    )
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    empty_url = make_url(pg_admin_url).set(database=name).render_as_string(hide_password=False)
    try:
        result = run_cli("dispatch", env={**cli_env, "DATABASE_URL": empty_url})
        assert result.returncode == 1
        [error] = error_lines(result)
        assert "reminder-pipeline db upgrade" in error and "empty database" in error
        engine = sa.create_engine(make_url(empty_url).set(drivername="postgresql+psycopg"))
        try:
            assert migrate.current_revision(engine) is None
            assert sa.inspect(engine).get_table_names() == []
        finally:
            engine.dispose()
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_a_broker_that_takes_no_message_is_a_partial_publish_exit_3(engine, cli_env, tmp_path):
    live = make_due_event(engine)
    with produce_refusing_broker(tmp_path / "broker") as servers:
        env = {**cli_env, "KAFKA_BOOTSTRAP_SERVERS": servers}
        result = run_cli("dispatch", "--json", "--budget-seconds", "1", env=env)
        assert result.returncode == 3, result.stderr
        counts = json.loads(result.stdout)
        assert (counts["sent"], counts["published"]) == (1, 0) and counts["publish_failed"] >= 1
        assert reminders(engine, live)[0]["status"] == "Sent"  # written; the outbox keeps it
        [row] = outbox_rows(engine)
        assert row["published_at"] is None and row["publish_attempts"] >= 1

        relay = run_cli("relay", "--budget-seconds", "1", env=env)
        assert relay.returncode == 3 and "published=0 failed=" in relay.stdout, relay.stderr
    assert outbox_rows(engine)[0]["published_at"] is None

    published = run_cli("relay", env=cli_env)  # the real broker: nothing was lost
    assert published.returncode == 0 and "published=1" in published.stdout


# --- settings and options: exit 2, one line naming the value, nothing dispatched ---------------


@pytest.mark.parametrize(
    ("args", "override", "named"),
    [
        ((), {"REMINDER_BATCH_SIZE": "lots"}, "REMINDER_BATCH_SIZE='lots' is not an integer"),
        ((), {"REMINDER_BATCH_SIZE": "-1"}, "REMINDER_BATCH_SIZE=-1 is out of range"),
        ((), {"REMINDER_CYCLE_BUDGET_SECONDS": "nan"}, "REMINDER_CYCLE_BUDGET_SECONDS=nan"),
        ((), {"KAFKA_SECURITY_PROTOCOL": "QUANTUM"}, "KAFKA_SECURITY_PROTOCOL"),
        ((), {"DATABASE_URL": "sqlite:///x.db"}, "DATABASE_URL"),
        (("--batch-size", "0"), {}, "--batch-size=0 is out of range [1, 10000]"),
        (("--batch-size", "-5"), {}, "--batch-size=-5 is out of range"),
        (("--batch-size", "2.5"), {}, "--batch-size='2.5' is not an integer"),
        (("--max-batches", "0"), {}, "--max-batches=0 is out of range"),
        (("--budget-seconds", "nan"), {}, "--budget-seconds=nan is not a finite number"),
        (("--budget-seconds", "inf"), {}, "--budget-seconds=inf is not a finite number"),
        (("--budget-seconds", "0"), {}, "--budget-seconds=0 is out of range"),
        (("--as-of", "2999-01-01T00:00:00Z"), {}, "is in the future"),
        (("--as-of", "yesterday"), {}, "--as-of='yesterday' is not an ISO-8601 timestamp"),
        (("--as-of", "2026-01-01T00:00:00"), {}, "has no time zone"),
        (("--bach-size", "5"), {}, "No such option '--bach-size'"),
    ],
)
def test_bad_values_exit_2_with_one_line_and_nothing_dispatched(
    engine, cli_env, args, override, named
):
    event_id = make_due_event(engine)
    result = run_cli("dispatch", *args, env={**cli_env, **override})
    assert result.returncode == 2
    [error] = error_lines(result)
    assert named in error, result.stderr
    assert "Traceback" not in result.stderr
    assert reminders(engine, event_id)[0]["status"] == "Pending"
    assert outbox_rows(engine) == []


@pytest.mark.parametrize(
    ("override", "setting"),
    [
        (
            {"DATABASE_URL": "postgresql+psycopg://nobody:hunter2@127.0.0.1:{port}/nothing"},
            "DATABASE_URL",
        ),
        ({"KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:{port}"}, "KAFKA_BOOTSTRAP_SERVERS"),
    ],
)
def test_a_server_that_is_down_exits_1_naming_its_setting_without_its_password(
    engine, cli_env, override, setting
):
    event_id = make_due_event(engine)
    port = str(free_port())  # nothing listens there
    env = {**cli_env, **{k: v.replace("{port}", port) for k, v in override.items()}}
    result = run_cli("dispatch", env=env)
    assert result.returncode == 1
    [error] = error_lines(result)
    assert setting in error and port in error
    assert "hunter2" not in result.stderr + result.stdout
    assert reminders(engine, event_id)[0]["status"] == "Pending"


def test_version_and_help_show_each_options_default_and_variable(cli_env):
    version = run_cli("--version", env=cli_env)
    assert version.returncode == 0 and version.stdout.startswith("reminder-pipeline ")
    help_text = " ".join(run_cli("dispatch", "--help", env=cli_env).stdout.split())
    assert "env var: REMINDER_BATCH_SIZE; default: 200" in help_text
    assert "env var: REMINDER_CYCLE_BUDGET_SECONDS; default: 30.0" in help_text


# --- destructive commands ----------------------------------------------------------------------


def _audit(result: subprocess.CompletedProcess[str]) -> dict:
    """The action's outcome line, after its line naming who, what and the target before it."""
    before, after = [r for r in log_records(result) if "operator" in r]
    assert before["logger"] == after["logger"] == "reminder_pipeline.audit"
    assert (before["phase"], after["phase"]) == ("before", "after")
    assert before["operator"] == after["operator"] and before["action"] == after["action"]
    return after


def test_poison_rows_can_be_listed_retried_and_skipped_each_logged_with_the_operator(
    engine, cli_env
):
    poison = make_due_event(engine, kind=POISON_KIND)
    assert run_cli("dispatch", env=cli_env).returncode == 0
    [row] = reminders(engine, poison)
    listed = run_cli("poison", "list", "--json", env=cli_env)
    [item] = json.loads(listed.stdout)
    assert item["id"] == str(row["id"]) and "Kind" in item["last_error"]
    assert str(row["id"]) in run_cli("poison", "list", env=cli_env).stdout  # the text table

    retry = run_cli("poison", "retry", str(row["id"]), env=cli_env)
    assert retry.returncode == 0 and reminders(engine, poison)[0]["next_attempt_at"] is None
    audit = _audit(retry)
    assert (audit["operator"], audit["action"], audit["reminder_id"], audit["changed"]) == (
        getpass.getuser(),
        "poison retry",
        str(row["id"]),
        True,
    )

    skip = run_cli("poison", "skip", str(row["id"]), env=cli_env)
    assert skip.returncode == 0
    assert reminders(engine, poison)[0]["status"] == "Skipped"
    assert _audit(skip)["action"] == "poison skip"
    assert outbox_rows(engine) == []
    again = run_cli("poison", "skip", str(row["id"]), env=cli_env)
    assert again.returncode == 1
    [error] = error_lines(again)
    assert "it is Skipped, not Pending" in error


@pytest.mark.parametrize("action", ["retry", "skip"])
def test_poison_actions_refuse_a_row_that_never_failed_unless_forced(engine, cli_env, action):
    healthy = make_due_event(engine)
    [row] = reminders(engine, healthy)

    refused = run_cli("poison", action, str(row["id"]), env=cli_env)
    assert refused.returncode == 1
    [error] = error_lines(refused)
    assert "has not failed" in error and "--force" in error
    assert _audit(refused)["changed"] is False
    assert reminders(engine, healthy)[0] == row  # untouched

    forced = run_cli("poison", action, str(row["id"]), "--force", env=cli_env)
    assert forced.returncode == 0
    assert _audit(forced)["forced"] is True
    expected = "Skipped" if action == "skip" else "Pending"
    assert reminders(engine, healthy)[0]["status"] == expected


def test_poison_actions_refuse_an_unknown_row_and_a_malformed_id(engine, cli_env):
    unknown = run_cli("poison", "skip", str(uuid.uuid4()), env=cli_env)
    assert unknown.returncode == 1 and "no such reminder" in error_lines(unknown)[0]
    malformed = run_cli("poison", "retry", "42", env=cli_env)
    assert malformed.returncode == 2 and "REMINDER_ID='42' is not a reminder id" in malformed.stderr


def _published_row(engine, hours_ago: float) -> None:
    with engine.begin() as conn:
        conn.execute(
            sa.insert(outbox).values(
                topic="t",
                message_key="k",
                payload={},
                published_at=utcnow() - timedelta(hours=hours_ago),
            )
        )


@pytest.mark.parametrize("hours", ["0", "0.5", "-1", "nan"])
def test_outbox_purge_refuses_a_retention_under_one_hour(engine, cli_env, hours):
    _published_row(engine, hours_ago=2)
    result = run_cli("outbox", "purge", "--retention-hours", hours, env=cli_env)
    assert result.returncode == 2
    [error] = error_lines(result)
    assert error.startswith(f"reminder-pipeline: error: --retention-hours={hours}")
    assert len(outbox_rows(engine)) == 1


def test_outbox_purge_deletes_only_rows_past_the_retention_and_is_logged(engine, cli_env):
    _published_row(engine, hours_ago=3)
    _published_row(engine, hours_ago=0.5)
    result = run_cli("outbox", "purge", "--retention-hours", "1", "--json", env=cli_env)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["deleted"] == 1
    assert len(outbox_rows(engine)) == 1
    audit = _audit(result)
    assert (audit["action"], audit["deleted"], audit["operator"]) == (
        "outbox purge",
        1,
        getpass.getuser(),
    )


def test_db_downgrade_needs_a_revision_and_yes(engine, cli_env):
    head = migrate.head_revision()
    missing = run_cli("db", "downgrade", env=cli_env)
    assert missing.returncode == 2 and "Missing argument 'REVISION'" in error_lines(missing)[0]
    unconfirmed = run_cli("db", "downgrade", "base", env=cli_env)
    assert unconfirmed.returncode == 2 and "add --yes to confirm" in error_lines(unconfirmed)[0]
    assert migrate.current_revision(engine) == head

    done = run_cli("db", "downgrade", "base", "--yes", env=cli_env)
    assert done.returncode == 0, done.stderr
    assert migrate.current_revision(engine) is None
    audit = _audit(done)
    assert (audit["action"], audit["from_revision"], audit["operator"]) == (
        "db downgrade",
        head,
        getpass.getuser(),
    )

    upgraded = run_cli("db", "upgrade", "--json", env=cli_env)
    assert upgraded.returncode == 0
    assert json.loads(upgraded.stdout) == {"current": head, "head": head}


@pytest.mark.parametrize("revision", ["+1", "nosuch", "-99"])
def test_db_downgrade_of_a_bad_revision_is_exit_2_with_one_line(engine, cli_env, revision):
    head = migrate.head_revision()
    result = run_cli("db", "downgrade", revision, "--yes", env=cli_env)
    assert result.returncode == 2, result.stderr
    [error] = error_lines(result)
    assert error.startswith(f"reminder-pipeline: error: db downgrade {revision}: ")
    assert "Traceback" not in result.stderr
    assert migrate.current_revision(engine) == head


def test_db_downgrade_that_changes_nothing_says_so(engine, cli_env):
    head = migrate.head_revision()
    result = run_cli("db", "downgrade", "heads", "--yes", env=cli_env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == (
        f"nothing to downgrade: the database is already at {head} (heads)"
    )
    audit = _audit(result)
    assert (audit["msg"], audit["changed"], audit["to_revision"]) == (
        "schema unchanged",
        False,
        head,
    )


def test_an_outbox_purge_that_fails_midway_has_logged_its_audit_line_before(engine, cli_env):
    _published_row(engine, hours_ago=3)
    # Its DELETE fails in the database: the purge started and did not finish.
    with engine.begin() as conn:
        conn.exec_driver_sql(
            "CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS "
            "$$ BEGIN RAISE EXCEPTION 'refused by the test'; END $$"
        )
        conn.exec_driver_sql(
            "CREATE TRIGGER refuse BEFORE DELETE ON outbox FOR EACH ROW EXECUTE FUNCTION refuse()"
        )
    result = run_cli("outbox", "purge", "--retention-hours", "1", env=cli_env)
    assert result.returncode == 1, result.stderr
    audit = [r for r in log_records(result) if r["logger"] == "reminder_pipeline.audit"]
    assert [(r["msg"], r["phase"]) for r in audit] == [
        ("outbox purge requested", "before"),
        ("outbox purge failed", "failed"),
    ]
    assert audit[0]["operator"] == getpass.getuser() and audit[0]["retention_hours"] == 1
    assert len(outbox_rows(engine)) == 1


def test_services_start_prints_the_urls_with_their_passwords_masked(tmp_path):
    env = {
        "DATABASE_URL": "postgresql+psycopg://app:hunter2@db.example:5432/calendar",
        "DAGSTER_PG_URL": "postgresql+psycopg2://dagster:hunter3@db.example:5432/dagster",
        "KAFKA_BOOTSTRAP_SERVERS": "kafka.example:9092",
        "REMINDER_PIPELINE_HOME": str(tmp_path / "home"),
    }
    for args in (("services", "start"), ("services", "start", "--json")):
        result = run_cli(*args, env=env)  # both servers are named: nothing is started
        assert result.returncode == 0, result.stderr
        assert "hunter" not in result.stdout + result.stderr
        assert "postgresql+psycopg://app:***@db.example:5432/calendar" in result.stdout
        assert "postgresql+psycopg2://dagster:***@db.example:5432/dagster" in result.stdout
    assert not (tmp_path / "home").exists()


def test_metrics_serves_the_endpoint_until_sigterm(engine, cli_env):
    port = free_port()
    base = {k: v for k, v in os.environ.items() if k not in SERVER_VARIABLES}
    proc = subprocess.Popen(
        [sys.executable, "-m", "reminder_pipeline.cli", "metrics", "--port", str(port)],
        env={**base, **cli_env},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = proc.stdout.readline()  # printed once it listens
        assert line.strip() == f"Prometheus metrics: http://127.0.0.1:{port}/metrics", line
        with urllib.request.urlopen(line.split()[-1], timeout=30) as response:
            assert b"calendar_reminder_dispatch_backlog" in response.read()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()


def test_consume_once_prints_the_notifications_of_a_dispatched_reminder(engine, cli_env, tmp_path):
    event_id = make_due_event(engine)
    assert run_cli("dispatch", env=cli_env).returncode == 0
    [row] = reminders(engine, event_id)
    result = run_cli(
        "consume",
        "--once",
        "--group-id",
        f"cli-test-{uuid.uuid4().hex[:8]}",
        "--dedup-path",
        str(tmp_path / "dedup.sqlite"),
        env=cli_env,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert f"reminder={row['id']}" in result.stdout


def test_a_catch_up_drain_prints_progress_lines_on_stderr(engine, cli_env):
    """Rows done, rows/s and the backlog left, on stderr (stdout stays the command's data)."""
    for minutes in range(1, 8):
        make_due_event(engine, minutes_overdue=minutes)
    result = run_cli(
        "--progress-seconds",
        "0",
        "dispatch",
        "--batch-size",
        "2",
        "--max-batches",
        "10",
        "--json",
        env=cli_env,
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["sent"] == 7
    lines = [line for line in result.stderr.splitlines() if "drain:" in line]
    assert [line.split("drain: ")[1].split(" rows done")[0] for line in lines] == [
        "2",
        "4",
        "6",
        "7",
    ]
    assert lines[0].endswith(")") and "rows/s, 5 left" in lines[0]
    assert "0 left" in lines[-1]
