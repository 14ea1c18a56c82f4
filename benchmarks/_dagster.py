"""Figures 2 (steady-state lateness under the real daemon) and 4 (idle cycle: tick to success, no writes).

One Dagster stack (``reminder_pipeline.local.dagster_processes.DagsterStack``: webserver + daemon with the
every-minute ``reminder_dispatch_schedule``) on a temporary ``DAGSTER_HOME``, its storage in a
database of its own on the benchmark's PostgreSQL. First an idle phase (nothing due: a few ticks),
then a steady phase (a feeder makes reminders fall due at random seconds, ~50 a minute; a consumer
reads the topic back and takes the broker timestamp of each message).
"""

from __future__ import annotations

import json
import os
import random
import statistics
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import psycopg

from benchmarks._dueq import percentile
from benchmarks._infra import progress
from reminder_pipeline.domain import contract
from reminder_pipeline.local.calendar import NewEvent, create_event
from reminder_pipeline.local.servers import free_port
from reminder_pipeline.messaging.kafka import ensure_topic
from reminder_pipeline.store import migrate
from reminder_pipeline.store.engine import make_engine
from reminder_pipeline_testkit.servers import Servers

JOB = "reminder_dispatch"
APP_TABLES = ("calendar_events", "event_reminders", "outbox")


def dagster_available() -> str | None:
    """None when the Dagster layer loads, else why not."""
    try:
        from reminder_pipeline.definitions import defs  # noqa: F401
        from reminder_pipeline.local.dagster_processes import DagsterStack  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - reported in the table
        return f"{type(exc).__name__}: {exc}"
    return None


def table_stats(srv: Servers, db: str) -> dict[str, dict[str, int]]:
    with psycopg.connect(srv.dsn(db), autocommit=True) as conn:
        rows = conn.execute(
            "SELECT relname, n_tup_ins, n_tup_upd, n_tup_del FROM pg_stat_user_tables"
        ).fetchall()
        xact = conn.execute(
            "SELECT xact_commit, xact_rollback FROM pg_stat_database WHERE datname = current_database()"
        ).fetchone()
    stats = {r[0]: {"ins": int(r[1]), "upd": int(r[2]), "del": int(r[3])} for r in rows}
    stats["_xact"] = {"commit": int(xact[0]), "rollback": int(xact[1])}
    return stats


def stats_delta(before: dict, after: dict) -> dict[str, dict[str, int]]:
    out = {}
    for table, values in after.items():
        prev = before.get(table, {})
        delta = {k: v - prev.get(k, 0) for k, v in values.items()}
        if any(delta.values()):
            out[table] = delta
    return out


@dataclass
class RunTiming:
    run_id: str
    status: str
    tick: float
    created: float
    started: float | None
    ended: float | None

    @property
    def tick_to_end(self) -> float | None:
        return None if self.ended is None else self.ended - self.tick

    def as_dict(self) -> dict:
        def rel(v):
            return None if v is None else round(v - self.tick, 2)

        return {
            "run_id": self.run_id[:8],
            "status": self.status,
            "tick": datetime.fromtimestamp(self.tick, UTC).strftime("%H:%M:%S"),
            "created_s": rel(self.created),
            "started_s": rel(self.started),
            "ended_s": rel(self.ended),
        }


def scheduled_runs(instance, since: float) -> list[RunTiming]:
    from dagster import RunsFilter

    records = instance.get_run_records(filters=RunsFilter(job_name=JOB), limit=500)
    out = []
    for rec in records:
        tags = rec.dagster_run.tags
        # A hidden tag (leading dot) in Dagster 1.13; the plain name in older releases.
        tag = tags.get(".dagster/scheduled_execution_time") or tags.get(
            "dagster/scheduled_execution_time"
        )
        if not tag:
            continue
        tick = datetime.fromisoformat(tag).timestamp()
        if tick < since:
            continue
        out.append(
            RunTiming(
                rec.dagster_run.run_id,
                rec.dagster_run.status.value,
                tick,
                rec.create_timestamp.timestamp(),
                rec.start_time,
                rec.end_time,
            )
        )
    return sorted(out, key=lambda r: r.tick)


def _done(run: RunTiming) -> bool:
    return run.status in ("SUCCESS", "FAILURE", "CANCELED")


