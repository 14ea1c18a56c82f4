"""Support plays the call "my client never got the reminder for that day", starting from the
client's user id and the day only, on the real database, broker and Dagster.

From the terminal: ``reminders --client ID --due-from DAY --due-to DAY`` finds the reminder (a
real CLI process), ``trace --json`` names the Dagster run that sent it and the partition and
offset of its message, and the broker holds that very message at that position (key = EventId,
the run id in ``correlation-id``). From the UI: the same through the jobs, launched over the
webserver's GraphQL as the Launchpad does (``reminder_find`` with the filters as config, then
``reminder_trace`` with the id it found), each run's log giving the next step's input.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
from dagster import DagsterInstance, DagsterRunStatus, instance_for_test
from dagster_graphql import DagsterGraphQLClient

from reminder_pipeline.defs.jobs import reminder_dispatch
from reminder_pipeline.local import dagster_processes as orchestrator
from reminder_pipeline.local.servers import free_port
from reminder_pipeline_tests.defs.helpers import resources_for
from reminder_pipeline_tests.support import (
    make_event_due_on,
    message_at,
    reminders,
    run_cli,
    utcnow,
)

UI_PORT = "3126"


def _a_clients_day(engine):
    """The client's reminder due yesterday at 14:00 UTC, among others of theirs and of that day."""
    day = (utcnow() - timedelta(days=1)).date()
    client = uuid.uuid4()
    wanted = make_event_due_on(engine, day, 14, client_user_id=client, kind="Showing")
    make_event_due_on(engine, day - timedelta(days=1), 14, client_user_id=client)  # another day
    make_event_due_on(engine, day, 14.5, client_user_id=uuid.uuid4())  # another client
    make_event_due_on(engine, utcnow().date() + timedelta(days=2), 10, client_user_id=client)
    return day, client, wanted


def _check_message(kafka_settings, item: dict, event_id: uuid.UUID, run_id: str) -> None:
    msg = message_at(kafka_settings, item["partition"], item["offset"])
    headers = {k: v.decode() for k, v in (msg.headers() or [])}
    assert msg.key().decode() == str(event_id)
    assert headers["correlation-id"] == run_id
    assert json.loads(msg.value())["ReminderId"] == item["reminder_id"]


def test_from_a_client_and_a_day_to_the_message_on_the_broker_in_the_terminal(
    engine, database_url, kafka_settings, tmp_path
):
    day, client, wanted = _a_clients_day(engine)
    with instance_for_test() as instance:
        run = reminder_dispatch.execute_in_process(
            instance=instance, resources=resources_for(database_url, kafka_settings)
        )
    assert run.success
    env = {
        "DATABASE_URL": database_url,
        "KAFKA_BOOTSTRAP_SERVERS": kafka_settings.bootstrap_servers,
        "REMINDER_PIPELINE_HOME": str(tmp_path / "home"),
        "DAGSTER_WEBSERVER_PORT": UI_PORT,
    }
    the_day = ("--client", str(client), "--due-from", day.isoformat(), "--due-to", day.isoformat())

    text = run_cli("reminders", *the_day, env=env)
    assert text.returncode == 0, text.stderr
    [line] = text.stdout.splitlines()[1:]  # under the header, one reminder, no next page
    found = run_cli("reminders", *the_day, "--json", env=env)
    assert found.returncode == 0, found.stderr
    data = json.loads(found.stdout)
    [item] = data["reminders"]
    assert data["next"] is None and item["event_id"] == str(wanted)
    assert line.split()[:5] == [item["reminder_id"], str(wanted), "Showing", item["due_at"], "Sent"]

    traced = run_cli("trace", item["reminder_id"], "--json", env=env)
    assert traced.returncode == 0, traced.stderr
    [trace] = json.loads(traced.stdout)["reminders"]
    assert trace["run_id"] == run.run_id and trace["status"] == "Sent"
    _check_message(kafka_settings, trace, wanted, run.run_id)


def _launch(client: DagsterGraphQLClient, job: str, config: dict, timeout: float = 120.0) -> str:
    """Launch ``job`` as the Launchpad does and wait for it to succeed; its run id."""
    run_id = client.submit_job_execution(job, run_config=config)
    deadline = time.monotonic() + timeout
    while (status := client.get_run_status(run_id)) not in (
        DagsterRunStatus.SUCCESS,
        DagsterRunStatus.FAILURE,
        DagsterRunStatus.CANCELED,
    ):
        assert time.monotonic() < deadline, f"{job} run {run_id} still {status} after {timeout} s"
        time.sleep(0.5)
    assert status is DagsterRunStatus.SUCCESS, f"{job} run {run_id} ended {status}"
    return run_id


def _log_lines(instance: DagsterInstance, run_id: str) -> list[str]:
    return [e.user_message for e in instance.all_logs(run_id) if e.dagster_event is None]


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:Using variable_values:DeprecationWarning")
def test_the_same_through_the_dagster_jobs_launched_over_graphql(
    engine, database_url, kafka_settings, dagster_storage_url, tmp_path: Path, monkeypatch
):
    day, client, wanted = _a_clients_day(engine)
    env = {
        "DATABASE_URL": database_url,
        "KAFKA_BOOTSTRAP_SERVERS": kafka_settings.bootstrap_servers,
        "DAGSTER_PG_URL": dagster_storage_url,
    }
    home = tmp_path / "dagster_home"
    stack = orchestrator.DagsterStack(home, env, port=free_port())
    stack.start(timeout=180)
    try:
        monkeypatch.setenv("DAGSTER_PG_URL", dagster_storage_url)
        instance = DagsterInstance.from_config(str(home))
        graphql = DagsterGraphQLClient(stack.host, port_number=stack.port)
        # A cycle sends it (the schedule may be first: whichever run it was, the trace names it).
        _launch(graphql, "reminder_catch_up", {})
        assert reminders(engine, wanted)[0]["status"] == "Sent"

        find_run = _launch(
            graphql,
            "reminder_find",
            {"client": str(client), "due_from": day.isoformat(), "due_to": day.isoformat()},
        )
        [found] = [line for line in _log_lines(instance, find_run) if line.startswith("reminder ")]
        reminder_id, event = re.fullmatch(r"reminder (\S+) event=(\S+) status=Sent", found).groups()
        assert event == str(wanted)

        trace_run = _launch(graphql, "reminder_trace", {"id": reminder_id})
        [traced] = [
            line for line in _log_lines(instance, trace_run) if line.startswith("reminder ")
        ]
        match = re.search(r"run_id=(\S+) partition=(\d+) offset=(\d+)", traced)
        assert match is not None, traced
        run_id, partition, offset = match.group(1), int(match.group(2)), int(match.group(3))
        sender = instance.get_run_by_id(run_id)
        assert sender is not None and sender.job_name in ("reminder_dispatch", "reminder_catch_up")
        item = {"reminder_id": reminder_id, "partition": partition, "offset": offset}
        _check_message(kafka_settings, item, wanted, run_id)
    finally:
        stack.stop()
