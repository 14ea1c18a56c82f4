"""The dispatcher in a database it shares (issue 41): two stacks side by side in the same minutes,
stack B beside a snapshot held from the start, as a report, ``pg_dump`` or a replica with
``hot_standby_feedback`` holds one.

``python -m benchmarks.shared_db`` starts two identical stacks (``_shared_db_stack``: each its own
embedded PostgreSQL 18 with ``pg_stat_statements`` and its own broker, the schema at this code's
head). On B only, one session runs ``BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT count(*) FROM
event_reminders;`` and keeps the transaction open, idle, for the whole run (``_snapshot``). Then
the same feeder on both: reminders falling due every second at the phase's rate (default 4
minutes at 300/s, then 5 at 1000/s), each minute's rows inserted 20 s before the minute, as the
calendar materialises them; and ``reminder-pipeline dispatch --json`` (the command, the real code
path) on both at the start of every minute, plus ``--tail`` minutes with nothing fed.

Per minute and stack it prints the due statement's mean server time, buffers and due-index
entries per execution, the cycle's duration and its statements' server time, the rows still due
at the cycle's AsOf right after it, the cycle's max lateness, the dead tuples of
``event_reminders`` and ``outbox``, the sizes of the due index and of ``ix_outbox_unpublished``,
who holds back the xmin horizon, and B/A of each; every index of the two tables at the run's start
and end on each stack (the due index and the outbox's stay bounded without a snapshot); then the
verdicts of issue 41's done-when
(PASS / MISS / INFO) with the date and the load average. Progress lines on stderr, the tables on
stdout; the exit code is non-zero only when a figure could not be measured.

``--plan`` prints the minutes it would feed and exits; ``--verdicts REPORT`` judges the report a
run wrote with ``--json`` again (the done-when's bounds as this code has them) and exits, writing
the report with those verdicts to ``--json``'s file when given. Neither starts a server.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import statistics
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

from reminder_pipeline_testkit.held_snapshot import HeldSnapshot

from ._infra import progress, servers
from ._shared_db_stack import PG_SETTINGS, Sample, Stack, prepare

DEFAULT_PHASES = "4@300,5@1000"
#: Issue 41's done-when: B's max lateness, B's median dispatch against A's in the last phase,
#: and B's dispatch time at the end of a long phase against its beginning.
MAX_LATENESS_S = 120.0
DISPATCH_FACTOR, DISPATCH_SLACK_S = 2.0, 2.0
DRIFT_FACTOR, DRIFT_WINDOW = 1.5, 10
#: Each minute's rows are inserted this long before the minute (at most half an interval).
FEED_LEAD_S = 20.0


def parse_phases(spec: str) -> list[tuple[int, float]]:
    """``4@300,5@1000`` -> [(4, 300.0), (5, 1000.0)]: minutes at reminders a second."""
    phases = []
    for part in spec.split(","):
        minutes, _, rate = part.strip().partition("@")
        try:
            phase = (int(minutes), float(rate))
        except ValueError:
            raise ValueError(f"a phase is MINUTES@RATE, e.g. 4@300: {part.strip()!r}") from None
        if phase[0] < 1 or phase[1] < 0:
            raise ValueError(f"a phase needs at least one minute and a rate >= 0: {part!r}")
        phases.append(phase)
    return phases


def minute_rates(phases: list[tuple[int, float]], tail: int) -> list[float]:
    """The rate each dispatch's minute was fed at (the tail's minutes at 0)."""
    return [rate for minutes, rate in phases for _ in range(minutes)] + [0.0] * tail


# --- the run ------------------------------------------------------------------------------------


def _feeder(stack: Stack, t0: float, rates: list[float], interval: int, stop: threading.Event):
    lead = min(FEED_LEAD_S, interval / 2)
    for k, rate in enumerate(rates):
        start = t0 + k * interval
        if stop.wait(max(0.0, start - lead - time.time())) or rate == 0:
            continue
        try:
            took = stack.feed(datetime.fromtimestamp(start, UTC), round(rate * interval), interval)
        except Exception as exc:  # noqa: BLE001 - reported with the run, the run goes on
            stack.feed_lines.append(f"minute {k + 1}: feed failed: {type(exc).__name__}: {exc}")
            continue
        if time.time() > start:
            stack.feed_lines.append(
                f"minute {k + 1}: its rows were in {time.time() - start:.1f} s after the first "
                f"fell due (the insert took {took:.1f} s)"
            )


def _dispatcher(stack: Stack, t0: float, rates: list[float], interval: int) -> None:
    """A dispatch at the start of each minute (or at once when the one before overran it)."""
    for minute, rate in enumerate(rates, start=1):
        time.sleep(max(0.0, t0 + minute * interval - time.time()))
        try:
            sample = stack.dispatch(minute, rate, t0)
        except Exception as exc:  # noqa: BLE001 - one minute not measured, the run goes on
            sample = Sample(minute, rate, round(time.time() - t0, 1), -1, 0.0, None)
            sample.error = f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}"
            stack.samples.append(sample)
        progress(_progress_line(stack.name, minute, len(rates), sample))


def run(args: argparse.Namespace) -> dict:
    phases, interval = args.phases, args.interval
    rates = minute_rates(phases, args.tail)
    fed = rates[: len(rates) - args.tail]
    started = time.time()
    names = ["B"] if args.single else ["A", "B"]
    with contextlib.ExitStack() as exit_stack:
        stacks: list[Stack] = []
        for name in names:
            progress(f"shared_db: stack {name}: PostgreSQL, broker, schema")
            srv = exit_stack.enter_context(
                servers(args.keep_workdir, stat_statements=True, own=True, settings=PG_SETTINGS)
            )
            stack = prepare(name, srv)
            exit_stack.callback(stack.engine.dispose)
            stacks.append(stack)
            if args.keep_workdir:
                progress(f"shared_db: stack {name} keeps {srv.workdir}")
        sizes_at_start = {s.name: s.index_sizes() for s in stacks}
        b = stacks[-1]
        b.snapshot = HeldSnapshot(b.harness_dsn)
        b.snapshot.take()
        exit_stack.callback(b.snapshot.release)
        progress(f"shared_db: stack B: a REPEATABLE READ snapshot held (pid {b.snapshot.pid})")
        lead = min(FEED_LEAD_S, interval / 2)
        t0 = math.ceil((time.time() + lead + 2) / interval) * interval
        stop = threading.Event()
        feeders = [
            threading.Thread(target=_feeder, args=(s, t0, fed, interval, stop), daemon=True)
            for s in stacks
        ]
        for thread in feeders:
            thread.start()
        progress(
            f"shared_db: {len(fed)} minutes fed ({_phases_text(phases)}) + {args.tail} tail, "
            f"a dispatch every {interval} s from {datetime.fromtimestamp(t0 + interval, UTC):%H:%M:%S} UTC"
        )
        # Each stack on its own clock: one whose dispatch overruns its minute delays only itself.
        dispatchers = [
            threading.Thread(target=_dispatcher, args=(s, t0, rates, interval), daemon=True)
            for s in stacks
        ]
        try:
            for thread in dispatchers:
                thread.start()
            for thread in dispatchers:
                thread.join()
        finally:
            stop.set()
            for thread in feeders:
                thread.join(60)
        snapshot_end = b.snapshot.state(b.harness_dsn)
        sizes_at_end = {s.name: s.index_sizes() for s in stacks}
    return {
        "started_utc": datetime.fromtimestamp(started, UTC).strftime("%Y-%m-%d %H:%M"),
        "wall_s": round(time.time() - started),
        "cpus": os.cpu_count(),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "phases": [{"minutes": m, "rate_per_s": r} for m, r in phases],
        "tail_minutes": args.tail,
        "interval_s": interval,
        "single": args.single,
        "snapshot": {
            "held_on": "B",
            "application_name": b.snapshot.application_name,
            "at_end": snapshot_end,
        },
        "due_statement_found": {s.name: s.due_queryid is not None for s in stacks},
        "feed_notes": {s.name: s.feed_lines for s in stacks},
        "stacks": {s.name: [x.as_dict() for x in s.samples] for s in stacks},
        "index_sizes": {
            s.name: {"start": sizes_at_start[s.name], "end": sizes_at_end[s.name]} for s in stacks
        },
    }


def _phases_text(phases: list[tuple[int, float]]) -> str:
    return ", ".join(f"{m} min @ {r:g}/s" for m, r in phases)


def _progress_line(name: str, minute: int, total: int, s: Sample) -> str:
    due = "-" if s.due_ms is None else f"{s.due_ms:.1f} ms {_num(s.due_buffers)} buffers"
    return (
        f"shared_db: {name} minute {minute}/{total} @ {s.rate:g}/s (+{s.started_s:.0f} s): "
        f"dispatch {_num(s.dispatch_s, 1)} s, {s.sent:,} sent, due query {due}, "
        f"{_num(s.left_due)} left due{'; ' + s.error if s.error else ''}"
    )


# --- the verdicts -------------------------------------------------------------------------------


def verdicts(report: dict) -> list[dict]:
    """Issue 41's done-when, from the run's samples: each with measured, target and result."""
    b = [Sample(**x) for x in report["stacks"]["B"]]
    a = [Sample(**x) for x in report["stacks"].get("A", [])]
    out = []
    left = [s.left_due for s in b]
    out.append(
        {
            "figure": "B leaves no due row behind after any dispatch",
            "target": "0 rows due at AsOf after each",
            "measured": "not measured" if None in left else f"max {max(left):,} left",
            "result": "ERROR" if None in left else ("PASS" if max(left) == 0 else "MISS"),
        }
    )
    # The rows sent, and those still due at a cycle's end (late already, whenever they go).
    late = [x for s in b for x in (s.max_lateness_s, s.oldest_due_s) if x is not None]
    out.append(
        {
            "figure": "B's max lateness (sent, or still due after a dispatch)",
            "target": f"<= {MAX_LATENESS_S:.0f} s",
            "measured": f"{max(late):.1f} s" if late else "nothing sent",
            "result": ("PASS" if max(late) <= MAX_LATENESS_S else "MISS") if late else "ERROR",
        }
    )
    last_rate = report["phases"][-1]["rate_per_s"]
    last = _last_phase(report)
    b_last = [s.dispatch_s for s in b if s.minute in last and s.dispatch_s is not None]
    if a:
        a_last = [s.dispatch_s for s in a if s.minute in last and s.dispatch_s is not None]
        if a_last and b_last:
            mb, ma = statistics.median(b_last), statistics.median(a_last)
            bound = DISPATCH_FACTOR * ma + DISPATCH_SLACK_S
            ratio = f" ({mb / ma:.1f}x)" if ma > 0 else ""
            measured, result = (
                f"B {mb:.1f} s, A {ma:.1f} s: bound {bound:.1f} s{ratio}",
                "PASS" if mb <= bound else "MISS",
            )
        else:
            measured, result = "not measured", "ERROR"
        out.append(
            {
                "figure": f"B's median dispatch at {last_rate:g}/s (the last phase)",
                "target": f"<= {DISPATCH_FACTOR:g} x A's + {DISPATCH_SLACK_S:g} s",
                "measured": measured,
                "result": result,
            }
        )
    for name, samples in (("B", b), ("A", a)):
        if samples:
            out.append(_drift(name, samples, last, last_rate, judged=name == "B"))
    return out


def _last_phase(report: dict) -> set[int]:
    """The minutes (dispatches) of the last phase, the tail left out."""
    fed = sum(p["minutes"] for p in report["phases"])
    return set(range(fed - report["phases"][-1]["minutes"] + 1, fed + 1))


def _drift(name: str, samples: list[Sample], last: set[int], rate: float, judged: bool) -> dict:
    times = [s.dispatch_s for s in samples if s.minute in last and s.dispatch_s is not None]
    window = DRIFT_WINDOW if len(times) >= 2 * DRIFT_WINDOW else len(times) // 2
    span = f"last {window} min against the first {window}" if window else "end against start"
    figure = f"{name}'s dispatch time, {span} at {rate:g}/s"
    target = f"<= {DRIFT_FACTOR:g}x (judged on {DRIFT_WINDOW} of at least {2 * DRIFT_WINDOW} min)"
    if window == 0:
        return {"figure": figure, "target": target, "measured": "too short", "result": "INFO"}
    first, end = sum(times[:window]), sum(times[-window:])
    ratio = end / first if first else math.inf
    full = window == DRIFT_WINDOW and judged
    return {
        "figure": figure,
        "target": target,
        "measured": f"{end:.1f} s against {first:.1f} s ({ratio:.2f}x)",
        "result": ("PASS" if ratio <= DRIFT_FACTOR else "MISS") if full else "INFO",
    }


# --- the tables ---------------------------------------------------------------------------------


def _num(value: float | int | None, digits: int | None = None) -> str:
    if value is None:
        return "-"
    if digits is not None:
        return f"{value:.{digits}f}"
    if abs(value) >= 100_000:
        return f"{value / 1000:.0f}k"
    if abs(value) >= 1000:
        return f"{value / 1000:.1f}k"
    if isinstance(value, int) or float(value).is_integer():
        return f"{int(value)}"
    if abs(value) >= 100:
        return f"{value:.0f}"
    return f"{value:.2g}" if abs(value) < 1 else f"{value:.1f}"


def _pair(a: float | int | None, b: float | int | None, digits: int | None = None) -> str:
    ratio = "" if not a or b is None or a <= 0 else f" {b / a:.{0 if b / a >= 10 else 1}f}x"
    return f"{_num(a, digits)} / {_num(b, digits)}{ratio}"


def tables(report: dict) -> str:
    """The run's two tables (the dispatch; what the snapshot keeps) and the verdicts."""
    b = {x["minute"]: x for x in report["stacks"]["B"]}
    a = {x["minute"]: x for x in report["stacks"].get("A", [])}
    phases = [(p["minutes"], p["rate_per_s"]) for p in report["phases"]]
    tail = f", then {report['tail_minutes']} min with nothing fed" if report["tail_minutes"] else ""
    lines = [
        f"benchmarks.shared_db on {report['started_utc']} UTC, {report['cpus']} CPUs, "
        f"{report['wall_s']} s, load {' '.join(map(str, report['load_average']))}: "
        f"{_phases_text(phases)}{tail}; a dispatch "
        f"every {report['interval_s']} s on each stack; B beside a REPEATABLE READ snapshot held "
        "from the start" + (" (stack B only: --single)" if report["single"] else ""),
        "",
        "the dispatch, A / B and B/A (due query: server time, buffers and due-index entries per "
        "execution; dispatch: the cycle's duration; server: its statements' time; left due: at its AsOf)",
    ]
    head = (
        f"{'min':>3} {'rate/s':>6}  {'due query ms':>22}  {'buffers/query':>22}  "
        f"{'index entries/query':>22}  {'dispatch s':>20}  {'server s':>20}  "
        f"{'left due':>15}  {'max late s':>13}"
    )
    lines.append(head)
    for minute, x in b.items():
        y = a.get(minute, {})
        lines.append(
            f"{minute:>3} {x['rate']:>6g}  {_pair(y.get('due_ms'), x['due_ms']):>22}  "
            f"{_pair(y.get('due_buffers'), x['due_buffers']):>22}  "
            f"{_pair(y.get('due_index_reads'), x['due_index_reads']):>22}  "
            f"{_pair(y.get('dispatch_s'), x['dispatch_s'], 1):>20}  "
            f"{_pair(y.get('server_s'), x['server_s'], 2):>20}  "
            f"{_num(y.get('left_due')) + ' / ' + _num(x['left_due']):>15}  "
            f"{_num(y.get('max_lateness_s'), 0) + ' / ' + _num(x['max_lateness_s'], 0):>13}"
        )
    lines += [
        "",
        "what the snapshot keeps, A / B and B/A (dead tuples: pg_stat_user_tables.n_dead_tup; "
        "index sizes: pg_relation_size; xmin holder: the oldest session holding back the horizon)",
        f"{'min':>3}  {'dead event_reminders':>22}  {'dead outbox':>22}  "
        f"{'due index MB':>20}  {'outbox index MB':>20}  {'xmin holder A':>16}  "
        f"{'xmin holder B (age s, xids)':>40}",
    ]
    for minute, x in b.items():
        y = a.get(minute, {})
        lines.append(
            f"{minute:>3}  {_pair(y.get('dead_reminders'), x['dead_reminders']):>22}  "
            f"{_pair(y.get('dead_outbox'), x['dead_outbox']):>22}  "
            f"{_pair(y.get('due_index_mb'), x['due_index_mb'], 1):>20}  "
            f"{_pair(y.get('outbox_index_mb'), x['outbox_index_mb'], 2):>20}  "
            f"{_holder(y) if y else '-':>16}  {_holder(x):>40}"
        )
    lines += index_size_lines(report)
    lines += ["", *verdict_lines(report)]
    for name, notes in report["feed_notes"].items():
        lines += [f"  feed {name}: {note}" for note in notes]
    return "\n".join(lines)