class Feeder(threading.Thread):
    """Creates one event (one reminder, offset 15) ``lead`` seconds before each due time."""

    def __init__(self, url: str, due_times: list[float], lead: float = 20.0, seed: int = 7) -> None:
        super().__init__(name="bench-feeder", daemon=True)
        self.engine = make_engine(url, pool_size=2, application_name="bench-feeder")
        self.due_times = due_times
        self.lead = lead
        self.rng = random.Random(seed)
        self.created: dict[str, float] = {}  # reminder id -> due (epoch)
        self.late_inserts = 0
        self.stopped = threading.Event()

    def run(self) -> None:
        from reminder_pipeline.store.tables import event_reminders

        for due in self.due_times:
            wait = due - self.lead - time.time()
            if wait > 0 and self.stopped.wait(wait):
                return
            if self.stopped.is_set():
                return
            if due - time.time() < 2:
                self.late_inserts += 1
            due_at = datetime.fromtimestamp(due, UTC)
            client = self.rng.random() < 0.3
            event_id = create_event(
                self.engine,
                NewEvent(
                    tenant_id=uuid.UUID(int=0xA1 + self.rng.randrange(3)),
                    owner_user_id=uuid.UUID(int=0xB1 + self.rng.randrange(5)),
                    client_user_id=uuid.uuid4() if client else None,
                    kind=self.rng.choice(["Showing", "Consultation", "Meeting", "Task"]),
                    start_at=due_at + timedelta(minutes=15),
                    time_zone=self.rng.choice(["Europe/Moscow", "Asia/Vladivostok", "UTC"]),
                    title="Bench: viewing with Ivan Petrov",
                    description="+7 900 000-00-00",
                    location="Tverskaya 1, apt 42",
                ),
                (15,),
            )
            with self.engine.connect() as conn:
                rid = conn.execute(
                    event_reminders.select()
                    .with_only_columns(event_reminders.c.id)
                    .where(event_reminders.c.calendar_event_id == event_id)
                ).scalar_one()
            self.created[str(rid)] = due

    def stop(self) -> None:
        self.stopped.set()
        self.engine.dispose()


class Reader(threading.Thread):
    """Reads the contract topic from the beginning (all partitions assigned, no group join)."""

    def __init__(self, bootstrap: str) -> None:
        super().__init__(name="bench-reader", daemon=True)
        from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

        self.consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": f"bench-{uuid.uuid4()}",
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
            }
        )
        self.consumer.assign(
            [
                TopicPartition(contract.TOPIC, p, OFFSET_BEGINNING)
                for p in range(contract.PARTITIONS)
            ]
        )
        self.seen: dict[str, float] = {}  # reminder id -> broker timestamp (s), first arrival
        self.copies: dict[str, int] = {}  # reminder id -> messages seen (other figures' too)
        self.timestamp_types: set[int] = set()
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.is_set():
            msg = self.consumer.poll(0.5)
            if msg is None or msg.error():
                continue
            ts_type, ts = msg.timestamp()
            self.timestamp_types.add(ts_type)
            try:
                rid = json.loads(msg.value())["ReminderId"]
            except (ValueError, KeyError, TypeError):
                continue
            self.copies[rid] = self.copies.get(rid, 0) + 1
            if rid not in self.seen:
                self.seen[rid] = ts / 1000.0

    def stop(self) -> None:
        self.stopped.set()
        self.join(5)
        self.consumer.close()


def other_minute_schedules() -> list[str]:
    """Schedules besides the dispatch one that also tick every minute (each tick starts a run
    worker process at the same second as the dispatch run's)."""
    from reminder_pipeline.definitions import defs

    names = []
    for sched in defs.schedules or []:
        if sched.name != "reminder_dispatch_schedule" and sched.cron_schedule == "* * * * *":
            names.append(sched.name)
    return names


def set_schedule(home, env: dict, name: str, running: bool) -> None:
    """``dagster schedule start|stop NAME`` against the stack's instance."""
    import subprocess
    import sys
    from pathlib import Path

    exe = Path(sys.executable).with_name("dagster")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "dagster"]
    cmd += ["schedule", "start" if running else "stop", name, "-w", str(home / "workspace.yaml")]
    child_env = {**os.environ, **env, "DAGSTER_HOME": str(home)}
    proc = subprocess.run(
        cmd, env=child_env, capture_output=True, text=True, timeout=120, check=False
    )
    if proc.returncode != 0:
        raise RuntimeError(
            f"dagster schedule {'start' if running else 'stop'} {name}: "
            f"{' '.join((proc.stderr or proc.stdout).split())[-300:]}"
        )


