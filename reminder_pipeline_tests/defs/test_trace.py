"""``reminder-pipeline trace`` and the ``reminder_trace`` job on the real database and broker.

A reminder written by a real Dagster run (``reminder_dispatch`` in process) is traced from the
command line: the run named is that run, its UI address is built from DAGSTER_WEBSERVER_PORT, and
the partition and offset recorded are where the message is (read back from the broker at exactly
that position). A skipped reminder says why, a poison row says it is backing off, an event's id
traces every reminder of it, a re-publish is listed with where its copy landed, the consumer's
de-duplication store is read when given, and an unknown id is exit 1 in one line. The job shows
the same answer as one card per reminder (Markdown: fields down the page, the run as a link).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from dagster import DagsterInstance, instance_for_test

from reminder_pipeline import cycle
from reminder_pipeline.consumer.dedup import SqliteDedupStore
from reminder_pipeline.defs.jobs import reminder_dispatch
from reminder_pipeline.defs.resources import PostgresResource
from reminder_pipeline.defs.trace import reminder_trace
from reminder_pipeline.domain import contract
from reminder_pipeline.operator_jobs import republish
from reminder_pipeline.operator_jobs.republish import HEADER_REPUBLISHED_BY_RUN
from reminder_pipeline_tests.support import (
    PII_DESCRIPTION,
    PII_LOCATION,
    PII_TITLE,
    POISON_KIND,
    error_lines,
    make_due_event,
    message_at,
    publish_two_days,
    reminders,
    run_cli,
)

from .helpers import instance_overrides, log_messages, resources_for

UI_PORT = "3123"
ISSUE_FIELDS = (
    "reminder_id",
    "event_id",
    "status",
    "due_at",
    "sent_at",
    "reason",
    "run_id",
    "run_url",
    "published_at",
    "partition",
    "offset",
)


@pytest.fixture
def instance() -> Iterator[DagsterInstance]:
    """A throwaway instance with the shipped python_logs settings."""
    with instance_for_test(overrides=instance_overrides()) as instance:
        yield instance


@pytest.fixture
def cli_env(database_url, kafka_settings, tmp_path):
    return {
        "DATABASE_URL": database_url,
        "KAFKA_BOOTSTRAP_SERVERS": kafka_settings.bootstrap_servers,
        "REMINDER_PIPELINE_HOME": str(tmp_path / "home"),
        "DAGSTER_WEBSERVER_PORT": UI_PORT,
    }


def _trace(*args: str, env: dict[str, str]) -> list[dict]:
    result = run_cli("trace", *args, "--json", env=env)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)["reminders"]


def _headers(msg) -> dict[str, str]:
    return {k: v.decode() for k, v in (msg.headers() or [])}


def test_a_sent_reminder_names_the_dagster_run_that_wrote_it_and_where_its_message_is(
    engine, database_url, kafka_settings, instance, cli_env
):
    event_id = make_due_event(engine, offsets=(60, 30), minutes_overdue=40)
    run = reminder_dispatch.execute_in_process(
        instance=instance, resources=resources_for(database_url, kafka_settings)
    )
    assert run.success
    sent = {str(r["id"]) for r in reminders(engine, event_id)}

    traced = _trace(str(event_id), env=cli_env)  # an EventId: every reminder of it

    assert {r["reminder_id"] for r in traced} == sent and len(traced) == 2
    for item in traced:
        assert set(ISSUE_FIELDS) <= set(item)
        assert item["event_id"] == str(event_id) and item["status"] == "Sent"
        assert item["run_id"] == run.run_id  # a real Dagster run
        assert instance.get_run_by_id(item["run_id"]) is not None
        assert item["run_url"] == f"http://127.0.0.1:{UI_PORT}/runs/{run.run_id}"
        assert item["published_at"] and item["sent_at"] and item["due_at"]
        assert item["reason"].startswith("sent at ") and "published at" in item["reason"]
        assert f" by Dagster run {run.run_id}; " in item["reason"] and item["moved_by"] == "dagster"
        assert item["failed_publish_attempts"] == 0 and item["republishes"] == []
        assert "delivered" not in item  # no store given
        assert item["owner_user_id"] and item["tenant_id"]  # whose it is: ids to pivot on
        msg = message_at(kafka_settings, item["partition"], item["offset"])
        assert _headers(msg)[contract.HEADER_REMINDER_ID] == item["reminder_id"]
        assert json.loads(msg.value())["ReminderId"] == item["reminder_id"]
        assert msg.key().decode() == str(event_id)

    [one] = _trace(traced[0]["reminder_id"], env=cli_env)  # a ReminderId: that one
    assert one == traced[0]
    text = run_cli("trace", one["reminder_id"], env=cli_env)
    assert text.returncode == 0
    assert f"run_id={one['run_id']}" not in text.stdout  # text, not key=value
    assert one["run_url"] in text.stdout and f"offset={one['offset']}" in text.stdout
    assert not any(pii in text.stdout for pii in (PII_TITLE, PII_DESCRIPTION, PII_LOCATION))


def test_a_skipped_reminder_says_the_event_was_cancelled(engine, publisher, cli_env):
    event_id = make_due_event(engine, status="Cancelled")
    report = cycle.run_cycle(engine, publisher)
    assert report.counts.skipped == 1

    [item] = _trace(str(event_id), env=cli_env)

    assert item["status"] == "Skipped"  # issue 35: when and by what (a cycle, not a Dagster run)
    assert item["reason"].startswith("skipped at ")
    assert item["reason"].endswith(
        f" by a cycle called in process (run id {report.run_id}, no Dagster run): "
        "the event was Cancelled"
    )
    assert item["run_id"] == report.run_id and item["run_url"] is None
    assert item["partition"] is None


def test_a_poison_row_is_backing_off_with_its_last_error_and_next_attempt(
    engine, publisher, cli_env
):
    event_id = make_due_event(engine, kind=POISON_KIND)
    assert cycle.run_cycle(engine, publisher).counts.failed == 1
    [row] = reminders(engine, event_id)

    [item] = _trace(str(row["id"]), env=cli_env)

    next_at = row["next_attempt_at"].astimezone(UTC).isoformat(timespec="seconds")
    assert item["status"] == "Pending" and item["attempts"] == 1
    assert item["reason"].startswith("backing off after 1 failures (last error: ")
    assert "Kind" in item["reason"] and item["reason"].endswith(f"next attempt at {next_at}")
    assert item["published_at"] is None and item["run_id"] is None


def test_a_reminder_not_yet_due_says_so(engine, cli_env):
    event_id = make_due_event(engine, minutes_overdue=-30)
    [item] = _trace(str(event_id), env=cli_env)
    assert item["status"] == "Pending" and item["reason"].startswith("not due yet (due at ")


def test_an_unknown_id_is_exit_1_in_one_line_and_a_bad_one_exit_2(engine, cli_env):
    unknown = str(uuid.uuid4())
    result = run_cli("trace", unknown, "--json", env=cli_env)
    assert result.returncode == 1 and result.stdout == ""
    assert error_lines(result) == [
        f"reminder-pipeline: error: trace: no reminder, event or outbox message has the id "
        f"{unknown}; a reminder deleted before it was sent leaves no row"
    ]
    bad = run_cli("trace", "42", env=cli_env)
    assert bad.returncode == 2 and "ID='42' is not a reminder or event id" in bad.stderr


def test_the_consumers_store_says_whether_it_was_delivered(engine, publisher, cli_env, tmp_path):
    delivered, pending = make_due_event(engine), make_due_event(engine)
    cycle.run_cycle(engine, publisher)
    [done], [other] = reminders(engine, delivered), reminders(engine, pending)
    path = tmp_path / "dedup.sqlite"
    with SqliteDedupStore(path) as store:  # what the consumer writes once it delivered
        store.mark_handled(done["id"], delivered)

    [yes] = _trace(str(done["id"]), "--dedup-path", str(path), env=cli_env)
    [no] = _trace(str(other["id"]), "--dedup-path", str(path), env=cli_env)
    assert (yes["delivered"], no["delivered"]) == (True, False)

    # A file that is not there is a state of this host, exit 1 as docs/cli.md says (it was 2).
    missing = run_cli("trace", str(done["id"]), "--dedup-path", str(tmp_path / "no"), env=cli_env)
    assert missing.returncode == 1 and missing.stdout == ""
    assert error_lines(missing) == [
        f"reminder-pipeline: error: trace: --dedup-path: {tmp_path / 'no'} is not a file (the "
        "consumer's SQLite store)"
    ]
    assert not (tmp_path / "no").exists()  # never created empty


def test_given_no_store_the_trace_asks_the_one_consume_writes_here(
    engine, publisher, cli_env, tmp_path
):
    """The local stack's consumer keeps its store under REMINDER_PIPELINE_HOME, a path no
    command printed: the trace finds it by itself (``services status`` shows it too)."""
    event_id = make_due_event(engine)
    cycle.run_cycle(engine, publisher)
    [done] = reminders(engine, event_id)
    [before] = _trace(str(done["id"]), env=cli_env)
    assert "delivered" not in before  # nothing written yet: nothing asked, nothing created
    assert not (tmp_path / "home").exists()

    status = run_cli("services", "status", "--json", env=cli_env)
    store = Path(json.loads(status.stdout)["consumer"]["dedup_path"])
    assert store == tmp_path / "home" / "notifications" / "notifications-reference.dedup.sqlite3"
    store.parent.mkdir(parents=True)
    with SqliteDedupStore(store) as written:  # what `consume` writes once it delivered
        written.mark_handled(done["id"], event_id)

    result = run_cli("trace", str(done["id"]), "--json", env=cli_env)
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["dedup_store"] == str(store) and data["reminders"][0]["delivered"] is True
    text = run_cli("trace", str(done["id"]), env=cli_env).stdout
    assert f"delivered      yes (store: {store})" in text


def test_every_republish_is_listed_with_where_its_copy_landed(
    engine, publisher, kafka_settings, cli_env
):
    now = datetime.now(UTC)
    days = publish_two_days(engine, publisher, now, with_unpublished=False)
    day = days.days[0]
    reminder_id = days.published[day][0]
    report = republish.resend_day(
        engine, publisher, day, republish.Requester(run_id="republish-run-1")
    )
    assert report.republished == len(days.published[day])

    [item] = _trace(reminder_id, env=cli_env)

    [copy] = item["republishes"]
    assert copy["run_id"] == "republish-run-1"
    assert copy["run_url"].endswith("/runs/republish-run-1") and copy["republished_at"]
    msg = message_at(kafka_settings, copy["partition"], copy["offset"])
    assert _headers(msg)[HEADER_REPUBLISHED_BY_RUN] == "republish-run-1"
    assert json.loads(msg.value())["ReminderId"] == reminder_id
    assert (copy["partition"], copy["offset"]) != (item["partition"], item["offset"])


def test_the_trace_job_shows_the_same_answer_as_cards(
    engine, database_url, kafka_settings, instance, cli_env, monkeypatch
):
    event_id = make_due_event(engine)
    cancelled = make_due_event(engine, status="Cancelled")
    run = reminder_dispatch.execute_in_process(
        instance=instance, resources=resources_for(database_url, kafka_settings)
    )
    assert run.success
    monkeypatch.setenv("DAGSTER_WEBSERVER_PORT", UI_PORT)
    resources = {"postgres": PostgresResource(database_url=database_url)}

    result = reminder_trace.execute_in_process(
        run_config={"id": str(event_id)}, instance=instance, resources=resources
    )

    assert result.success
    output = result.output_for_node("trace_reminders")
    assert output == {"reminders": _trace(str(event_id), env=cli_env)}  # the CLI's answer
    [item] = output["reminders"]
    [event] = [
        e for e in result.all_events if e.is_successful_output and e.step_key == "trace_reminders"
    ]
    meta = event.event_specific_data.metadata
    cards = meta["trace"].value.splitlines()  # a card: the fields down the page, no table
    assert f"### Reminder {item['reminder_id']} · Sent" in cards and "reminders" not in meta
    assert f"- **Run:** [{run.run_id}]({item['run_url']})" in cards and item["run_id"] == run.run_id
    assert f"- **Partition:** {item['partition']}" in cards
    assert f"- **Offset:** {item['offset']}" in cards
    assert f"- **Why:** {item['reason']}" in cards and meta["count"].value == 1
    assert any(item["reason"] in line for line in log_messages(instance, result.run_id))

    skipped = reminder_trace.execute_in_process(
        run_config={"id": str(cancelled)}, instance=instance, resources=resources
    )
    [s] = skipped.output_for_node("trace_reminders")["reminders"]
    assert s["reason"].startswith("skipped at ")
    assert s["reason"].endswith(f" by Dagster run {run.run_id}: the event was Cancelled")

    unknown = str(uuid.uuid4())
    failed = reminder_trace.execute_in_process(
        run_config={"id": unknown}, instance=instance, resources=resources, raise_on_error=False
    )
    assert not failed.success
    [failure] = [e for e in failed.all_events if e.is_step_failure]
    assert f"no reminder, event or outbox message has the id {unknown}" in str(
        failure.step_failure_data.error.message
    )