def index_size_lines(report: dict) -> list[str]:
    """Every index of the queue tables at the run's start and end, MB, per stack (a report
    written before the sizes were recorded has none: no lines)."""
    sizes = report.get("index_sizes")
    if not sizes:
        return []
    names = sorted({n for stack in sizes.values() for n in stack["end"]})
    order = [n for n in ("A", "B") if n in sizes]
    lines = [
        "",
        "every index of the queue tables at the start and the end of the run, MB "
        "(pg_relation_size; A: no snapshot held, B: beside it)",
        f"{'index':<50}" + "".join(f"{f'{n} start -> end':>20}" for n in order),
    ]
    for name in names:
        cells = [
            f"{sizes[n]['start'].get(name, 0) / 2**20:.2f} -> {sizes[n]['end'].get(name, 0) / 2**20:.2f}"
            for n in order
        ]
        lines.append(f"{name:<50}" + "".join(f"{c:>20}" for c in cells))
    return lines


def verdict_lines(report: dict) -> list[str]:
    """The verdicts of issue 41's done-when, one line each under a heading."""
    lines = ["verdicts (issue 41, done when):"]
    for v in verdicts(report):
        lines.append(f"  {v['figure']:<62} {v['target']:<44} {v['measured']:<44} {v['result']}")
    return lines


