"""A seeded fault soak of the real local stack (issue 26): nothing lost, nothing doubled, nothing
sent after a cancel, whatever breaks and comes back.

``python -m benchmarks.soak --minutes N --seed S [--json]`` starts embedded PostgreSQL (the
application's and Dagster's databases) with an asynchronous streaming replica, a second embedded
PostgreSQL for the consumer's shared de-dup store, the broker, ``dagster-daemon run`` with the
shipped every-minute schedule and the reference consumer (``reminder-pipeline consume`` with
``REMINDER_CONSUMER_DEDUP_URL``), all on free ports in a temp dir, the application's PostgreSQL
reached through fault proxies. For N minutes a calendar workload runs (``_soak_load``: events
created, cancelled and moved while their reminders fall due; bursts on the compressed hour's :00
and :30) while the faults of a plan that depends only on S and N (``_soak_plan``) are injected:
a run worker SIGKILLed mid-drain, the daemon SIGKILLed and restarted, PostgreSQL restarted fast
and immediate, the de-dup database restarted, the broker paused (SIGSTOP/SIGCONT), the consumer
SIGKILLed and restarted; PostgreSQL's, the broker's and the de-dup store's packets dropped,
PostgreSQL a stuck peer and slowed, a COMMIT cut before its answer, once a failover to a
replica that lost the last commits, and once a REPEATABLE READ snapshot held open for several
minutes (``long_snapshot``: the xmin horizon held back while the load runs). Then it waits for the pipeline to drain and checks
(``_soak_check``); what it judged is kept as ``outcomes.json`` in the work dir (``--keep-workdir``),
and ``--check FILE`` judges such a file again (no servers).

Packet drops need a network namespace of its own: the command re-runs itself under ``unshare -n``
(root and iptables; without them it refuses in one line). The plan goes to stderr first
(``--plan`` prints it and exits, no servers; with ``--json`` one JSON object a line, and
``--seed`` may then name several: ``0-99,4242``); the report goes to stdout, as a table or
(``--json``) one JSON object whose top-level keys include ``faults``, ``checked``, ``lost``,
``doubled``, ``sent_after_cancel`` and ``recovery_max_s``. The exit code is 1 when an invariant
failed (lost, doubled or sent after cancel), 2 when the soak cannot run here, 0 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import psycopg

from ._infra import progress
from ._soak_plan import Fault, needs_own_network, plan_faults, plan_lines, plan_record, scale

#: After the last fault: how long to wait at most for every due reminder to be notified.
DRAIN_TIMEOUT_S = 420.0
#: An armed fault waits at least this long for its moment (a burst comes every other minute).
ARMED_WAIT_S = 130.0


def _inject_all(stack, plan: tuple[Fault, ...], t0: float, end: float, records: list) -> None:
    """Each fault at its planned moment (or as soon as the one before is over). The kinds that
    wait for their moment (a run worker mid-drain, a COMMIT to cut) are armed in the background
    while the plan goes on; returns when every fault is over."""
    from ._soak_plan import ARMED_KINDS
    from ._soak_stack import FaultRecord

    armed: list[threading.Thread] = []
    for fault in plan:
        wait = t0 + fault.at_s - time.time()
        if wait > 0:
            time.sleep(wait)
        record = FaultRecord(fault.kind, fault.at_s)
        records.append(record)
        variant = f" {fault.variant}" if fault.variant else ""
        progress(f"soak: fault {fault.kind}{variant} (planned +{fault.at_s:.0f} s)")
        # A waiting kind has until the workload ends (at least ARMED_WAIT_S), or is reported as
        # not injected.
        deadline = max(time.time() + ARMED_WAIT_S, end)
        if fault.kind in ARMED_KINDS:
            thread = threading.Thread(
                target=_inject_one, args=(stack, fault, record, deadline), daemon=True
            )
            thread.start()
            armed.append(thread)
        else:
            _inject_one(stack, fault, record, deadline)
    for thread in armed:
        thread.join()


def _inject_one(stack, fault: Fault, record, deadline: float) -> None:
    try:
        stack.inject(record, fault.down_s, deadline, fault.variant)
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


def run(minutes: float, seed: int, rate: float, burst: int, keep: bool, own_network: bool) -> dict:
    from ._soak_check import check, read_rows, read_topic, write_outcomes
    from ._soak_load import LEAD_SECONDS, Workload
    from ._soak_stack import Stack

    plan = plan_faults(seed, minutes)
    workdir = Path(tempfile.mkdtemp(prefix="rp-soak-"))
    stack = Stack(
        workdir,
        own_network=own_network,
        replica=any(f.kind == "failover" for f in plan),
        # A full-scale run's silent faults each hold a tick; a short run's seldom wait for one.
        tick_aim_s=60.0 * scale(minutes),
    )
    records: list = []
    started = time.time()
    try:
        stack.start()
        # The calendar starts now: it creates each event LEAD_SECONDS before its reminder falls
        # due, so reminders fall due from t0 on (the first fault's window holds some) while the
        # daemon loads the code and ticks for the first time.
        t0 = time.time() + LEAD_SECONDS
        end = t0 + minutes * 60
        workload = Workload(stack.app_dsn, seed, t0 - LEAD_SECONDS, end, rate, burst)
        workload.start()
        progress("soak: waiting for the schedule's first successful run")
        _wait_first_run(stack)
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
        write_outcomes(workdir / "outcomes.json", rows, topic, notified, records, events)
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
                        **(held or {}),
                        "held_no_reminder": held is not None and not sum(held.values()),
                    }
                    for r, held in zip(records, report["fault_windows"], strict=True)
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
    parser.add_argument(
        "--seed", default="1", help="the fault plan's seed (1); with --plan several: 0-99,4242"
    )
    parser.add_argument("--rate", type=float, default=30.0, help="reminders a minute (30)")
    parser.add_argument("--burst", type=int, default=500, help="reminders per burst (500)")
    parser.add_argument("--json", action="store_true", help="print the report as one JSON object")
    parser.add_argument("--plan", action="store_true", help="print the fault plan and exit")
    parser.add_argument(
        "--check",
        metavar="OUTCOMES",
        help="judge a kept run's outcomes.json again and exit (no servers)",
    )
    parser.add_argument("--keep-workdir", action="store_true", help="keep logs and data dirs")
    # Internal: set by the command itself when it re-runs under `unshare -n`.
    parser.add_argument("--in-own-network", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    try:
        seeds = _seeds(args.seed)
    except ValueError as exc:
        parser.error(str(exc))
    if args.minutes <= 0:
        parser.error("--minutes must be more than 0")
    if args.check:
        return _check_again(Path(args.check), args.json)
    if args.plan:
        for seed in seeds:
            if args.json:
                print(json.dumps(plan_record(seed, args.minutes)))
            else:
                print("\n".join(plan_lines(seed, args.minutes)))
        return 0
    if len(seeds) > 1:
        parser.error("--seed names one seed for a run (several only with --plan)")
    args.seed = seeds[0]
    plan = plan_faults(args.seed, args.minutes)
    if needs_own_network(plan) and not args.in_own_network:
        return _rerun_in_own_network(sys.argv[1:] if argv is None else argv, args.minutes)
    for line in plan_lines(args.seed, args.minutes):
        progress(line)
    report = run(
        args.minutes, args.seed, args.rate, args.burst, args.keep_workdir, args.in_own_network
    )
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
            empty = "  (window held no reminder)" if entry["held_no_reminder"] else ""
            print(
                f"  +{entry['at_s']:7.1f} s {entry['kind']:<28} {entry['lasted_s']:6.1f} s  "
                f"{entry['detail']}{_held_text(entry)}{empty}"
            )
        print(json.dumps({k: report[k] for k in ("workload", "supervised_restarts")}))
        _print_examples(report)
    return _exit_code(report)


def _seeds(text: str) -> list[int]:
    """``26``, ``1,5,20-29``: every seed named, in order."""
    seeds: list[int] = []
    for part in text.split(","):
        match = re.fullmatch(r"\s*(\d+)(?:-(\d+))?\s*", part)
        if match is None:
            raise ValueError(f"--seed takes seeds such as 26 or 0-99,4242, not {text!r}")
        low, high = int(match[1]), int(match[2] or match[1])
        seeds += range(low, high + 1)
    return seeds


def _check_again(path: Path, as_json: bool) -> int:
    """``--check``: the outcomes a run kept, judged again by this code's checker."""
    from ._soak_check import check, read_outcomes, table

    report = check(*read_outcomes(path))
    if as_json:
        print(json.dumps(report, default=str))
    else:
        print(table(report))
        _print_examples(report)
    return _exit_code(report)


