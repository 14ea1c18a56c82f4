"""A failover that loses commits, end to end (issue 34, item 4), on real servers and the real
``dagster-daemon`` running the shipped schedule.

The application's database and Dagster's storage live on an embedded primary with an asynchronous
streaming replica (:mod:`reminder_pipeline_testkit.replica`); every process of the stack (the
daemon, its run workers, the exporter, this test's own reads) reaches them through SQLAlchemy's
multi-host URL (``?host=A:PA&host=B:PB&target_session_attrs=read-write``), as ``DATABASE_URL`` and
Dagster's storage URL. A burst of due reminders, some of cancelled events, falls due on one tick;
while that tick's run drains it, the primary's WAL stops shipping, the primary commits on (rows
Sent, their messages published, outbox rows marked) and is SIGKILLed; its address stays dead a few
seconds, then the replica is promoted. Then:

* the daemon's next scheduled run succeeds on the new primary; the exporter answered ``up 0``
  while no server was writable and tells the new primary's figures after;
* every reminder of a live event that the new primary holds Sent is on the topic at least once and
  notified exactly once by the reference consumer (its shared de-dup store absorbs the copies);
  none of a cancelled event is; every copy of a reminder carries the same payload and the same
  ``message-id``, and some reminders do have copies (the failover lost commits);
* nothing due is left Pending, nothing unpublished, after that run;
* the checks the health sensor records after the promotion are read from the new primary (their
  last success is one it knows), and after the recovery liveness, overdue and backlog all pass.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
import pytest
from dagster import AssetCheckKey, DagsterInstance, DagsterRunStatus, RunsFilter
from dagster._core.storage.tags import SCHEDULE_NAME_TAG
from prometheus_client.parser import text_string_to_metric_families

from reminder_pipeline.consumer import PostgresDedupStore, ReminderConsumer
from reminder_pipeline.consumer.options import ConsumerOptions
from reminder_pipeline.defs.assets import DISPATCH_ASSET_KEY
from reminder_pipeline.domain import contract
from reminder_pipeline.local.dagster_processes import dagster_storage_url
from reminder_pipeline.local.servers import EmbeddedBroker, free_port
from reminder_pipeline.messaging.kafka import ensure_topic
from reminder_pipeline.observability import exporter
from reminder_pipeline_testkit.daemon import prepare_dagster, spawn_daemon
from reminder_pipeline_testkit.dedup_store import dedup_database
from reminder_pipeline_testkit.feeder import DISTURB, INSERT_DUE
from reminder_pipeline_testkit.replica import ReplicaPair
from reminder_pipeline_testkit.servers import Servers

from ..consumer.lane import RecordingSink
from ..support import KafkaReader

pytestmark = [pytest.mark.server, pytest.mark.slow]

#: Due reminders of the burst (a few thousand: the drain takes several batches of 200).
BURST = 4_000
#: Mid-drain: the tick's run has Sent at least a batch and this many are still due and Pending.
MID_DRAIN_PENDING = 1_000
#: After the WAL stopped shipping, the primary commits on until this many rows Sent since have
#: been published and marked (at most HOLD_MAX_S): those are the commits the failover loses.
LOST_PUBLISHED = 200
HOLD_MAX_S = 10.0
#: How long no server is writable between the kill and the promotion.
SILENT_S = 3.0
#: Each wait is bounded by what it waits for: a tick a minute, a run of seconds, and the run
#: left STARTED by the kill failed by run monitoring (dagster/max_runtime 120 s) at worst.
TICK_TIMEOUT_S = 150.0
RECOVERY_TIMEOUT_S = 240.0
SCHEDULE = "reminder_dispatch_schedule"
FINISHED = (DagsterRunStatus.SUCCESS, DagsterRunStatus.FAILURE, DagsterRunStatus.CANCELED)

BURST_STATE = """
SELECT count(*) FILTER (WHERE r.status = 'Sent'),
       count(*) FILTER (WHERE r.status = 'Pending' AND r.due_at <= now()),
       (SELECT count(*) FROM outbox WHERE published_at IS NULL)
  FROM event_reminders r
"""
SENT_AND_PUBLISHED_SINCE = """
SELECT count(*) FROM event_reminders r JOIN outbox o ON o.reminder_id = r.id
 WHERE r.sent_at >= %s AND o.published_at IS NOT NULL
"""


def _wait(what: str, timeout: float, check, interval: float = 0.5):
    """Poll ``check()`` until it returns something true; fail naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        found = check()
        if found:
            return found
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not within {timeout:.0f} s")
        time.sleep(interval)


