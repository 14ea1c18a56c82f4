"""Peak load under the real ``dagster-daemon`` and schedule (issue 19): bursts and a working week.

``python -m benchmarks.peak`` starts embedded PostgreSQL and a broker (or uses ``DATABASE_URL`` /
``KAFKA_BOOTSTRAP_SERVERS``), a ``dagster-daemon run`` (no webserver) with the shipped instance
config and the every-minute ``reminder_dispatch_schedule``, then:

* **bursts**: N reminders (default 1,000, 10,000 and 50,000) falling due within one minute, as at
  the top of a busy hour, inserted set-based ahead of their due time;
* **working week**: a week of events starting on :00/:30 in business hours across Russian time
  zones, reminders at {15, 60, 1440} minutes, 5 % cancelled and 5 % rescheduled while pending,
  at the design's target load (50,000 reminders a week) and at 10x. Compressed: each quarter
  hour of the busiest stretch of the week falls due within one real minute (the quiet hours are
  left out), so every tick meets the burst a real quarter hour boundary brings.

For each phase it prints lateness DueAt -> published (the broker's timestamp) p50 / p95 / max,
rows and batches per run, run duration, tick -> success, the run workers' peak RSS, DueAt -> the
reference consumer's notification (p95 / max) and how long after a phase's last message the
consumer delivered its last notification (its lag back to zero), and the load average. ``--plan`` prints what it would feed and exits (no servers). The reference consumer is one member on the
shared PostgreSQL de-dup store (``--dedup sqlite``: the host's SQLite file).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import psutil
import psycopg

from reminder_pipeline_testkit.daemon import prepare_dagster, spawn_daemon
from reminder_pipeline_testkit.feeder import feed
from reminder_pipeline_testkit.servers import Servers

from ._dueq import percentile
from ._infra import progress, servers

BURSTS = (1_000, 10_000, 50_000)
QUICK_BURSTS = (500,)
#: The design's target load: tens of thousands of Pending rows on the horizon, read as 50,000
#: reminders a working week (issue 19).
WEEK_REMINDERS = 50_000
OFFSETS = (15, 60, 1440)
#: IANA zone -> hours east of UTC (no DST in Russia): business hours 09:00-18:00 local.
ZONES = {
    "Europe/Kaliningrad": 2,
    "Europe/Moscow": 3,
    "Asia/Yekaterinburg": 5,
    "Asia/Novosibirsk": 7,
    "Asia/Vladivostok": 10,
}
ZONE_WEIGHTS = (1, 6, 2, 2, 1)
TARGETS = {
    "burst_max_s": 120.0,
    "burst_p95_s": 90.0,
    "week_max_s": 75.0,
    "budget_s": 30.0,
}


# --- the load generator (pure: due times; reminder_pipeline_testkit.feeder inserts them) ----------


@dataclass(frozen=True)
class Slot:
    """What falls due at one quarter-hour mark of the week: reminders, and their share to disturb."""

    minute_of_week: int
    reminders: int


def working_week(reminders: int, seed: int = 19) -> list[Slot]:
    """Quarter-hour marks of a week (minute of week, UTC) and how many reminders fall due at each.

    Events start on :00/:30 in business hours (09:00-17:30 local) Monday to Friday, spread over
    the zones by weight; each has one reminder per offset, so ``reminders / 3`` events.
    """
    rng = random.Random(seed)
    zones = list(ZONES.items())
    due: Counter[int] = Counter()
    for _ in range(reminders // len(OFFSETS)):
        _, east = rng.choices(zones, weights=ZONE_WEIGHTS)[0]
        day = rng.randrange(5)
        local_minute = 9 * 60 + 30 * rng.randrange(18)  # 09:00 .. 17:30
        start = (day * 1440 + local_minute - east * 60) % (7 * 1440)
        for offset in OFFSETS:
            due[(start - offset) % (7 * 1440)] += 1
    return [Slot(m, n) for m, n in sorted(due.items())]


def busiest(slots: list[Slot], count: int) -> list[Slot]:
    """The ``count`` consecutive quarter-hour marks of the week that bring the most reminders."""
    by_minute = {s.minute_of_week: s.reminders for s in slots}
    marks = list(range(0, 7 * 1440, 15))
    windows = [marks[i : i + count] for i in range(len(marks) - count + 1)]
    best = max(windows, key=lambda w: sum(by_minute.get(m, 0) for m in w))
    return [Slot(m, by_minute.get(m, 0)) for m in best]


# --- measuring ------------------------------------------------------------------------------------


class RssSampler(threading.Thread):
    """The peak RSS of the daemon's run workers (its child processes), sampled every 0.2 s."""

    def __init__(self, pid: int) -> None:
        super().__init__(name="peak-rss", daemon=True)
        self.pid = pid
        self.peak_mb = 0.0
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.wait(0.2):
            for child in run_workers(self.pid):
                with contextlib.suppress(psutil.Error):
                    self.peak_mb = max(self.peak_mb, child.memory_info().rss / 2**20)


