"""Bulk ``poison retry`` / ``poison skip`` by a filter, from the command line and the Dagster job.

Real poison rows (events whose Kind the contract refused, failed by real cycles, their kinds
mended since) of two kinds and
three events, one of them failed long ago, next to a healthy Pending row: a dry run lists exactly
what a filter takes and changes nothing; each filter (--all, --event, --kind, --failed-since)
takes the right rows and never a healthy one; the real run prints the count and writes one audit
line before acting and one after; a bad combination is refused in one line (exit 2) before any
read or write.
"""

from __future__ import annotations

import getpass
import json
import subprocess
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import pytest
import sqlalchemy as sa
from dagster import DagsterInstance, instance_for_test

from reminder_pipeline import cycle
from reminder_pipeline.defs.jobs import reminder_poison_rows
from reminder_pipeline.defs.resources import PostgresResource

from ..defs.helpers import instance_overrides, log_messages
from ..support import error_lines, make_due_event, reminders, run_cli

KIND_A = "Showing"
KIND_B = "Task"
#: Over the contract's 64 characters: the message cannot be built (until the kind is mended).
BAD_KIND_A = "A" * 65
BAD_KIND_B = "B" * 65


@pytest.fixture
def cli_env(database_url, kafka_settings, tmp_path):
    return {
        "DATABASE_URL": database_url,
        "KAFKA_BOOTSTRAP_SERVERS": kafka_settings.bootstrap_servers,
        "REMINDER_PIPELINE_HOME": str(tmp_path / "home"),
    }


@pytest.fixture
def rows(engine, publisher) -> SimpleNamespace:
    """Poison rows: event a1 (kind A, two reminders), a2 (kind A, failed two hours ago), b
    (kind B); and a healthy due row."""
    a1 = make_due_event(engine, kind=BAD_KIND_A, offsets=(60, 30), minutes_overdue=40)
    a2 = make_due_event(engine, kind=BAD_KIND_A)
    b = make_due_event(engine, kind=BAD_KIND_B)
    healthy = make_due_event(engine, minutes_overdue=-5)  # Pending, not due: never failed
    report = cycle.run_cycle(engine, publisher)
    assert report.counts.failed == 4
    with engine.begin() as conn:  # the calendar mends the kinds: what a retry is for
        for bad, kind in ((BAD_KIND_A, KIND_A), (BAD_KIND_B, KIND_B)):
            conn.execute(
                sa.text("UPDATE calendar_events SET kind = :kind WHERE kind = :bad"),
                {"kind": kind, "bad": bad},
            )
    with engine.begin() as conn:  # a2 failed two hours ago
        conn.execute(
            sa.text(
                "UPDATE event_reminders SET last_failed_at = now() - interval '2 hours' "
                "WHERE calendar_event_id = :e"
            ),
            {"e": a2},
        )
    ids = {e: {str(r["id"]) for r in reminders(engine, e)} for e in (a1, a2, b, healthy)}
    assert all(r["attempts"] == 1 for e in (a1, a2, b) for r in reminders(engine, e))
    return SimpleNamespace(a1=a1, a2=a2, b=b, healthy=healthy, ids=ids)


def _state(engine) -> list[dict]:
    return [
        {k: r[k] for k in ("id", "status", "next_attempt_at", "attempts", "updated_at")}
        for r in reminders(engine)
    ]


def _audit(result: subprocess.CompletedProcess[str]) -> tuple[dict, dict]:
    lines = [json.loads(x) for x in result.stderr.splitlines() if x.startswith("{")]
    audit = [r for r in lines if r.get("logger") == "reminder_pipeline.audit"]
    assert len(audit) == 2, audit
    return audit[0], audit[1]


