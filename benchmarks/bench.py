"""The dispatcher's performance figures, each measured side by side with its baseline in one run.

    python -m benchmarks.bench [--only catchup,dueq,parallel,runs,idle,steady] [--rows N] [--backlog N]
                               [--steady-minutes M] [--quick] [--json FILE]

Starts its own embedded PostgreSQL + broker on free ports in a temp dir (or uses DATABASE_URL /
KAFKA_BOOTSTRAP_SERVERS, creating and dropping its own databases there), prints progress on
stderr and the table of figures on stdout. See benchmarks/README.md for what each figure means.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from dataclasses import asdict, dataclass
from datetime import UTC, datetime

import psutil

from benchmarks._infra import fmt_rate, progress, server_version, servers

FIGURES = ("catchup", "dueq", "parallel", "runs", "idle", "steady")


@dataclass
class Row:
    figure: str
    target: str
    measured: str
    baseline: str
    ratio: str
    result: str  # PASS / MISS / INFO / SKIP / ERROR


def _verdict(ok: bool | None) -> str:
    return "INFO" if ok is None else ("PASS" if ok else "MISS")


def machine() -> dict:
    cpu = platform.processor() or ""
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "cpu": cpu,
        "ram_gb": round(psutil.virtual_memory().total / 2**30, 1),
        "python": platform.python_version(),
        "loadavg_start": [round(x, 2) for x in os.getloadavg()],
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.bench", description=__doc__.split("\n\n")[0]
    )
    p.add_argument(
        "--only",
        default=",".join(FIGURES),
        help=f"comma-separated subset of {','.join(FIGURES)} (default: all)",
    )
    p.add_argument(
        "--rows", type=int, help="event_reminders rows for the due query (default 10,000,000)"
    )
    p.add_argument("--due", type=int, help="due Pending rows among them (default 5,000)")
    p.add_argument("--executions", type=int, help="due query executions (default 500)")
    p.add_argument(
        "--backlog", type=int, help="due backlog of the catch-up figure (default 100,000)"
    )
    p.add_argument(
        "--catchup-rounds",
        type=int,
        help="rounds of the catch-up figure (run_cycle and the Dagster run between raw runs), "
        "judged on the median round (default 5; --quick 1)",
    )
    p.add_argument(
        "--parallel-backlog", type=int, help="backlog of the parallel figure (default 50,000)"
    )
    p.add_argument(
        "--runs-backlog",
        type=int,
        default=2_000,
        help="backlog under the concurrent reminder_dispatch runs (default 2,000; "
        "at least 4 x 200)",
    )
    p.add_argument("--steady-minutes", type=float, help="steady-state feeding time (default 10)")
    p.add_argument("--idle-ticks", type=int, help="idle schedule ticks to measure (default 3)")
    p.add_argument("--rate", type=float, default=50.0, help="steady-state reminders due per minute")
    p.add_argument(
        "--without-schedules",
        default="",
        help="schedules to stop for the whole Dagster phase (comma-separated), "
        "e.g. outbox_retention_schedule, to measure what they cost",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="tiny sizes (2,000-row backlogs, 200k rows, 2-minute steady state)",
    )
    p.add_argument("--json", help="write every measurement to this file")
    p.add_argument("--keep-workdir", action="store_true", help="keep the temp dir (server logs)")
    args = p.parse_args(argv)
    quick = args.quick
    defaults = {
        "rows": 200_000 if quick else 10_000_000,
        "due": 500 if quick else 5_000,
        "executions": 100 if quick else 500,
        "backlog": 2_000 if quick else 100_000,
        "catchup_rounds": 1 if quick else 5,
        "steady_minutes": 2.0 if quick else 10.0,
        "idle_ticks": 2 if quick else 3,
    }
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.parallel_backlog is None:
        args.parallel_backlog = 2_000 if quick else max(args.backlog // 2, 1)
    only = [x.strip() for x in args.only.split(",") if x.strip()]
    unknown = sorted(set(only) - set(FIGURES))
    if unknown:
        p.error(f"unknown figure(s) {', '.join(unknown)}; choose from {', '.join(FIGURES)}")
    args.only = only
    return args


# --- the figures ----------------------------------------------------------------------------------


def fig_catchup(srv, args, rows: list[Row], details: dict) -> None:
    from benchmarks import _catchup

    res = _catchup.catchup(srv, args.backlog, rounds=args.catchup_rounds)
    details["catchup"] = res
    rounds = res["rounds"]
    median = res["median"]
    raw_rate = median["baseline_rows_per_s"]
    pipe = res["pipeline"]
    exact = all(r["verify"]["exactly_once"] for r in res["order"])
    many = len(rounds) > 1

    def spread(key: str) -> str:
        return f"; rounds {' / '.join(f'{r[key]:.2f}x' for r in rounds)}" if many else ""

    raw_desc = " / ".join(fmt_rate(r["rows_per_s"]) for r in median["raw"])
    which = f"median of {len(rounds)} rounds, " if many else ""
    rows.append(
        Row(
            f"1. catch-up {args.backlog:,} rows, run_cycle batch 1000",
            ">= 0.70x raw",
            f"{fmt_rate(pipe['rows_per_s'])} rows/s ({pipe['elapsed_s']:.1f}s)",
            f"raw {fmt_rate(raw_rate)} rows/s ({which}{raw_desc})",
            f"{median['pipeline_ratio']:.2f}x{spread('pipeline_ratio')}",
            _verdict(median["pipeline_ratio"] >= 0.70 and exact),
        )
    )
    raw_rss = max(r["peak_rss_mb"] for r in res["raw_runs"])
    pipe_rss = max(r["pipeline"]["peak_rss_mb"] for r in rounds)
    rows.append(
        Row(
            "1. catch-up peak RSS (worker process)",
            "<= 200 MB",
            f"{pipe_rss:.0f} MB",
            f"raw worker {raw_rss:.0f} MB",
            f"{pipe_rss / raw_rss:.2f}x",
            _verdict(pipe_rss <= 200),
        )
    )
    dag = res.get("dagster")
    if dag is not None:
        rows.append(
            Row(
                f"1. the same as a reminder_catch_up Dagster run (in process, {dag['batches']} batches)",
                ">= 0.80x raw",  # issue 19, item 5
                f"{fmt_rate(dag['rows_per_s'])} rows/s ({dag['elapsed_s']:.1f}s)",
                f"raw {fmt_rate(raw_rate)} rows/s",
                f"{median['dagster_ratio']:.2f}x{spread('dagster_ratio')}",
                _verdict(median["dagster_ratio"] >= 0.80 and exact),
            )
        )
    job = res.get("dispatch_job")
    if job is not None:
        rows.append(
            Row(
                "1. the same as the scheduled job, reminder_dispatch (max_batches 1000, batch 1000)",
                ">= 0.80x raw",  # issue 30, item 1
                f"{fmt_rate(job['rows_per_s'])} rows/s ({job['elapsed_s']:.1f}s)",
                f"raw {fmt_rate(raw_rate)} rows/s",
                f"{res['dispatch_job_median']['dispatch_job_ratio']:.2f}x"
                f"{spread('dispatch_job_ratio')}",
                _verdict(res["dispatch_job_median"]["dispatch_job_ratio"] >= 0.80 and exact),
            )
        )


def fig_dueq(srv, args, rows: list[Row], details: dict) -> None:
    from benchmarks import _dueq

    res = _dueq.run(
        srv,
        args.rows,
        args.executions,
        due=args.due,
        seqscan_runs=3 if args.rows >= 1_000_000 else 5,
    )
    details["dueq"] = res
    gen = res["generation"]
    rows.append(
        Row(
            f"3. due query p99, {res['generation']['rows']:,} rows / {res['due_at_measurement']:,} due",
            "<= 12 ms",
            f"p99 {res['p99_ms']:.1f} ms (p50 {res['p50_ms']:.1f})",
            f"seq scan {res['seqscan_ms']:.0f} ms",
            f"{res['seqscan_ms'] / res['p99_ms']:.1f}x faster",
            _verdict(res["p99_ms"] <= 12 and res["uses_index"]),
        )
    )
    rows.append(
        Row(
            "3. due query plan uses the partial index",
            "index scan",
            "yes" if res["uses_index"] else "NO",
            "generic plan: " + {True: "yes", False: "NO", None: "n/a"}[res["generic_uses_index"]],
            "-",
            _verdict(res["uses_index"] and res["generic_uses_index"] is not False),
        )
    )
    if res.get("prepared"):
        pr = res["prepared"]
        rows.append(
            Row(
                "3. due query, prepared statement (plan cached)",
                "<= 12 ms",
                f"p99 {pr['p99_ms']:.1f} ms (p50 {pr['p50_ms']:.1f})",
                f"generic plans {pr['generic_plans']}",
                "-",
                "INFO",
            )
        )
    rows.append(
        Row(
            "3. due query data generation",
            "-",
            f"{gen['total_s']:.0f}s ({gen['size_mb']:,} MB)",
            f"load {gen['load_s']:.0f}s, index {gen['index_s']:.0f}s, vacuum {gen['vacuum_s']:.0f}s",
            "-",
            "INFO",
        )
    )


def fig_parallel(srv, args, rows: list[Row], details: dict) -> None:
    from benchmarks import _catchup

    res = _catchup.parallel(srv, args.parallel_backlog)
    details["parallel"] = res
    one = res["runs"][1]
    for n in (2, 4):
        run = res["runs"][n]
        ok = run["wall_s"] <= one["wall_s"] and run["verify"]["exactly_once"]
        rows.append(
            Row(
                f"5. parallel x{n} over {args.parallel_backlog:,} rows (exactly once: "
                f"{'yes' if run['verify']['exactly_once'] else 'NO'})",
                "<= 1 worker's time",
                f"{run['wall_s']:.1f}s ({fmt_rate(run['rows_per_s'])} rows/s)",
                f"x1 {one['wall_s']:.1f}s ({fmt_rate(one['rows_per_s'])} rows/s)",
                f"{one['wall_s'] / run['wall_s']:.2f}x speed-up",
                _verdict(ok and one["verify"]["exactly_once"]),
            )
        )


def fig_runs(srv, args, rows: list[Row], details: dict) -> None:
    from benchmarks import _catchup

    res = _catchup.concurrent_runs(srv, args.runs_backlog)
    details["runs"] = res
    for n, run in res["runs"].items():
        ratio = run["moved"] / run["ideal"]
        once = run["verify"]["once"] and run["all_succeeded"]
        rows.append(
            Row(
                f"6. {n} reminder_dispatch run{'s' if n > 1 else ''} started together, one round "
                f"(written once: {'yes' if once else 'NO'})",
                ">= 0.90x ideal",
                f"{run['moved']:,} rows moved ({run['wall_s']:.1f}s)",
                f"ideal {n} x {res['batch_size']} = {run['ideal']:,}",
                f"{ratio:.2f}x",
                _verdict(ratio >= 0.9 and once),
            )
        )


def fig_dagster(srv, args, rows: list[Row], details: dict) -> None:
    from benchmarks import _dagster

    do_idle, do_steady = "idle" in args.only, "steady" in args.only
    missing = _dagster.dagster_available()
    if missing:
        for name in [
            n
            for n, on in (("2. steady-state lateness", do_steady), ("4. idle cycle", do_idle))
            if on
        ]:
            rows.append(Row(name, "-", "-", "-", "-", "SKIP"))
        details["dagster_error"] = missing
        return
    res = _dagster.run(
        srv,
        idle_ticks=args.idle_ticks,
        steady_minutes=args.steady_minutes,
        rate_per_minute=args.rate,
        do_idle=do_idle,
        do_steady=do_steady,
        without_schedules=tuple(n.strip() for n in args.without_schedules.split(",") if n.strip()),
    )
    details["dagster"] = {"idle": res.idle, "steady": res.steady, "error": res.error}
    if res.error:
        rows.append(Row("2/4. Dagster stack", "-", res.error[:60], "-", "-", "ERROR"))
    if do_steady and res.steady.get("p95_s") is not None:
        s = res.steady
        complete = s["missing"] == 0
        label = f"{s['received']}/{s['fed']} received, {s['minutes']:g} min"
        if args.without_schedules:
            label += f", without {args.without_schedules}"
        rows.append(
            Row(
                f"2. steady lateness p95 ({label})",
                "<= 66 s",
                f"{s['p95_s']:.1f} s (p50 {s['p50_s']:.1f})",
                f"ideal 1-min cycle {s['ideal_p95_s']:.1f} s",
                f"{s['p95_s'] / s['ideal_p95_s']:.2f}x",
                _verdict(s["p95_s"] <= 66 and complete),
            )
        )
        rows.append(
            Row(
                "2. steady lateness max",
                "<= 75 s",
                f"{s['max_s']:.1f} s",
                f"ideal 1-min cycle {s['ideal_max_s']:.1f} s",
                f"{s['max_s'] / s['ideal_max_s']:.2f}x",
                _verdict(s["max_s"] <= 75 and complete),
            )
        )
    if do_idle and res.idle.get("median_s") is not None:
        i = res.idle
        alone = i.get("alone") or {}
        if alone.get("median_s") is not None:
            base = f"dispatch schedule alone {alone['median_s']:.1f} s"
            ratio = f"{i['median_s'] / alone['median_s']:.2f}x"
        else:
            base, ratio = "issue ref: 6 s", f"{i['median_s'] / 6:.2f}x"
        rows.append(
            Row(
                f"4. idle cycle tick -> success ({len(i['tick_to_success_s'])} ticks, "
                + (
                    f"without {args.without_schedules})"
                    if args.without_schedules
                    else "as shipped)"
                ),
                "<= 7 s",
                f"{i['median_s']:.1f} s median (max {i['max_s']:.1f})",
                base,
                ratio,
                _verdict(i["median_s"] <= 7 and all(s == "SUCCESS" for s in i["statuses"])),
            )
        )
        if alone.get("median_s") is not None:
            rows.append(
                Row(
                    f"4. idle cycle, {', '.join(i['other_minute_schedules'])} stopped",
                    "<= 7 s",
                    f"{alone['median_s']:.1f} s median (max {alone['max_s']:.1f})",
                    "issue ref: 6 s",
                    f"{alone['median_s'] / 6:.2f}x",
                    "INFO",
                )
            )
        app = i["app_table_writes"]
        other = {t: d for t, d in i["writes"].items() if t not in app}
        rows.append(
            Row(
                "4. idle cycle writes to reminders/events/outbox",
                "none",
                "none" if not app else json.dumps(app),
                "other tables: "
                + (
                    ", ".join(f"{t} +{d['ins']} ins/+{d['upd']} upd" for t, d in other.items())
                    or "none"
                ),
                "-",
                _verdict(not app),
            )
        )


# --- output -----------------------------------------------------------------------------------------


def print_table(rows: list[Row], info: dict) -> None:
    headers = ("figure", "target", "measured", "baseline", "ratio", "result")
    data = [(r.figure, r.target, r.measured, r.baseline, r.ratio, r.result) for r in rows]
    widths = [
        max(len(h), *(len(d[i]) for d in data)) if data else len(h) for i, h in enumerate(headers)
    ]
    line = "  ".join("-" * w for w in widths)
    print()
    print(
        f"reminder-pipeline benchmark - {info['date']} - {info['host']}: {info['cpus']} CPUs "
        f"({info['cpu']}), {info['ram_gb']} GB RAM, Python {info['python']}, "
        f"PostgreSQL {info.get('postgres', '?')}"
    )
    print(f"load average at start {info['loadavg_start']}, at end {info.get('loadavg_end')}")
    print(line)
    print("  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)))
    print(line)
    for d in data:
        print("  ".join(c.ljust(w) for c, w in zip(d, widths, strict=True)))
    print(line)


def print_details(details: dict) -> None:
    if "catchup" in details:
        c = details["catchup"]
        print("\ncatch-up runs (same backlog, identical copies, run in this order):")
        for r in c["order"]:
            extra = ""
            if r["mode"] == "raw":
                extra = (
                    f" db {r['db_s']:.1f}s, produce {r['produce_s']:.1f}s, mark {r['mark_s']:.1f}s"
                )
            elif r["mode"] in ("dagster", "dispatch_job"):
                extra = f" event-log entries {r['event_log_entries']:,}"
            print(
                f"  {r['mode']:10} {r['rows']:>7,} rows {r['elapsed_s']:6.1f}s "
                f"{fmt_rate(r['rows_per_s']):>6} rows/s  peak RSS {r['peak_rss_mb']:.0f} MB "
                f"sent {r['sent']:,} skipped {r['skipped']:,} exactly once {r['verify']['exactly_once']}"
                + extra
            )
    if "parallel" in details:
        print("\nparallel runs:")
        for n, r in details["parallel"]["runs"].items():
            v = r["verify"]
            print(
                f"  x{n}: {r['wall_s']:.1f}s, rows per worker {r['per_worker_rows']}, "
                f"worker times {r['per_worker_s']}, relay busy {r['relay_busy']}; "
                f"sent {v['sent']:,} = outbox {v['outbox']:,}, duplicates {v['outbox_duplicates']}, "
                f"unpublished {v['unpublished']}, due left {v['pending_due']}"
            )
    if "runs" in details:
        print("\nconcurrent reminder_dispatch runs (each its own process and Dagster instance):")
        for n, r in details["runs"]["runs"].items():
            v = r["verify"]
            print(
                f"  x{n}: moved {r['moved']:,} / ideal {r['ideal']:,}, rows per run "
                f"{r['per_run_rows']}, skipped_locked per run {r['per_run_skipped_locked']}, "
                f"run times {r['per_run_s']} s; outbox {v['outbox']:,} = sent {v['sent']:,}, "
                f"duplicates {v['outbox_duplicates']}, left for the next relay pass "
                f"{v['unpublished']}"
            )
    if "dueq" in details:
        d = details["dueq"]
        print("\ndue query EXPLAIN (ANALYZE, BUFFERS), batch 200:")
        for ln in d["explain_summary"]:
            print("  " + ln)
        print(
            f"  client-side over {d['executions']} executions: p50 {d['p50_ms']:.2f} ms, "
            f"p90 {d['p90_ms']:.2f}, p99 {d['p99_ms']:.2f}, max {d['max_ms']:.2f} "
            f"(each in its own transaction, rolled back; planned each time)"
        )
        if d.get("prepared"):
            pr = d["prepared"]
            print(
                f"  prepared (PREPARE/EXECUTE): p50 {pr['p50_ms']:.2f} ms, p99 {pr['p99_ms']:.2f} ms, "
                f"generic plans {pr['generic_plans']}, custom plans {pr['custom_plans']}"
            )
    if "dagster" in details:
        dg = details["dagster"]
        i, s = dg.get("idle") or {}, dg.get("steady") or {}
        if i.get("runs"):
            print(
                f"\nidle runs (seconds after the tick; stack started in {i.get('stack_start_s', 0):.0f}s):"
            )
            for r in i["runs"]:
                print(f"  {r}")
            print(
                f"  table writes during the idle ticks: {i['writes'] or 'none'}; "
                f"transactions {i['transactions']}"
            )
            alone = i.get("alone") or {}
            if alone.get("runs"):
                print(f"idle runs with {', '.join(i['other_minute_schedules'])} stopped:")
                for r in alone["runs"]:
                    print(f"  {r}")
                print(f"  table writes: {alone['writes'] or 'none'}")
        if s:
            print(
                f"\nsteady state: {json.dumps({k: (round(v, 2) if isinstance(v, float) else v) for k, v in s.items()})}"
            )
        if dg.get("error"):
            print(f"\ndagster error: {dg['error']}")
    if details.get("dagster_error"):
        print(f"\nDagster layer not available: {details['dagster_error']}")
    for name, err in details.get("errors", {}).items():
        print(f"\n{name} failed: {err}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    info = machine()
    rows: list[Row] = []
    details: dict = {"errors": {}, "args": vars(args)}
    started = time.time()
    with servers(keep_workdir=args.keep_workdir) as srv:
        info["postgres"] = server_version(srv)
        steps = [
            ("catchup", fig_catchup),
            ("parallel", fig_parallel),
            ("runs", fig_runs),
            ("dueq", fig_dueq),
        ]
        for name, fn in steps:
            if name not in args.only:
                continue
            progress(f"=== figure: {name}")
            try:
                fn(srv, args, rows, details)
            except Exception as exc:  # noqa: BLE001 - one failed figure does not lose the others
                details["errors"][name] = f"{type(exc).__name__}: {exc}"
                rows.append(Row(name, "-", " ".join(str(exc).split())[:60], "-", "-", "ERROR"))
                progress(f"{name} failed: {exc}")
        if "idle" in args.only or "steady" in args.only:
            progress("=== figures: idle, steady (Dagster)")
            try:
                fig_dagster(srv, args, rows, details)
            except Exception as exc:  # noqa: BLE001
                details["errors"]["dagster"] = f"{type(exc).__name__}: {exc}"
                rows.append(
                    Row("2/4. dagster", "-", " ".join(str(exc).split())[:60], "-", "-", "ERROR")
                )
                progress(f"dagster figures failed: {exc}")
    info["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    info["duration_s"] = round(time.time() - started)
    rows.sort(key=lambda r: r.figure[:2])
    print_table(rows, info)
    print_details(details)
    print(f"\ntotal time {info['duration_s'] // 60:.0f} min {info['duration_s'] % 60:.0f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {"machine": info, "rows": [asdict(r) for r in rows], "details": details},
                f,
                indent=1,
                default=str,
            )
    return 0 if not details["errors"] else 1


if __name__ == "__main__":
    sys.exit(main())