def _idle_phase(srv: Servers, app_db: str, instance, ticks: int, label: str) -> dict:
    since = time.time()
    before = table_stats(srv, app_db)
    runs = _wait_runs(instance, since, ticks, ticks * 60 + 180, label)
    time.sleep(2)  # let the run workers' statistics reach pg_stat
    after = table_stats(srv, app_db)
    delta = stats_delta(before, after)
    writes = {t: d for t, d in delta.items() if t != "_xact"}
    durations = [r.tick_to_end for r in runs if r.tick_to_end is not None]
    out = {
        "runs": [r.as_dict() for r in runs],
        "statuses": [r.status for r in runs],
        "tick_to_success_s": [round(d, 2) for d in durations],
        "median_s": statistics.median(durations) if durations else None,
        "max_s": max(durations) if durations else None,
        "tick_to_start_median_s": statistics.median([r.started - r.tick for r in runs if r.started])
        if runs
        else None,
        "writes": writes,
        "app_table_writes": {t: d for t, d in writes.items() if t in APP_TABLES},
        "transactions": delta.get("_xact", {}),
    }
    progress(f"{label}: tick->success {out['tick_to_success_s']} s, writes {writes or 'none'}")
    return out


@dataclass
class DagsterResult:
    idle: dict = field(default_factory=dict)
    steady: dict = field(default_factory=dict)
    error: str | None = None


def _wait_runs(instance, since: float, count: int, timeout: float, label: str) -> list[RunTiming]:
    deadline = time.time() + timeout
    last = ""
    while True:
        runs = [r for r in scheduled_runs(instance, since) if _done(r)]
        line = f"{label}: {len(runs)}/{count} scheduled runs finished"
        if line != last:
            progress(line)
            last = line
        if len(runs) >= count or time.time() > deadline:
            return runs[:count]
        time.sleep(2)


def run(
    srv: Servers,
    *,
    idle_ticks: int,
    steady_minutes: float,
    rate_per_minute: float = 50.0,
    do_idle: bool = True,
    do_steady: bool = True,
    without_schedules: tuple[str, ...] = (),
) -> DagsterResult:
    from dagster import DagsterInstance

    from reminder_pipeline.local.dagster_processes import (
        DagsterStack,
        dagster_storage_url,
        prepare_home,
    )

    result = DagsterResult()
    ensure_topic(srv.kafka)
    app_db = srv.create_database("steady")
    dag_db = srv.create_database("dagster")
    engine = make_engine(srv.url(app_db), pool_size=1)
    migrate.upgrade(engine)
    engine.dispose()
    home = srv.workdir / "dagster_home"
    dagster_url = dagster_storage_url(srv.url(dag_db))
    env = {
        "DATABASE_URL": srv.url(app_db),
        "KAFKA_BOOTSTRAP_SERVERS": srv.bootstrap_servers,
        "DAGSTER_PG_URL": dagster_url,
    }
    saved = {k: os.environ.get(k) for k in ("DAGSTER_PG_URL", "DAGSTER_HOME")}
    os.environ["DAGSTER_PG_URL"] = dagster_url
    os.environ["DAGSTER_HOME"] = str(home)
    prepare_home(home)
    instance = DagsterInstance.from_config(str(home))  # creates Dagster's schema before the stack
    stack = DagsterStack(home, env, port=free_port())
    progress(f"dagster: starting webserver + daemon on {stack.url} (home {home})")
    t0 = time.time()
    try:
        stack.start(timeout=300)
        result.idle["stack_start_s"] = time.time() - t0
        progress(f"dagster: stack ready in {result.idle['stack_start_s']:.0f}s")
        for name in without_schedules:
            set_schedule(home, env, name, running=False)
            progress(f"dagster: schedule {name} stopped for this benchmark")
        result.idle["stopped_schedules"] = list(without_schedules)
        if do_idle:
            result.idle.update(_idle_phase(srv, app_db, instance, idle_ticks, "idle"))
            others = [n for n in other_minute_schedules() if n not in without_schedules]
            result.idle["other_minute_schedules"] = others
            if others:
                # Same stack, the other every-minute schedules stopped: what the dispatch run
                # costs when it is the only run worker starting at the tick.
                for name in others:
                    set_schedule(home, env, name, running=False)
                try:
                    result.idle["alone"] = _idle_phase(
                        srv, app_db, instance, idle_ticks, "idle, dispatch schedule alone"
                    )
                finally:
                    for name in others:
                        set_schedule(home, env, name, running=True)
        if do_steady:
            result.steady = _steady(srv, app_db, instance, steady_minutes, rate_per_minute)
    except Exception as exc:  # noqa: BLE001 - reported in the table, the stack is still stopped
        result.error = f"{type(exc).__name__}: {exc}"
        progress(f"dagster: {result.error}")
    finally:
        progress("dagster: stopping the stack")
        stack.stop()
        instance.dispose()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        srv.drop_database(app_db)
        srv.drop_database(dag_db)
    return result