def test_a_dry_run_lists_what_a_filter_takes_and_changes_nothing(engine, rows, cli_env):
    before = _state(engine)

    text = run_cli("poison", "skip", "--all", "--dry-run", env=cli_env)
    data = run_cli("poison", "retry", "--kind", KIND_A, "--dry-run", "--json", env=cli_env)

    assert text.returncode == 0 and data.returncode == 0
    assert text.stdout.startswith("poison skip --dry-run: 4 rows would change\n")
    assert all(i in text.stdout for e in (rows.a1, rows.a2, rows.b) for i in rows.ids[e])
    plain = json.loads(data.stdout)
    assert (plain["dry_run"], plain["count"], plain["selector"]) == (True, 3, {"kind": KIND_A})
    assert {r["id"] for r in plain["rows"]} == rows.ids[rows.a1] | rows.ids[rows.a2]
    assert _state(engine) == before  # nothing changed
    assert not [x for x in text.stderr.splitlines() if "reminder_pipeline.audit" in x]


def test_failed_since_takes_a_day_alone_and_times_print_as_iso_8601(engine, rows, cli_env):
    """``--failed-since 2026-12-07`` is that day's 00:00 UTC, as ``reminders --due-from`` takes
    it (it was refused: "no time zone"), ISO's compact day too; ``poison list`` prints times
    with ISO's ``T`` (it printed ``2026-12-07 05:35:18+00:00``), in text and JSON alike."""
    failed = {str(r["id"]): r["last_failed_at"] for r in reminders(engine) if r["attempts"]}
    day = max(failed.values()).astimezone(UTC).date()
    since_day = {i for i, at in failed.items() if at.astimezone(UTC).date() >= day}
    for given in (day.isoformat(), day.strftime("%Y%m%d")):
        result = run_cli(
            "poison", "retry", "--failed-since", given, "--dry-run", "--json", env=cli_env
        )
        assert result.returncode == 0, result.stderr
        plain = json.loads(result.stdout)
        assert plain["selector"] == {"failed_since": f"{day.isoformat()}T00:00:00+00:00"}
        assert {r["id"] for r in plain["rows"]} == since_day
        assert all("T" in r["last_failed_at"] for r in plain["rows"])

    listed = run_cli("poison", "list", "--json", env=cli_env)
    assert listed.returncode == 0, listed.stderr
    rows_listed = json.loads(listed.stdout)
    assert len(rows_listed) == 4
    for row in rows_listed:
        for name in ("next_attempt_at", "due_at"):
            assert datetime.fromisoformat(row[name]).isoformat() == row[name]  # with its "T"
    text = run_cli("poison", "list", env=cli_env).stdout
    assert all(row["due_at"] in text and row["next_attempt_at"] in text for row in rows_listed)


@pytest.mark.parametrize(
    ("args", "events"),
    [
        (("--all",), ("a1", "a2", "b")),
        (("--event", "{a1}"), ("a1",)),
        (("--kind", KIND_B), ("b",)),
        (("--failed-since", "{hour_ago}"), ("a1", "b")),
        (("--kind", KIND_A, "--failed-since", "{hour_ago}"), ("a1",)),
    ],
)
def test_each_filter_skips_exactly_its_poison_rows_audited_before_and_after(
    engine, rows, cli_env, args, events
):
    hour_ago = (datetime.now(UTC) - timedelta(hours=1)).isoformat()
    argv = [a.format(a1=rows.a1, hour_ago=hour_ago) for a in args]
    wanted = set().union(*(rows.ids[getattr(rows, e)] for e in events))

    result = run_cli("poison", "skip", *argv, "--yes", env=cli_env)

    assert result.returncode == 0, result.stderr
    assert result.stdout == f"poison skip: {len(wanted)} rows changed\n"
    skipped = {str(r["id"]) for r in reminders(engine) if r["status"] == "Skipped"}
    assert skipped == wanted
    assert reminders(engine, rows.healthy)[0]["status"] == "Pending"
    before, after = _audit(result)
    assert (before["phase"], after["phase"]) == ("before", "after")
    assert before["operator"] == after["operator"] == getpass.getuser()
    assert before["action"] == after["action"] == "poison skip"
    assert before["matching"] == len(wanted) and "changed" not in before
    assert after["changed"] == len(wanted) and set(after["reminder_ids"]) == wanted