def run_workers(daemon_pid: int) -> list[psutil.Process]:
    """The daemon's run workers: the code server starts each run in a multiprocessing child."""
    found = []
    with contextlib.suppress(psutil.Error):
        for child in psutil.Process(daemon_pid).children(recursive=True):
            with contextlib.suppress(psutil.Error):
                cmd = " ".join(child.cmdline())
                if "spawn_main" in cmd or "execute_run" in cmd:
                    found.append(child)
    return found


class RecordingSink:
    """The reference consumer's sink here: when each reminder's first notification was delivered."""

    def __init__(self) -> None:
        self.delivered: dict[str, float] = {}

    def deliver(self, notification) -> None:
        self.delivered.setdefault(str(notification.reminder_id), time.time())


class ConsumerThread(threading.Thread):
    """The reference consumer (``reminder_pipeline.consumer``) with a recording sink."""

    def __init__(self, srv: Servers, dedup_url: str | None = None) -> None:
        super().__init__(name="peak-consumer", daemon=True)
        from reminder_pipeline.consumer.dedup import PostgresDedupStore, SqliteDedupStore
        from reminder_pipeline.consumer.runner import ConsumerOptions, ReminderConsumer

        self.sink = RecordingSink()
        self.stop_event = threading.Event()
        self.consumer = ReminderConsumer(
            srv.kafka,
            self.sink,
            PostgresDedupStore(dedup_url)
            if dedup_url
            else SqliteDedupStore(srv.workdir / "dedup.sqlite"),
            ConsumerOptions(group_id=f"peak-{os.getpid()}"),
        )

    def run(self) -> None:
        self.consumer.run(stop=self.stop_event)


@dataclass
class Phase:
    """One measured phase: its feed and what came out."""

    name: str
    fed: int = 0
    skipped_expected: int = 0
    lateness: list[float] = field(default_factory=list)
    #: DueAt -> the reference consumer's delivery of the notification.
    end_to_end: list[float] = field(default_factory=list)
    #: The last delivery after the last message on the topic (the consumer's lag back to 0).
    consumer_caught_up_s: float | None = None
    runs: list[dict] = field(default_factory=list)
    peak_rss_mb: float = 0.0
    load: tuple[float, float, float] = (0.0, 0.0, 0.0)
    unpublished: int = 0

    def summary(self) -> dict:
        lat = self.lateness
        busy = [r for r in self.runs if r["sent"] or r["skipped"]]
        return {
            "phase": self.name,
            "fed": self.fed,
            "cancelled": self.skipped_expected,
            "published": len(lat),
            "not_published": self.unpublished,
            "lateness_p50_s": round(statistics.median(lat), 1) if lat else None,
            "lateness_p95_s": round(percentile(lat, 95), 1) if lat else None,
            "lateness_max_s": round(max(lat), 1) if lat else None,
            "notified_p95_s": round(percentile(self.end_to_end, 95), 1)
            if self.end_to_end
            else None,
            "notified_max_s": round(max(self.end_to_end), 1) if self.end_to_end else None,
            "consumer_caught_up_s": None
            if self.consumer_caught_up_s is None
            else round(self.consumer_caught_up_s, 1),
            "runs": len(busy),
            "rows_per_run_max": max((r["sent"] + r["skipped"] for r in busy), default=0),
            "batches_per_run_max": max((r["batches"] for r in busy), default=0),
            "run_duration_max_s": round(max((r["duration_s"] for r in busy), default=0), 1),
            "tick_to_success_max_s": round(
                max((r["tick_to_success_s"] or 0 for r in busy), default=0), 1
            ),
            "peak_rss_mb": round(self.peak_rss_mb),
            "load_average": [round(x, 2) for x in self.load],
        }


def _ledger(dsn: str, since: datetime) -> list[dict]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT run_id, started_at, finished_at, sent, skipped, batches, duration_seconds "
            "FROM dispatch_cycles WHERE started_at >= %s ORDER BY started_at",
            (since,),
        ).fetchall()
    return [
        {
            "run_id": r[0],
            "started_at": r[1],
            "sent": r[3],
            "skipped": r[4],
            "batches": r[5],
            "duration_s": r[6],
            # The tick is the minute the run's cycle started in (the schedule fires on :00).
            "tick_to_success_s": (r[2] - r[1].replace(second=0, microsecond=0)).total_seconds(),
        }
        for r in rows
    ]


