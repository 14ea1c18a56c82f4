"""A seeded fault soak of the real local stack (issue 26): nothing lost, nothing doubled, nothing
sent after a cancel, whatever breaks and comes back.

``python -m benchmarks.soak --minutes N --seed S [--json]`` starts embedded PostgreSQL (the
application's and Dagster's databases), a second embedded PostgreSQL for the consumer's shared
de-dup store, the broker, ``dagster-daemon run`` with the shipped every-minute schedule and the
reference consumer (``reminder-pipeline consume`` with ``REMINDER_CONSUMER_DEDUP_URL``), all on
free ports in a temp dir. For N minutes a calendar workload runs (``_soak_load``: events created,
cancelled and moved while their reminders fall due; bursts on the compressed hour's :00 and :30)
while the faults of a plan that depends only on S and N (``_soak_plan``) are injected:
a run worker SIGKILLed mid-drain, the daemon SIGKILLed and restarted, PostgreSQL restarted fast
and immediate, the de-dup database restarted, the broker paused (SIGSTOP/SIGCONT), the consumer
SIGKILLed and restarted. Then it waits for the pipeline to drain and checks (``_soak_check``).

The plan goes to stderr first (``--plan`` prints it and exits, no servers); the report goes to
stdout, as a table or (``--json``) one JSON object whose top-level keys include ``faults``,
``checked``, ``lost``, ``doubled``, ``sent_after_cancel`` and ``recovery_max_s``. The exit code
is 1 when an invariant failed (lost, doubled or sent after cancel), 0 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import psycopg

from ._infra import progress
from ._soak_plan import Fault, plan_faults, plan_lines

#: After the last fault: how long to wait at most for every due reminder to be notified.
DRAIN_TIMEOUT_S = 420.0


def _inject_all(stack, plan: tuple[Fault, ...], t0: float, end: float, records: list) -> None:
    from ._soak_stack import FaultRecord

    for fault in plan:
        wait = t0 + fault.at_s - time.time()
        if wait > 0:
            time.sleep(wait)
        record = FaultRecord(fault.kind, fault.at_s)
        records.append(record)
        progress(f"soak: fault {fault.kind} (planned +{fault.at_s:.0f} s)")
        # A run worker is caught within a few ticks, or the fault is reported as not injected.
        deadline = max(time.time() + 150.0, end)
        try:
            stack.inject(record, fault.down_s, deadline)
        except Exception as exc:  # noqa: BLE001 - reported, the soak goes on
            record.ended = time.time()
            record.detail = f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}"
        progress(f"soak: {fault.kind}: {record.detail} ({record.ended - record.started:.1f} s)")


def _drained(stack, workload_events: int, notified_ids: set[str]) -> tuple[bool, str]:
    """Nothing due is Pending, nothing unpublished, every Sent reminder notified."""
    try:
        with psycopg.connect(stack.app_dsn, autocommit=True, connect_timeout=10) as conn:
            pending, future, unpublished = conn.execute(
                "SELECT count(*) FILTER (WHERE status = 'Pending' AND due_at <= now()),"
                " count(*) FILTER (WHERE status = 'Pending' AND due_at > now()),"
                " (SELECT count(*) FROM outbox WHERE published_at IS NULL)"
                " FROM event_reminders"
            ).fetchone()
            sent = {
                r[0]
                for r in conn.execute(
                    "SELECT id::text FROM event_reminders WHERE status = 'Sent'"
                ).fetchall()
            }
    except psycopg.Error as exc:
        return False, f"database: {type(exc).__name__}"
    unnotified = len(sent - notified_ids)
    line = (
        f"{pending} due Pending, {future} not yet due, {unpublished} unpublished, "
        f"{unnotified} of {len(sent)} sent not notified"
    )
    return pending == 0 and future == 0 and unpublished == 0 and unnotified == 0, line


def run(minutes: float, seed: int, rate: float, burst: int, keep: bool) -> dict:
    from ._soak_check import check, read_rows, read_topic
    from ._soak_load import Workload
    from ._soak_stack import Stack

    plan = plan_faults(seed, minutes)
    workdir = Path(tempfile.mkdtemp(prefix="rp-soak-"))
    stack = Stack(workdir)
    records: list = []
    started = time.time()
    try:
        stack.start()
        progress("soak: waiting for the schedule's first successful run")
        _wait_first_run(stack)
        t0 = time.time()
        end = t0 + minutes * 60
        workload = Workload(stack.app_dsn, seed, t0, end, rate, burst)
        workload.start()
        progress(f"soak: workload for {minutes:g} min, {len(plan)} faults (workdir {workdir})")
        injector = threading.Thread(
            target=_inject_all, args=(stack, plan, t0, end, records), daemon=True
        )
        injector.start()
        injector.join()
        workload.join(max(0.0, end - time.time()) + 30)
        workload.stop()
        progress("soak: workload done; waiting for the pipeline to drain")
        deadline = time.time() + DRAIN_TIMEOUT_S
        last = ""
        while True:
            with stack.notified.lock:
                ids = {rid.lower() for _, rid, _ in stack.notified.lines}
            ok, line = _drained(stack, len(workload.events), ids)
            if line != last:
                progress(f"soak: {line}")
                last = line
            if ok or time.time() > deadline:
                break
            time.sleep(3)
        time.sleep(3)  # the consumer's last lines
        rows = read_rows(stack.app_dsn)
        topic = read_topic(stack.srv.bootstrap_servers)
        with stack.notified.lock:
            notified = list(stack.notified.lines)
        events = {str(k): v for k, v in workload.events.items()}
        report = check(rows, topic, notified, records, events)
        report.update(
            {
                "seed": seed,
                "minutes": minutes,
                "plan": [f.line().strip() for f in plan],
                "fault_log": [
                    {
                        "kind": r.kind,
                        "planned_s": r.planned_s,
                        "at_s": round(r.started - t0, 1),
                        "lasted_s": round(r.ended - r.started, 1),
                        "injected": r.injected,
                        "detail": r.detail,
                    }
                    for r in records
                ],
                "workload": {
                    "events": len(workload.events),
                    "calendar_errors": workload.errors,
                    "abandoned": workload.abandoned,
                    "cancelled": sum(1 for e in workload.events.values() if e.cancelled_at),
                    "moved": sum(e.moves for e in workload.events.values()),
                },
                "supervised_restarts": dict(stack.supervised_restarts),
                "unreadable_messages": topic.unreadable,
                "load_average": [round(x, 2) for x in os.getloadavg()],
                "started_utc": datetime.fromtimestamp(started, UTC).strftime("%Y-%m-%d %H:%M"),
                "wall_s": round(time.time() - started),
                "cpus": os.cpu_count(),
            }
        )
        return report
    finally:
        stack.stop()
        if keep:
            progress(f"soak: kept {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)


def _wait_first_run(stack, timeout: float = 300.0) -> None:
    """Until the dispatch ledger has a cycle: the daemon has loaded the code and ticked."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            with psycopg.connect(stack.app_dsn, autocommit=True) as conn:
                if conn.execute("SELECT count(*) FROM dispatch_cycles").fetchone()[0]:
                    return
        except psycopg.Error:
            pass
        time.sleep(2)
    raise RuntimeError(f"no dispatch cycle within {timeout:.0f} s; see the daemon log")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.soak", description=__doc__)
    parser.add_argument("--minutes", type=float, default=30.0, help="workload minutes (30)")
    parser.add_argument("--seed", type=int, default=1, help="the fault plan's seed (1)")
    parser.add_argument("--rate", type=float, default=30.0, help="reminders a minute (30)")
    parser.add_argument("--burst", type=int, default=500, help="reminders per burst (500)")
    parser.add_argument("--json", action="store_true", help="print the report as one JSON object")
    parser.add_argument("--plan", action="store_true", help="print the fault plan and exit")
    parser.add_argument("--keep-workdir", action="store_true", help="keep logs and data dirs")
    args = parser.parse_args(argv)
    if args.minutes <= 0:
        parser.error("--minutes must be more than 0")
    if args.plan:
        print("\n".join(plan_lines(args.seed, args.minutes)))
        return 0
    for line in plan_lines(args.seed, args.minutes):
        progress(line)
    report = run(args.minutes, args.seed, args.rate, args.burst, args.keep_workdir)
    if args.json:
        print(json.dumps(report, default=str))
    else:
        from ._soak_check import table

        print(
            f"benchmarks.soak --minutes {args.minutes:g} --seed {args.seed} on "
            f"{report['started_utc']} UTC, {report['cpus']} CPUs, {report['wall_s']} s, "
            f"load {' '.join(map(str, report['load_average']))}"
        )
        print(table(report))
        for entry in report["fault_log"]:
            print(
                f"  +{entry['at_s']:7.1f} s {entry['kind']:<28} {entry['lasted_s']:6.1f} s  "
                f"{entry['detail']}"
            )
        print(json.dumps({k: report[k] for k in ("workload", "supervised_restarts")}))
        for what, examples in report["examples"].items():
            for rid, why in examples.items():
                print(f"  {what}: reminder {rid}: {why}")
    failed = report["lost"] or report["doubled"] or report["sent_after_cancel"]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