def test_a_filtered_retry_clears_the_back_off_of_its_rows_only(engine, rows, cli_env):
    result = run_cli("poison", "retry", "--event", str(rows.b), "--yes", "--json", env=cli_env)

    assert result.returncode == 0, result.stderr
    plain = json.loads(result.stdout)
    assert (plain["dry_run"], plain["count"]) == (False, 1)
    by_id = {str(r["id"]): r for r in reminders(engine)}
    assert all(by_id[i]["next_attempt_at"] is None for i in rows.ids[rows.b])
    assert all(by_id[i]["next_attempt_at"] is not None for i in rows.ids[rows.a1])
    assert _audit(result)[1]["changed"] == 1


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("{rid}", "--all"), "give a REMINDER_ID or a filter"),
        (("{rid}", "--dry-run"), "give a REMINDER_ID or a filter"),
        ((), "needs a REMINDER_ID or a filter (--all, --event, --kind, --failed-since)"),
        (("--all",), "add --dry-run to list them, or --yes to confirm"),
        (("--all", "--kind", KIND_A, "--yes"), "--all takes every poison row"),
        (("--kind", KIND_A, "--force", "--yes"), "--force acts on one REMINDER_ID only"),
        (("--failed-since", "yesterday", "--dry-run"), "is not an ISO-8601 timestamp"),
        (("--event", "42", "--dry-run"), "is not an event id"),
        (
            ("--kind", "Nonsense", "--dry-run"),
            "--kind='Nonsense' is not an event kind (one of Showing, Consultation, Meeting, Task, "
            "BookingDeadline)",
        ),
        (("--all", "--lock-timeout", "0", "--yes"), "--lock-timeout=0 is out of range"),
    ],
)
@pytest.mark.parametrize("action", ["retry", "skip"])
def test_a_bad_selection_is_refused_in_one_line_and_changes_nothing(
    engine, rows, cli_env, action, args, says
):
    rid = sorted(rows.ids[rows.a1])[0]
    before = _state(engine)

    result = run_cli("poison", action, *[a.format(rid=rid) for a in args], env=cli_env)

    assert result.returncode == 2
    [line] = error_lines(result)
    assert says in line, line
    assert _state(engine) == before


# --- the Dagster job ------------------------------------------------------------------------------


@pytest.fixture
def instance() -> Iterator[DagsterInstance]:
    with instance_for_test(overrides=instance_overrides()) as instance:
        yield instance


def test_the_poison_job_takes_the_filter_with_a_dry_run_first(engine, rows, database_url, instance):
    resources = {"postgres": PostgresResource(database_url=database_url)}
    before = _state(engine)

    dry = reminder_poison_rows.execute_in_process(
        run_config={"action": "skip", "kind": KIND_A, "dry_run": True},
        instance=instance,
        resources=resources,
    )
    assert dry.success and _state(engine) == before
    plain = dry.output_for_node("poison_rows")
    assert (plain["dry_run"], plain["count"]) == (True, 3)

    done = reminder_poison_rows.execute_in_process(
        run_config={"action": "skip", "event_id": str(rows.a1)},
        instance=instance,
        resources=resources,
    )
    assert done.success
    assert done.output_for_node("poison_rows")["count"] == 2
    assert {str(r["id"]) for r in reminders(engine) if r["status"] == "Skipped"} == rows.ids[
        rows.a1
    ]
    lines = log_messages(instance, done.run_id)
    assert any("poison rows skip requested" in x and "matching=2" in x for x in lines), lines
    assert any("poison rows skip" in x and "changed=2" in x for x in lines)

    with pytest.raises(Exception, match="kind='Nonsense' is not an event kind \\(one of Showing"):
        reminder_poison_rows.execute_in_process(
            run_config={"action": "skip", "kind": "Nonsense", "dry_run": True},
            instance=instance,
            resources=resources,
        )
    with pytest.raises(Exception, match="not both"):
        reminder_poison_rows.execute_in_process(
            run_config={"action": "retry", "reminder_id": str(rows.healthy), "all": True},
            instance=instance,
            resources=resources,
        )


# --- another session's row lock, and --json on one row (issue 35) -------------------------------