def plan_lines(phases: list[tuple[int, float]], tail: int, interval: int) -> list[str]:
    """What a run would feed: the phases, then each minute's rate and reminders."""
    lines = [
        f"shared_db plan: {_phases_text(phases)}, then {tail} min with nothing fed; a dispatch "
        f"every {interval} s on each stack"
    ]
    for minute, rate in enumerate(minute_rates(phases, tail), start=1):
        fed = f"{rate:g}/s, {round(rate * interval):,} reminders" if rate else "nothing fed"
        lines.append(f"  minute {minute}: {fed}")
    return lines


def _holder(x: dict) -> str:
    if not x.get("holder"):
        return "none"
    return f"{x['holder']} ({_num(x['holder_age_s'], 0)} s, {_num(x['holder_xmin_age'])})"


# --- the command --------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.shared_db", description=__doc__)
    parser.add_argument(
        "--phases",
        default=DEFAULT_PHASES,
        help=f"MINUTES@RATE,... reminders falling due a second ({DEFAULT_PHASES})",
    )
    parser.add_argument(
        "--minutes", type=int, default=None, help="one phase of M minutes at --rate instead"
    )
    parser.add_argument("--rate", type=float, default=300.0, help="--minutes' rate a second (300)")
    parser.add_argument("--tail", type=int, default=1, help="minutes with nothing fed at the end")
    parser.add_argument("--single", action="store_true", help="stack B only (the long run)")
    parser.add_argument("--json", default=None, metavar="FILE", help="write every figure here")
    parser.add_argument("--plan", action="store_true", help="print the minutes fed and exit")
    parser.add_argument(
        "--verdicts",
        default=None,
        metavar="REPORT",
        help="judge the report a run wrote with --json again and exit (no servers)",
    )
    parser.add_argument("--keep-workdir", action="store_true", help="keep the servers' dirs")
    # Internal, for the smoke test: the "minute" in seconds.
    parser.add_argument("--interval", type=int, default=60, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    try:
        args.phases = parse_phases(
            f"{args.minutes}@{args.rate:g}" if args.minutes is not None else args.phases
        )
    except ValueError as exc:
        parser.error(str(exc))
    if args.tail < 0 or args.interval < 2:
        parser.error("--tail must be >= 0 (and the interval >= 2 s)")
    if args.plan:
        print("\n".join(plan_lines(args.phases, args.tail, args.interval)))
        return 0
    if args.verdicts:
        return _judge_again(Path(args.verdicts), args.json)
    report = run(args)
    report["verdicts"] = verdicts(report)
    print(tables(report))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2, default=str)
    unmeasured = not all(report["due_statement_found"].values()) or any(
        x["error"] for samples in report["stacks"].values() for x in samples
    )
    return 1 if unmeasured or any(v["result"] == "ERROR" for v in report["verdicts"]) else 0


def _judge_again(path: Path, out: str | None) -> int:
    """``--verdicts``: the verdicts of a report already written, printed (and written to ``out``)."""
    report = json.loads(path.read_text())
    report["verdicts"] = verdicts(report)
    print("\n".join(verdict_lines(report)))
    if out:
        with open(out, "w") as f:
            json.dump(report, f, indent=2, default=str)
    return 1 if any(v["result"] == "ERROR" for v in report["verdicts"]) else 0


if __name__ == "__main__":
    sys.exit(main())
