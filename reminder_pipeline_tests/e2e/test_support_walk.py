"""Support's walk on the local stack: from a person's id and a day, ``reminders`` then ``trace``
answer "did they get it, when, through which run, partition and offset, and was it delivered",
with nothing typed that no command printed.

The local stack as a newcomer has it, in subprocesses under their own home and free ports:
``up --once`` (the embedded PostgreSQL and broker, the schema, the demo's reminders due now, a
first cycle; the servers stay up), ``demo --overdue 3`` and ``dispatch`` (more sent, should the
first cycle's few all have been cancelled at once), and ``consume --once`` (the reference
consumer delivers them into its store under the home). Then support, knowing only what the
commands print:

1. ``reminders --status Sent`` prints sent reminders with whose they are: a person's id (the
   identity service gives support the same id for the person who calls) and a due day;
2. ``reminders --owner ID --due-from DAY --due-to DAY`` lists that person's reminders of the day;
3. ``trace ID`` says Sent at when, by which run (a command's cycle: its run id, no Dagster
   run), at which partition and offset (the broker holds that very message there) and
   delivered, asked of the consumer's store it found by itself: the path ``services status``
   prints, which nobody typed.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest

from reminder_pipeline.config import KafkaSettings
from reminder_pipeline_tests.support import message_at, run_cli, up_env

pytestmark = pytest.mark.slow

#: The columns of ``reminders``' text, before the reason (words with spaces, last).
COLUMNS = (
    "reminder_id",
    "event_id",
    "kind",
    "due_at",
    "status",
    "owner_user_id",
    "client_user_id",
    "tenant_id",
)


@pytest.fixture
def local_stack(tmp_path: Path) -> Iterator[dict[str, str]]:
    """The environment of a local stack that has sent and delivered reminders; stopped after."""
    env = up_env(tmp_path / "home")
    try:
        for args in (("up", "--once"), ("demo", "--overdue", "3"), ("dispatch",)):
            done = run_cli(*args, env=env)
            assert done.returncode == 0, (args, done.stderr[-2000:])
        consumed = run_cli("consume", "--once", env=env)
        assert consumed.returncode == 0, consumed.stderr[-2000:]
        assert "reminder=" in consumed.stdout  # it delivered some
        yield env
    finally:
        run_cli("services", "stop", env=env)


def _rows(text: str) -> list[dict[str, str]]:
    """``reminders``' text lines as their columns (the header checked, the reason left out)."""
    header, *lines = text.splitlines()
    assert header.split()[: len(COLUMNS)] == list(COLUMNS), header
    return [dict(zip(COLUMNS, line.split()[: len(COLUMNS)], strict=True)) for line in lines]


def test_from_a_persons_id_and_a_day_to_whether_it_was_delivered(local_stack):
    env = local_stack

    # 1. A person's id and a day, as printed.
    sent = run_cli("reminders", "--status", "Sent", env=env)
    assert sent.returncode == 0, sent.stderr
    first = _rows(sent.stdout)[0]
    person, day = first["owner_user_id"], datetime.fromisoformat(first["due_at"]).date()

    # 2. That person's reminders of that day.
    found = run_cli(
        "reminders", "--owner", person, "--due-from", str(day), "--due-to", str(day), env=env
    )
    assert found.returncode == 0, found.stderr
    theirs = _rows(found.stdout)
    assert {r["owner_user_id"] for r in theirs} == {person}
    [reminder] = [r for r in theirs if r["reminder_id"] == first["reminder_id"]]

    # 3. Did they get it, when, through which run, partition and offset, was it delivered.
    traced = run_cli("trace", reminder["reminder_id"], "--json", env=env)
    assert traced.returncode == 0, traced.stderr
    data = json.loads(traced.stdout)
    [item] = data["reminders"]
    assert item["status"] == "Sent" and item["sent_at"] and item["published_at"]
    assert item["owner_user_id"] == person and item["delivered"] is True
    assert item["run_id"] and item["run_url"] is None  # a command's cycle: no Dagster run
    assert item["moved_by"] in ("cli:up", "cli:dispatch")
    assert f"(run id {item['run_id']}, no Dagster run)" in item["reason"]

    # The store trace asked is the one the stack's status prints (nobody typed its path).
    status = json.loads(run_cli("services", "status", "--json", env=env).stdout)
    assert data["dedup_store"] == status["consumer"]["dedup_path"]
    assert status["consumer"]["written"] is True

    # The broker holds that very message at that partition and offset.
    broker = KafkaSettings(bootstrap_servers=status["broker"]["bootstrap_servers"])
    message = message_at(broker, item["partition"], item["offset"])
    assert json.loads(message.value())["ReminderId"] == item["reminder_id"]
    assert message.key().decode() == item["event_id"]
    headers = {k: v.decode() for k, v in (message.headers() or [])}
    assert headers["correlation-id"] == item["run_id"]

    text = run_cli("trace", reminder["reminder_id"], env=env).stdout
    assert f"owner_user_id  {person}" in text
    assert f"delivered      yes (store: {data['dedup_store']})" in text