def _steady(srv: Servers, app_db: str, instance, minutes: float, rate: float) -> dict:
    rng = random.Random(11)
    start = time.time() + 25  # the first due time: after the feeder's lead
    end = start + minutes * 60
    due_times, t = [], start
    while True:  # a Poisson process of ``rate`` per minute: due "at random seconds"
        t += rng.expovariate(rate / 60.0)
        if t >= end:
            break
        due_times.append(t)
    reader = Reader(srv.bootstrap_servers)
    reader.start()
    feeder = Feeder(srv.url(app_db), due_times)
    feeder.start()
    progress(
        f"steady: {len(due_times)} reminders falling due over {minutes:g} min "
        f"(~{rate:g}/min, at random seconds)"
    )
    try:
        while time.time() < end + 5:
            time.sleep(min(30, max(end + 5 - time.time(), 0.1)))
            got = sum(1 for rid in feeder.created if rid in reader.seen)
            progress(
                f"steady: {len(feeder.created)}/{len(due_times)} fed, {got} on the topic, "
                f"{max(0, int(end - time.time()))}s of feeding left"
            )
        feeder.join(30)
        # The last reminders go out with the next tick(s): wait until everything fed is on the topic.
        deadline = time.time() + 150
        while time.time() < deadline:
            missing = [rid for rid in feeder.created if rid not in reader.seen]
            if not missing:
                break
            time.sleep(2)
    finally:
        feeder.stop()
        reader.stop()
    created = dict(feeder.created)
    with psycopg.connect(srv.dsn(app_db), autocommit=True) as conn:
        rows = conn.execute(
            "SELECT id::text, extract(epoch FROM due_at), extract(epoch FROM sent_at), status "
            "FROM event_reminders WHERE id = ANY(%s::uuid[])",
            (list(created),),
        ).fetchall()
    db_due = {r[0]: float(r[1]) for r in rows}
    db_sent = {r[0]: (None if r[2] is None else float(r[2])) for r in rows}
    lateness, ideal, db_lateness, missing = [], [], [], []
    for rid, due in db_due.items():
        ts = reader.seen.get(rid)
        if ts is None:
            missing.append(rid)
            continue
        lateness.append(ts - due)
        nxt = (int(due // 60) + 1) * 60  # the next tick of a zero-overhead every-minute cycle
        ideal.append(nxt - due)
        if db_sent.get(rid) is not None:
            db_lateness.append(db_sent[rid] - due)
    runs = [r for r in scheduled_runs(instance, start - 60) if _done(r)]
    durations = [r.tick_to_end for r in runs if r.tick_to_end is not None]
    out = {
        "minutes": minutes,
        "fed": len(created),
        "received": len(lateness),
        "missing": len(missing),
        "late_inserts": feeder.late_inserts,
        "duplicates_on_topic": sum(
            reader.copies.get(rid, 0) - 1 for rid in created if reader.copies.get(rid, 0) > 1
        ),
        "timestamp_types": sorted(reader.timestamp_types),
        "p50_s": statistics.median(lateness) if lateness else None,
        "p95_s": percentile(lateness, 95) if lateness else None,
        "max_s": max(lateness) if lateness else None,
        "min_s": min(lateness) if lateness else None,
        "ideal_p95_s": percentile(ideal, 95) if ideal else None,
        "ideal_max_s": max(ideal) if ideal else None,
        "db_p95_s": percentile(db_lateness, 95) if db_lateness else None,
        "db_max_s": max(db_lateness) if db_lateness else None,
        "runs": len(runs),
        "run_statuses": sorted({r.status for r in runs}),
        "tick_to_success_median_s": statistics.median(durations) if durations else None,
        "tick_to_success_max_s": max(durations) if durations else None,
        "tick_to_start_max_s": max((r.started - r.tick for r in runs if r.started), default=None),
    }
    if out["p95_s"] is not None:
        progress(
            f"steady: lateness p95 {out['p95_s']:.1f}s max {out['max_s']:.1f}s "
            f"({out['received']}/{out['fed']} received)"
        )
    return out