def _scrape(port: int) -> dict[str, float]:
    """The exporter's unlabelled samples (name -> value)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as response:
        text = response.read().decode()
    return {
        s.name: s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if not s.labels
    }


def _scheduled_runs(instance: DagsterInstance) -> list:
    return list(
        instance.get_run_records(
            filters=RunsFilter(job_name="reminder_dispatch", tags={SCHEDULE_NAME_TAG: SCHEDULE}),
            ascending=True,
        )
    )


class _Stack:
    """The stack on a primary and its replica, every URL the multi-host one."""

    def __init__(self, workdir: Path, dedup_admin_url: str, monkeypatch) -> None:
        self.exit = contextlib.ExitStack()
        self.pair = ReplicaPair(workdir / "pg")
        self.exit.callback(self.pair.stop)
        self.pair.start()
        broker = EmbeddedBroker(state_dir=workdir / "broker", port=free_port())
        self.exit.callback(broker.stop)
        # Setup (databases, migrations, Dagster's schema) on the primary's own address.
        srv = Servers(self.pair.primary.url("postgres"), broker.start(), workdir, embedded=True)
        self.kafka = srv.kafka
        ensure_topic(self.kafka)
        # prepare_dagster sets these in this process; monkeypatch puts them back after the test.
        monkeypatch.setenv("DAGSTER_PG_URL", "")
        monkeypatch.setenv("DAGSTER_HOME", "")
        env, self.home, self.app_db, setup_instance = prepare_dagster(srv, "failover")
        setup_instance.dispose()  # type: ignore[attr-defined]
        env["DATABASE_URL"] = self.pair.url(self.app_db)
        env["DAGSTER_PG_URL"] = dagster_storage_url(self.pair.url(srv.name("dagster")))
        monkeypatch.setenv("DAGSTER_PG_URL", env["DAGSTER_PG_URL"])
        self.env = env
        self.instance = DagsterInstance.from_config(str(self.home))
        self.exit.callback(self.instance.dispose)
        self.daemon = spawn_daemon(env, self.home)
        self.exit.callback(self._stop, self.daemon)
        self.metrics_port = free_port()
        exe = Path(sys.executable).with_name("reminder-pipeline")
        self.exporter = subprocess.Popen(
            [str(exe), "metrics", "--port", str(self.metrics_port)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=(self.home / "exporter.log").open("ab"),
            start_new_session=True,
        )
        self.exit.callback(self._stop, self.exporter)
        # The reference consumer on its shared PostgreSQL de-dup store (the session's server).
        dedup_url = self.exit.enter_context(dedup_database(dedup_admin_url))
        self.sink = RecordingSink()
        self.consumer = ReminderConsumer(
            self.kafka,
            self.sink,
            PostgresDedupStore(dedup_url),
            ConsumerOptions(group_id=f"failover-{uuid.uuid4().hex[:8]}"),
        )
        stop = threading.Event()
        thread = threading.Thread(target=self.consumer.run, kwargs={"stop": stop}, daemon=True)
        thread.start()
        self.exit.callback(thread.join, 30)
        self.exit.callback(stop.set)
        self.reader = KafkaReader(self.kafka)
        self.exit.callback(self.reader.close)

    def primary_dsn(self) -> str:
        """The application database on the primary's own address (no failover in between)."""
        return f"host=127.0.0.1 port={self.pair.primary.port} user=postgres dbname={self.app_db}"

    def app_dsn(self) -> str:
        """The application database through the multi-host URL: whichever server is writable."""
        return self.pair.dsn(self.app_db)

    @staticmethod
    def _stop(proc: subprocess.Popen) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


@pytest.fixture
def stack(pg_admin_url: str, monkeypatch, artifacts_dir: Path) -> Iterator[_Stack]:
    # Not under pytest's tmp_path: another pytest session on the machine takes group and other
    # permissions off pytest's root, and the servers' own user could no longer reach their files.
    workdir = Path(tempfile.mkdtemp(prefix="rp-failover-"))
    try:
        built = _Stack(workdir, pg_admin_url, monkeypatch)
        with built.exit:
            yield built
    finally:
        with contextlib.suppress(OSError):
            shutil.copy(
                workdir / "dagster_home" / "daemon.log", artifacts_dir / "failover-daemon.log"
            )
        shutil.rmtree(workdir, ignore_errors=True)