def _print_examples(report: dict) -> None:
    for what, examples in report["examples"].items():
        for rid, why in examples.items():
            print(f"  {what}: reminder {rid}: {why}")


def _exit_code(report: dict) -> int:
    """1 when an invariant failed (lost, doubled or sent after cancel), else 0."""
    failed = report["lost"] or report["doubled"] or report["sent_after_cancel"]
    return 1 if failed else 0


def _held_text(entry: dict) -> str:
    if "due_in_window" not in entry:
        return ""
    return f"; {entry['due_in_window']} due in it, {entry['in_flight']} in flight"


def _rerun_in_own_network(argv: list[str], minutes: float) -> int:
    """This command again under ``unshare -n`` (its own loopback, iptables of its own)."""
    from reminder_pipeline_testkit.netns import netns_unavailable, run_in_own_network

    reason = netns_unavailable()
    if reason is not None:
        print(
            f"benchmarks.soak: the packet-drop faults need a network namespace of their own: "
            f"{reason}",
            file=sys.stderr,
        )
        return 2
    argv = [sys.executable, "-m", "benchmarks.soak", *argv, "--in-own-network"]
    # Setup, the workload, the injections running late, the drain, the check: generous.
    timeout = 2 * minutes * 60 + DRAIN_TIMEOUT_S + 1800
    return run_in_own_network(argv, timeout=timeout, capture=False).returncode


if __name__ == "__main__":
    sys.exit(main())
