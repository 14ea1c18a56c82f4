"""Migrations a DBA runs at noon: ``db upgrade`` from 0006 to head while the calendar writes.

    python -m benchmarks.migration_live [--reminders N] [--writers W] [--rate R] [--baseline-seconds S]

Starts its own embedded PostgreSQL (or uses DATABASE_URL, in a scratch database; no broker),
migrates a scratch database to 0006 and seeds a calendar of ``--reminders`` reminders, two per
event, set-based (``benchmarks/_seed.py``: history Sent/Skipped, the future Pending). Then the
calendar writes beside it the whole time: ``--writers`` threads, ``--rate`` writes a second in
all, each write one short transaction through ``reminder_pipeline/local/calendar.py`` (half of
them an event created with its two reminders, a quarter a cancel whose Pending reminders go
Skipped, a quarter a reschedule that deletes the Pending reminders and makes new ones), each
timed from its start to its commit. After ``--baseline-seconds``, ``reminder-pipeline db upgrade``
(the command line, as a DBA runs it, ``--log-level INFO``) takes the database from 0006 to head.

Prints the upgrade's duration and its steps, and the calendar writes' count, p50, p99 and longest
before the upgrade (the baseline) and during it (every write that overlapped it), with the step
that was running when the longest one started.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import statistics
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from sqlalchemy.engine import Engine

from benchmarks._infra import REPO_ROOT, progress, servers
from benchmarks._seed import seed_history
from reminder_pipeline.local import calendar
from reminder_pipeline.store import migrate
from reminder_pipeline.store.engine import make_engine

#: The revision a live calendar is at before the upgrade (issue 41).
FROM_REVISION = "0006"
#: The writes' mix: (kind, share).
MIX = (("create", 0.5), ("cancel", 0.25), ("reschedule", 0.25))


@dataclass(frozen=True)
class Write:
    """One calendar write: what, when it started (epoch seconds) and how long it took."""

    kind: str
    started: float
    seconds: float


def _seeded_event(n: int) -> uuid.UUID:
    """Event ``n`` as ``benchmarks/_seed.py`` made it (``md5('event' || n)::uuid``)."""
    return uuid.UUID(hashlib.md5(f"event{n}".encode()).hexdigest())


def _writer(
    engine: Engine, events: int, rate: float, seed: int, stop: threading.Event, out: list[Write]
) -> None:
    """The calendar at ``rate`` writes a second until ``stop``; a write that falls behind its slot
    goes at once (the load is what it is, not what the database lets through)."""
    rnd = random.Random(seed)
    created: list[uuid.UUID] = []
    kinds, weights = zip(*MIX, strict=True)
    next_at = time.monotonic()
    while not stop.is_set():
        kind = rnd.choices(kinds, weights)[0]
        event_id = (
            rnd.choice(created)
            if created and rnd.random() < 0.3
            else _seeded_event(rnd.randint(1, events))
        )
        started_wall, started = time.time(), time.perf_counter()
        try:
            if kind == "create":
                start_at = datetime.now(UTC) + timedelta(minutes=rnd.randint(90, 30 * 24 * 60))
                new = calendar.NewEvent(
                    tenant_id=uuid.uuid4(),
                    owner_user_id=uuid.uuid4(),
                    kind="Meeting",
                    start_at=start_at,
                    time_zone="Europe/Moscow",
                )
                created.append(calendar.create_event(engine, new, [60, 15]))
            elif kind == "cancel":
                calendar.cancel_event(engine, event_id)
            else:
                calendar.move_event_by(engine, event_id, timedelta(minutes=rnd.randint(-60, 180)))
        except Exception as error:  # noqa: BLE001 - a failed write is a figure, not the end
            kind = f"{kind} failed ({type(error).__name__})"
        out.append(Write(kind, started_wall, time.perf_counter() - started))
        next_at += 1 / rate
        stop.wait(max(0.0, next_at - time.monotonic()))


def _upgrade(url: str) -> tuple[float, float, int, list[dict[str, object]], str]:
    """``reminder-pipeline db upgrade`` as a DBA runs it: (start, end, exit code, log lines,
    stderr's last line)."""
    env = {**os.environ, "DATABASE_URL": url}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    started = time.time()
    proc = subprocess.run(
        [sys.executable, "-m", "reminder_pipeline.cli", "--log-level", "INFO", "db", "upgrade"],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    ended = time.time()
    lines = []
    for line in proc.stderr.splitlines():
        if line.startswith("{"):
            lines.append(json.loads(line))
    tail = (proc.stderr.strip().splitlines() or [""])[-1]
    return started, ended, proc.returncode, lines, tail


def _stats(writes: list[Write]) -> str:
    if not writes:
        return "no writes"
    ms = sorted(w.seconds * 1000 for w in writes)
    p99 = ms[min(len(ms) - 1, int(len(ms) * 0.99))]
    return (
        f"{len(ms):,} writes, p50 {statistics.median(ms):.1f} ms, p99 {p99:.1f} ms, "
        f"longest {ms[-1]:.1f} ms"
    )


def _step_at(moment: float, started: float, lines: list[dict[str, object]]) -> str:
    """The migration step that was running at ``moment`` (epoch seconds), from the log lines."""
    current = "the upgrade's start (connecting, the migration lock)"
    for line in lines:
        at = datetime.fromisoformat(str(line["ts"])).timestamp()
        if at > moment:
            break
        message = str(line.get("msg", ""))
        if message == "migration step: building index concurrently":
            current = f"CREATE INDEX CONCURRENTLY {line['index']}"
        elif message in ("migration step: index built", "migration step: done"):
            current = f"after {line.get('index') or line.get('step')}"
    return f"{current} (+{moment - started:.1f} s)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.migration_live", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--reminders", type=int, default=2_000_000, help="reminders seeded")
    parser.add_argument("--writers", type=int, default=2, help="calendar writer threads")
    parser.add_argument("--rate", type=float, default=100.0, help="calendar writes a second")
    parser.add_argument(
        "--baseline-seconds", type=float, default=30.0, help="writes timed before the upgrade"
    )
    args = parser.parse_args(argv)
    load_before = os.getloadavg()
    with servers(broker=False) as srv:
        name = srv.create_database("migration_live")
        url = srv.url(name)
        engine = make_engine(url, pool_size=args.writers + 1)
        migrate.upgrade(engine, FROM_REVISION)
        progress(f"seeding {args.reminders:,} reminders at {FROM_REVISION}")
        base = datetime.now(UTC)
        seed_history(srv.dsn(name), args.reminders, 1_000, base, progress)
        events = max(args.reminders // 2, 1)

        stop = threading.Event()
        writes: list[Write] = []
        threads = [
            threading.Thread(
                target=_writer,
                args=(engine, events, args.rate / args.writers, seed, stop, writes),
                daemon=True,
            )
            for seed in range(args.writers)
        ]
        baseline_from = time.time()
        for thread in threads:
            thread.start()
        progress(f"calendar writing at {args.rate:g}/s; baseline {args.baseline_seconds:g} s")
        stop.wait(args.baseline_seconds)
        progress(f"db upgrade {FROM_REVISION} -> head")
        started, ended, code, lines, tail = _upgrade(url)
        stop.set()
        for thread in threads:
            thread.join()
        revision = migrate.current_revision(engine)
        engine.dispose()

    load_after = os.getloadavg()
    baseline = [w for w in writes if baseline_from <= w.started and w.started + w.seconds < started]
    during = [w for w in writes if w.started < ended and w.started + w.seconds > started]
    print(
        f"migration_live: {args.reminders:,} reminders, {args.writers} writers at "
        f"{args.rate:g}/s, load average {load_before[0]:.2f} before, {load_after[0]:.2f} after"
    )
    print(
        f"db upgrade {FROM_REVISION} -> {revision}: exit {code}, {ended - started:.1f} s"
        + ("" if code == 0 else f" ({tail})")
    )
    for line in lines:
        if line.get("msg") in ("migration step: index built", "migration step: done"):
            step = line.get("index") or line.get("step")
            attempts = f", {line['attempts']} attempt(s)" if "attempts" in line else ""
            print(f"  {step}: {line['seconds']} s{attempts}")
        elif "retrying" in str(line.get("msg")):
            print(f"  retry: {line.get('table')} held by pid {line.get('holder_pid')}")
    failed = [w.kind for w in writes if "failed" in w.kind]
    if failed:
        print(f"failed calendar writes: {len(failed)} ({', '.join(sorted(set(failed)))})")
    print(f"calendar before the upgrade: {_stats(baseline)}")
    print(f"calendar during the upgrade: {_stats(during)}")
    if during:
        longest = max(during, key=lambda w: w.seconds)
        print(
            f"longest write during it: {longest.seconds * 1000:.1f} ms, a {longest.kind}, at "
            f"{_step_at(longest.started, started, lines)}"
        )
    return 0 if code == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