def test_a_failover_that_loses_commits_costs_copies_and_nothing_else(
    stack: _Stack, artifacts_dir: Path
):
    figures: dict = {}
    t0 = time.monotonic()
    # The burst falls due on the first tick at least 25 s away (the daemon starts meanwhile);
    # inserted just before it, so no run of an earlier tick takes part of it.
    tick = datetime.fromtimestamp((int(time.time() + 25) // 60 + 1) * 60, UTC)
    time.sleep(max(0.0, tick.timestamp() - 8 - time.time()))
    with psycopg.connect(stack.app_dsn()) as conn:  # one transaction: no tick sees half of it
        due = tick - timedelta(seconds=68)
        conn.execute(INSERT_DUE, {"due": due, "n": BURST, "spread": 60})
        row = conn.execute(DISTURB, {"due": due}).fetchone()
    assert row is not None
    figures["cancelled"], figures["moved"] = int(row[0]), int(row[1])
    assert figures["cancelled"] > 0

    # Mid-drain of the tick's run: stop the WAL stream, let the primary commit on, kill it.
    with psycopg.connect(stack.primary_dsn(), autocommit=True) as conn:

        def mid_drain() -> tuple | None:
            sent, pending, _ = conn.execute(BURST_STATE).fetchone()
            return (sent, pending) if sent >= 200 and pending >= MID_DRAIN_PENDING else None

        _wait("the tick's run mid-drain", TICK_TIMEOUT_S, mid_drain, interval=0.02)
        stack.pair.stop_shipping()
        (stopped,) = conn.execute("SELECT clock_timestamp()").fetchone()
        deadline = time.monotonic() + HOLD_MAX_S
        while time.monotonic() < deadline:
            (lost,) = conn.execute(SENT_AND_PUBLISHED_SINCE, (stopped,)).fetchone()
            if lost >= LOST_PUBLISHED:
                break
            time.sleep(0.02)
        sent_on_old, _, _ = conn.execute(BURST_STATE).fetchone()
        figures["sent_published_after_stream_stopped"] = lost
    unshipped = stack.pair.kill_primary_unshipped(hold_s=0.0)
    figures["lost_wal_bytes"] = unshipped.lost_wal_bytes
    assert unshipped.lost_wal_bytes > 0

    # No writable server: the exporter says so (up 0) rather than old figures.
    time.sleep(SILENT_S / 2)
    assert _scrape(stack.metrics_port)[exporter.UP] == 0
    time.sleep(SILENT_S / 2)
    figures["promote_s"] = round(stack.pair.promote(), 2)
    promoted_at = datetime.now(UTC)

    with psycopg.connect(stack.app_dsn(), autocommit=True) as conn:
        sent_on_new, due_pending_on_new, unpublished_again = conn.execute(BURST_STATE).fetchone()
    figures.update(
        sent_on_old_primary=sent_on_old,
        sent_on_new_primary=sent_on_new,
        due_pending_on_new=due_pending_on_new,
        unpublished_again=unpublished_again,
    )
    # The failover lost Sent transitions: those rows are Pending again on the new primary.
    assert sent_on_new < sent_on_old
    # The exporter follows the multi-host URL to the new primary and tells its figures: its
    # backlog lies between the new primary's before and after the scrape (a run may be draining).
    _wait(
        "the exporter reading the new primary",
        60,
        lambda: _scrape(stack.metrics_port)[exporter.UP] == 1,
    )
    with psycopg.connect(stack.app_dsn(), autocommit=True) as conn:
        before = conn.execute(BURST_STATE).fetchone()[1]
        scraped = _scrape(stack.metrics_port)
        after = conn.execute(BURST_STATE).fetchone()[1]
    assert after <= scraped[exporter.BACKLOG_GAUGE] <= before
    figures["exporter_backlog_after_promotion"] = scraped[exporter.BACKLOG_GAUGE]

    # The daemon's next scheduled run, on the new primary, succeeds and takes them.
    def recovered():
        runs = _scheduled_runs(stack.instance)
        after = [r for r in runs if r.start_time and r.start_time > promoted_at.timestamp()]
        done = [r for r in after if r.dagster_run.status in FINISHED]
        return done[0] if done else None

    recovery = _wait("a scheduled run after the promotion", RECOVERY_TIMEOUT_S, recovered, 1.0)
    figures["runs"] = [
        (r.dagster_run.run_id[:8], r.dagster_run.status.value)
        for r in _scheduled_runs(stack.instance)
    ]
    assert recovery.dagster_run.status is DagsterRunStatus.SUCCESS, figures["runs"]
    # The run the kill interrupted is not left in flight in Dagster's storage (it would hold
    # the schedule back): its worker recorded its failure on the new primary.
    assert all(r.dagster_run.status in FINISHED for r in _scheduled_runs(stack.instance)[:-1]), (
        figures["runs"]
    )
    figures["recovered_after_s"] = round(recovery.end_time - promoted_at.timestamp(), 1)
    assert stack.daemon.poll() is None, "the daemon exited"
    assert stack.exporter.poll() is None, "the exporter exited"

    with psycopg.connect(stack.app_dsn(), autocommit=True) as conn:
        _, pending, unpublished = conn.execute(BURST_STATE).fetchone()
        assert (pending, unpublished) == (0, 0)  # nothing left past the next cycle
        live = {
            r[0]
            for r in conn.execute(
                "SELECT r.id::text FROM event_reminders r JOIN calendar_events e "
                "ON e.id = r.calendar_event_id WHERE r.status = 'Sent' AND e.status <> 'Cancelled'"
            )
        }
        cancelled = {
            r[0]
            for r in conn.execute(
                "SELECT r.id::text FROM event_reminders r JOIN calendar_events e "
                "ON e.id = r.calendar_event_id WHERE e.status = 'Cancelled'"
            )
        }
    assert len(live) == BURST - figures["moved"] - figures["cancelled"]

    # On the topic: every live reminder at least once, none of a cancelled event; copies alike.
    stack.reader.wait_for(live, timeout=60)
    stack.reader.drain()
    by_id: dict[str, list] = {}
    for message in stack.reader.messages:
        by_id.setdefault(message.value["ReminderId"], []).append(message)
    assert live <= set(by_id)
    assert not cancelled & set(by_id)
    for rid, copies in by_id.items():
        assert {m.headers[contract.HEADER_MESSAGE_ID] for m in copies} == {contract.message_id(rid)}
        assert len({m.raw_value for m in copies}) == 1, rid
    doubled = {rid: len(c) for rid, c in by_id.items() if len(c) > 1}
    figures["reminders_with_copies"] = len(doubled)
    figures["copies"] = sum(doubled.values()) - len(doubled)
    assert doubled, "the failover lost no published commit: the test did not test it"

    # The consumer: each live reminder notified exactly once, every copy handled.
    messages = len(stack.reader.messages)
    _wait(
        "the consumer handling every message",
        120,
        lambda: stack.consumer.stats.messages >= messages,
    )
    notified = Counter(stack.sink.reminder_ids())
    assert set(notified) == live
    assert set(notified.values()) == {1}
    figures["duplicates_absorbed"] = stack.consumer.stats.duplicates
    assert stack.consumer.stats.duplicates >= figures["copies"]

    # The checks: the health sensor goes on evaluating after the promotion, from the new
    # primary, and after the recovery liveness, overdue and backlog pass.
    def evaluations(name: str) -> list:
        key = AssetCheckKey(DISPATCH_ASSET_KEY, name)
        history = stack.instance.event_log_storage.get_asset_check_execution_history(key, limit=50)
        return [h for h in history if h.create_timestamp > promoted_at.timestamp()]

    with psycopg.connect(stack.app_dsn(), autocommit=True) as conn:
        successes = {
            r[0] for r in conn.execute("SELECT finished_at FROM dispatch_cycles WHERE succeeded")
        }
    sensor = _wait(
        "a sensor evaluation after the promotion",
        90,
        lambda: [h for h in evaluations("dispatch_liveness") if h.run_id == ""],
        1.0,
    )
    figures["checks_after"] = {}
    for name in ("dispatch_liveness", "no_overdue_reminders", "outbox_backlog"):
        latest = evaluations(name)[0]
        evaluation = latest.event.dagster_event.event_specific_data
        figures["checks_after"][name] = (latest.run_id[:8] or "sensor", evaluation.passed)
    for h in sensor:
        evaluation = h.event.dagster_event.event_specific_data
        last = evaluation.metadata["last_success_at"].value
        assert last is None or datetime.fromisoformat(last) in successes
    assert all(passed for _, passed in figures["checks_after"].values()), figures["checks_after"]

    figures["test_s"] = round(time.monotonic() - t0, 1)
    (artifacts_dir / "failover.json").write_text(json.dumps(figures, indent=2, default=str))
    print(json.dumps(figures, default=str))