def _sent(dsn: str, since: datetime) -> dict[str, float]:
    """Reminder id -> DueAt (epoch) of the rows sent since ``since``."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT r.id::text, extract(epoch FROM r.due_at) FROM event_reminders r "
            "JOIN outbox o ON o.reminder_id = r.id WHERE r.sent_at >= %s",
            (since,),
        ).fetchall()
    return {rid: float(due) for rid, due in rows}


def _wait_notified(sink: RecordingSink, ids: list[str], timeout: float) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline and any(i not in sink.delivered for i in ids):
        time.sleep(1)


def _next_minute(after: float, lead: float) -> datetime:
    """The start of the first whole minute at least ``lead`` seconds after ``after``."""
    minute = (int(after + lead) // 60 + 1) * 60
    return datetime.fromtimestamp(minute, UTC)


def _wait_published(dsn: str, last_due: datetime, expected: int, timeout: float) -> None:
    deadline = time.time() + timeout
    last = -1
    while time.time() < deadline:
        with psycopg.connect(dsn, autocommit=True) as conn:
            pending = conn.execute(
                "SELECT count(*) FROM event_reminders WHERE status = 'Pending' AND due_at < now()"
            ).fetchone()[0]
            unpublished = conn.execute(
                "SELECT count(*) FROM outbox WHERE published_at IS NULL"
            ).fetchone()[0]
        done = expected - pending
        if done != last:
            progress(f"  {done}/{expected} dispatched, {unpublished} unpublished")
            last = done
        # Past the last fed minute, nothing due is Pending and the outbox is empty.
        if pending == 0 and unpublished == 0 and time.time() > last_due.timestamp() + 60:
            time.sleep(2)  # the reader's last messages
            return
        time.sleep(2)
    progress("  timed out waiting; measuring what went out")


def run_phase(
    name: str,
    dsn: str,
    reader,
    sampler: RssSampler,
    feeds: list[tuple[datetime, int, bool]],
    consumer: ConsumerThread | None = None,
) -> Phase:
    """Feed each (due minute, count, disturb) ahead of its minute, wait, and measure."""
    phase = Phase(name)
    since = feeds[0][0] - timedelta(seconds=1)
    sampler.peak_mb = 0.0
    for due, n, disturb in feeds:
        wait = due.timestamp() - 20 - time.time()  # inserted ~20 s before they fall due
        if wait > 0:
            time.sleep(wait)
        cancelled, moved = feed(dsn, due, n, disturb)
        phase.fed += n - moved
        phase.skipped_expected += cancelled
        progress(f"  {name}: {n:,} due from {due:%H:%M} ({cancelled} cancelled, {moved} moved)")
    _wait_published(dsn, feeds[-1][0], phase.fed, timeout=240 + phase.fed / 500)
    sent = _sent(dsn, since)
    phase.lateness = [reader.seen[i] - due for i, due in sent.items() if i in reader.seen]
    phase.unpublished = sum(1 for i in sent if i not in reader.seen)
    if consumer is not None:
        _wait_notified(consumer.sink, list(sent), timeout=120)
        got = consumer.sink.delivered
        phase.end_to_end = [got[i] - due for i, due in sent.items() if i in got]
        on_topic = [reader.seen[i] for i in sent if i in reader.seen]
        notified = [got[i] for i in sent if i in got]
        if on_topic and notified:
            phase.consumer_caught_up_s = max(notified) - max(on_topic)
    # The runs that took this phase's rows: from the tick at its first due minute on.
    phase.runs = _ledger(dsn, feeds[0][0])
    phase.peak_rss_mb = sampler.peak_mb
    phase.load = os.getloadavg()
    return phase


def _table(phases: list[Phase]) -> str:
    lines = [
        f"{'phase':<22} {'fed':>7} {'p50 s':>6} {'p95 s':>6} {'max s':>6} {'runs':>4} "
        f"{'rows/run':>8} {'batches':>7} {'run s':>6} {'tick->ok':>8} {'RSS MB':>6} "
        f"{'notif p95':>9} {'max':>6} {'lag->0':>6}  load"
    ]
    for p in phases:
        s = p.summary()
        lines.append(
            f"{s['phase']:<22} {s['fed']:>7,} {s['lateness_p50_s'] or 0:>6} "
            f"{s['lateness_p95_s'] or 0:>6} {s['lateness_max_s'] or 0:>6} {s['runs']:>4} "
            f"{s['rows_per_run_max']:>8,} {s['batches_per_run_max']:>7} "
            f"{s['run_duration_max_s']:>6} {s['tick_to_success_max_s']:>8} "
            f"{s['peak_rss_mb']:>6} {s['notified_p95_s'] or 0:>9} {s['notified_max_s'] or 0:>6} "
            f"{s['consumer_caught_up_s'] or 0:>6}  {' '.join(map(str, s['load_average']))}"
        )
    lines.append(
        f"targets: burst max <= {TARGETS['burst_max_s']:.0f} s, p95 <= "
        f"{TARGETS['burst_p95_s']:.0f} s; week at 10x max <= {TARGETS['week_max_s']:.0f} s; "
        f"run <= {TARGETS['budget_s']:.0f} s budget + one batch"
    )
    return "\n".join(lines)


def _start_daemon(srv: Servers) -> tuple[subprocess.Popen, str, str, object]:
    env, home, app_db, instance = prepare_dagster(srv, "peak")
    return spawn_daemon(env, home), srv.dsn(app_db), app_db, instance


def plan(args: argparse.Namespace) -> list[tuple[str, list[tuple[int, int, bool]]]]:
    """The phases: (name, [(minute index, reminders due in it, disturb)])."""
    phases = [(f"burst {n:,}", [(0, n, False)]) for n in args.bursts]
    for scale in args.week_scales:
        slots = busiest(working_week(WEEK_REMINDERS * scale), args.week_slots)
        phases.append(
            (f"week {scale}x", [(i, s.reminders, True) for i, s in enumerate(slots) if s.reminders])
        )
    return phases


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.peak", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="one 500-row burst, a 2-slot week")
    parser.add_argument("--bursts", default=None, help="comma-separated burst sizes")
    parser.add_argument("--week-slots", type=int, default=None, help="quarter hours fed (8)")
    parser.add_argument("--week-scales", default="1,10", help="multiples of the target load")
    parser.add_argument("--plan", action="store_true", help="print the feed and exit")
    parser.add_argument("--json", default=None, help="write every figure to this file")
    parser.add_argument(
        "--dedup",
        choices=("postgres", "sqlite"),
        default="postgres",
        help="the reference consumer's de-dup store (postgres: the shared one, as compose makes it)",
    )
    args = parser.parse_args(argv)
    try:
        sizes = args.bursts or ",".join(map(str, QUICK_BURSTS if args.quick else BURSTS))
        args.bursts = [int(x) for x in sizes.split(",") if x.strip()]
        args.week_scales = [int(x) for x in args.week_scales.split(",") if x.strip()]
    except ValueError:
        parser.error("--bursts and --week-scales take comma-separated integers")
    args.week_slots = args.week_slots or (2 if args.quick else 8)
    phases = plan(args)
    for name, feeds in phases:
        print(f"{name}: " + ", ".join(f"+{i} min {n:,}" for i, n, _ in feeds))
    if args.plan:
        return 0
    results: list[Phase] = []
    started = time.time()
    with servers() as srv, contextlib.ExitStack() as stack:
        from reminder_pipeline.messaging.kafka import ensure_topic
        from reminder_pipeline_testkit.dedup_store import dedup_database

        from ._dagster import Reader

        dedup_url = (
            stack.enter_context(dedup_database(srv.admin_url)) if args.dedup == "postgres" else None
        )

        ensure_topic(srv.kafka)
        daemon, dsn, _, instance = _start_daemon(srv)
        reader = Reader(srv.bootstrap_servers)
        reader.start()
        consumer = ConsumerThread(srv, dedup_url)
        consumer.start()
        sampler = RssSampler(daemon.pid)
        sampler.start()
        try:
            progress("peak: daemon started; the first tick warms it up")
            time.sleep(max(0.0, _next_minute(time.time(), 0).timestamp() + 15 - time.time()))
            for name, feeds in phases:
                first = _next_minute(time.time(), 25)
                dated = [(first + timedelta(minutes=i), n, d) for i, n, d in feeds]
                progress(f"peak: {name}")
                phase = run_phase(name, dsn, reader, sampler, dated, consumer)
                results.append(phase)
                progress(f"peak: {json.dumps(phase.summary())}")
        finally:
            sampler.stopped.set()
            consumer.stop_event.set()
            consumer.join(30)
            reader.stop()
            daemon.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                daemon.wait(30)
            if daemon.poll() is None:
                daemon.kill()
            instance.dispose()  # type: ignore[attr-defined]
    print(
        f"\nbenchmarks.peak on {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, "
        f"{os.cpu_count()} CPUs, {time.time() - started:.0f} s"
    )
    print(_table(results))
    if args.json:
        with open(args.json, "w") as f:
            json.dump([p.summary() for p in results], f, indent=2, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