def test_a_bulk_action_behind_another_sessions_row_lock_gives_up_naming_the_rows(
    engine, rows, cli_env
):
    """A row held by another session: the action waits --lock-timeout, changes nothing and
    names the row in one line (it used to wait silently as long as the lock was held)."""
    held = sorted(rows.ids[rows.b])[0]
    before = _state(engine)
    with engine.connect() as other:
        other.execute(
            sa.text("SELECT id FROM event_reminders WHERE id = :id FOR UPDATE"), {"id": held}
        )
        result = run_cli("poison", "skip", "--all", "--yes", "--lock-timeout", "0.5", env=cli_env)
        other.rollback()
    assert result.returncode == 1, result.stderr
    [line] = error_lines(result)
    assert line == (
        f"reminder-pipeline: error: poison skip: nothing changed: 1 rows held by another "
        f"session ({held}) could not be taken within 0.5s; run it again once that session ends"
    )
    assert result.stdout == ""
    assert _state(engine) == before
    audit = [json.loads(x) for x in result.stderr.splitlines() if x.startswith("{")]
    [failed] = [r for r in audit if r.get("phase") == "failed"]
    assert failed["error"] == "RowsLocked" and failed["reminder_ids"] == [held]


def test_one_rows_action_behind_another_sessions_lock_gives_up_naming_it(engine, rows, cli_env):
    """``poison skip ID --lock-timeout`` on a row another session holds changes nothing within
    its lock timeout, says so in one line naming the row, exit 1, and ``--json`` prints the
    action object (it waited for the statement timeout, printed a database error and nothing on
    stdout). A filter's refusal prints its action object too."""
    held = sorted(rows.ids[rows.b])[0]
    before = _state(engine)
    with engine.connect() as other:
        other.execute(
            sa.text("SELECT id FROM event_reminders WHERE id = :id FOR UPDATE"), {"id": held}
        )
        one = run_cli("poison", "skip", held, "--lock-timeout", "0.5", "--json", env=cli_env)
        text = run_cli("poison", "retry", held, "--lock-timeout", "0.5", env=cli_env)
        bulk = run_cli(
            "poison", "retry", "--all", "--yes", "--lock-timeout", "0.5", "--json", env=cli_env
        )
        other.rollback()
    held_words = (
        "its row is held by another session and could not be taken within 0.5s; run it again "
        "once that session ends"
    )
    assert one.returncode == 1
    assert json.loads(one.stdout) == {
        "action": "skip",
        "reminder_id": held,
        "changed": False,
        "forced": False,
        "reason": held_words,
    }
    assert error_lines(one) == [
        f"reminder-pipeline: error: poison skip {held}: nothing changed: {held_words}"
    ]
    assert (text.returncode, text.stdout) == (1, "")
    assert error_lines(text) == [
        f"reminder-pipeline: error: poison retry {held}: nothing changed: {held_words}"
    ]
    assert bulk.returncode == 1
    refused = json.loads(bulk.stdout)
    assert (refused["action"], refused["dry_run"], refused["count"]) == ("retry", False, 0)
    assert (refused["selector"], refused["rows"], refused["locked"]) == ({"all": True}, [], [held])
    assert refused["reason"] == error_lines(bulk)[0].removeprefix("reminder-pipeline: error: ")
    assert _state(engine) == before


@pytest.mark.parametrize("action", ["retry", "skip"])
def test_one_rows_retry_and_skip_print_json_with_json(engine, rows, cli_env, action):
    rid = sorted(rows.ids[rows.a1])[0]
    done = run_cli("poison", action, rid, "--json", env=cli_env)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {
        "action": action,
        "reminder_id": rid,
        "changed": True,
        "forced": False,
        "reason": None,
    }
    healthy = str(reminders(engine, rows.healthy)[0]["id"])
    refused = run_cli("poison", action, healthy, "--json", env=cli_env)
    assert refused.returncode == 1
    plain = json.loads(refused.stdout)
    assert (plain["changed"], plain["reminder_id"]) == (False, healthy)
    assert plain["reason"] == "it has not failed (attempts=0); --force acts on any Pending row"
    assert len(error_lines(refused)) == 1
