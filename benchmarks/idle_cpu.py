"""CPU of the whole local stack at the demo's load: ``python -m benchmarks.idle_cpu``.

``[--minutes M] [--warmup S] [--interval S] [--tree DIR] [--json FILE] [--keep-home]`` (issue 36).
It starts ``reminder-pipeline up`` (demo data and feeder on: six reminders a minute) with its own
home in a temp dir and free ports, waits for the ``Dagster UI:`` line and ``--warmup`` seconds
more, then measures ``--minutes`` minutes: the CPU-seconds of every process the stack starts
(``up`` itself with its exporter and demo feeder, the guard, PostgreSQL, the broker, the Dagster
webserver, daemon, code servers and the run workers that come and go), as a percentage of one
core, in total and per part; and the ``No heartbeat received`` lines the stack's Dagster logs
gained meanwhile (each one a code server that shut down), how many code server processes were
seen, the new PostgreSQL sessions a minute per database (``pg_stat_database.sessions``: a backend
started and ended for each, the cost a pool saves), and the machine's load average at the start
and the end (its own reading adds a session to the ``postgres`` database).

How nothing is missed: this process makes itself the stack's child subreaper
(``PR_SET_CHILD_SUBREAPER``), so even what daemonizes (``pg_ctl`` starts the postmaster) stays in
its tree. Every ``--interval`` seconds it reads ``/proc/<pid>/stat`` of each process in the tree:
its own CPU (utime + stime) and what its reaped children used (cutime + cstime). The sum of both
over the live tree (plus what this process reaped) only grows, a process that exits moving its
whole life's CPU into its parent's children's times: so the total is exact whatever starts and
ends between two samples. Parts: each process's own CPU goes to the part its command line names
(or its parent's); when a process is reaped, what its last sample had not yet seen goes to its
part (the jump in its parent's children's times); what cannot be told apart is shown as
``unattributed``. CPU-seconds, not wall time: another process loading the machine slows the stack
without adding to its figure (much; caches and frequency aside), and the machine's own load during
the window is printed for the record.

``--tree DIR`` runs ``up`` from another checkout of the project (``PYTHONPATH=DIR``, started in
``DIR``) with this virtualenv: how ``docs/benchmarks.md`` measures "before" (an older commit
unpacked with ``git archive``) beside "after".
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from benchmarks._infra import REPO_ROOT, progress

_PR_SET_CHILD_SUBREAPER = 36
_TICKS = os.sysconf("SC_CLK_TCK")
_PROC = Path("/proc")
HEARTBEAT_LINE = "No heartbeat received"
UNATTRIBUTED = "unattributed"


@dataclass(frozen=True)
class Stat:
    """One process as ``/proc/<pid>/stat`` shows it (times in seconds)."""

    pid: int
    ppid: int
    started: int
    own: float  # utime + stime
    reaped: float  # cutime + cstime


def _stat(pid: int) -> Stat | None:
    try:
        text = (_PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    fields = text[text.rfind(")") + 2 :].split()
    # After "(comm)": state ppid ... utime(12th) stime cutime cstime ... starttime(20th).
    return Stat(
        pid=pid,
        ppid=int(fields[1]),
        started=int(fields[19]),
        own=(int(fields[11]) + int(fields[12])) / _TICKS,
        reaped=(int(fields[13]) + int(fields[14])) / _TICKS,
    )


def _cmdline(pid: int) -> list[str]:
    try:
        raw = (_PROC / str(pid) / "cmdline").read_bytes()
    except OSError:
        return []
    return [arg.decode(errors="replace") for arg in raw.split(b"\0") if arg]


def _tree(root: int) -> dict[int, Stat]:
    """Every live descendant of ``root`` (not ``root`` itself), by pid."""
    stats = {}
    for entry in _PROC.iterdir():
        if entry.name.isdigit():
            stat = _stat(int(entry.name))
            if stat is not None:
                stats[stat.pid] = stat
    children: dict[int, list[int]] = defaultdict(list)
    for stat in stats.values():
        children[stat.ppid].append(stat.pid)
    found: dict[int, Stat] = {}
    todo = list(children[root])
    while todo:
        pid = todo.pop()
        found[pid] = stats[pid]
        todo.extend(children[pid])
    return found


def _own_part(argv: list[str]) -> str | None:
    """The part a command line names, or None (then its parent's part)."""
    text = " ".join(argv)
    name = Path(argv[0]).name if argv else ""
    if name == "postgres" or text.startswith("postgres:"):
        return "postgres"
    if "tansu" in name:
        return "broker"
    if "dagster-webserver" in text:
        return "dagster webserver"
    if "dagster-daemon" in text:
        return "dagster daemon"
    if re.search(r"\bcode-server start\b", text):
        return "code-server proxy"
    if re.search(r"\bapi grpc\b", text):
        return "code server"
    if "api execute_run" in text:
        return "run worker"
    if "--guard" in argv:
        return "guard"
    if "reminder_pipeline.cli" in text and argv[-1] == "up":
        return "up (exporter, demo feeder)"
    return None


class Meter:
    """The stack's CPU by part, from samples of ``/proc`` (see the module's docstring)."""

    def __init__(self, root: int) -> None:
        self.root = root
        self.parts: dict[int, str] = {}
        self.code_servers: dict[tuple[int, int], str] = {}
        self.prev = self._sample()
        self.start_total = self._total(self.prev)
        self.credit: dict[str, float] = defaultdict(float)

    def _part(self, stat: Stat, tree: dict[int, Stat], seen: dict[int, str]) -> str:
        """The part of ``stat``'s process, decided again at each sample: a child is a copy of
        its parent between fork and exec."""
        if stat.pid in seen:
            return seen[stat.pid]
        argv = _cmdline(stat.pid)
        part = _own_part(argv)
        parent = tree.get(stat.ppid)
        parent_part = self._part(parent, tree, seen) if parent is not None else None
        under_code_server = (parent_part or "").startswith("code server")
        if part is None and under_code_server and "multiprocessing.spawn" in " ".join(argv):
            part = "run worker"  # the code server spawns each run's process
        if part == "code server" and not under_code_server:
            # An `api grpc` process (the one that loads the definitions), not its copy that is
            # about to exec a run worker.
            self.code_servers[(stat.pid, stat.started)] = parent_part or "?"
            if parent_part in ("dagster daemon", "dagster webserver"):
                part = f"code server ({parent_part.split()[-1]}'s)"
        if part is None:
            part = parent_part or (Path(argv[0]).name if argv else "?")
        seen[stat.pid] = part
        if argv or stat.pid not in self.parts:  # a zombie has none: keep what it was
            self.parts[stat.pid] = part
        return part

    def _sample(self) -> dict[int, Stat]:
        tree = _tree(self.root)
        seen: dict[int, str] = {}
        for stat in tree.values():
            self._part(stat, tree, seen)
        return tree

    def _total(self, tree: dict[int, Stat]) -> float:
        reaped_here = os.times()
        return (
            sum(s.own + s.reaped for s in tree.values())
            + reaped_here.children_user
            + reaped_here.children_system
        )

    def step(self) -> None:
        cur = self._sample()
        gone: dict[int, list[Stat]] = defaultdict(list)
        for pid, before in self.prev.items():
            now = cur.get(pid)
            if now is None or now.started != before.started:
                gone[before.ppid].append(before)
        for pid, new in cur.items():
            old = self.prev.get(pid)
            part = self.parts.get(pid, "?")
            if old is None or old.started != new.started:  # born since the last sample
                self.credit[part] += new.own + new.reaped
                continue
            self.credit[part] += new.own - old.own
            jump = new.reaped - old.reaped
            if jump <= 0:
                continue
            # Children reaped since: what their last samples had not seen yet goes to their part
            # (to this process's part for children born and reaped between two samples).
            dead = gone.pop(pid, [])
            unseen = jump - sum(d.own + d.reaped for d in dead)
            part_of_dead = self.parts.get(dead[0].pid, part) if dead else part
            self.credit[part_of_dead] += max(unseen, 0.0)
        self.prev = cur

    def result(self) -> dict[str, float]:
        total = self._total(self.prev) - self.start_total
        parts = dict(self.credit)
        parts[UNATTRIBUTED] = total - sum(parts.values())
        return {"total": total, **parts}


def _machine_busy() -> tuple[float, float]:
    """(busy, all) jiffies of the whole machine, from /proc/stat."""
    values = [int(v) for v in (_PROC / "stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = values[3] + values[4]
    return sum(values) - idle, sum(values)


def _heartbeat_lines(home: Path) -> int:
    count = 0
    for log in (home / "dagster_home" / "process-logs").glob("*.log"):
        with contextlib.suppress(OSError):
            count += log.read_text(errors="replace").count(HEARTBEAT_LINE)
    return count


def _pg_sessions(port: str) -> dict[str, int]:
    """Sessions so far per database of the embedded PostgreSQL on ``port`` (its superuser, as
    ``up`` connects); empty when it cannot be read."""
    import psycopg

    from reminder_pipeline.local.postgres import PG_SUPERUSER

    query = "SELECT datname, sessions FROM pg_stat_database WHERE datname IS NOT NULL"
    try:
        with psycopg.connect(
            host="127.0.0.1", port=port, user=PG_SUPERUSER, dbname="postgres", connect_timeout=10
        ) as conn:
            return {str(name): int(count) for name, count in conn.execute(query).fetchall()}
    except psycopg.Error:
        return {}


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _env(home: Path, tree: Path | None) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("DATABASE_URL", "KAFKA_BOOTSTRAP_SERVERS", "DAGSTER_PG_URL", "DAGSTER_HOME")
    }
    env.update(
        REMINDER_PIPELINE_HOME=str(home),
        REMINDER_EMBEDDED_PG_PORT=str(_free_port()),
        REMINDER_EMBEDDED_BROKER_PORT=str(_free_port()),
        DAGSTER_WEBSERVER_PORT=str(_free_port()),
        REMINDER_METRICS_PORT=str(_free_port()),
        REMINDER_PROGRESS_SECONDS="3600",
    )
    if tree is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(tree), env.get("PYTHONPATH")]))
    return env


@contextlib.contextmanager
def _up(home: Path, tree: Path | None, env: dict[str, str]) -> Iterator[subprocess.Popen[str]]:
    """``reminder-pipeline up`` under ``home``, until its ``Dagster UI:`` line; stopped after."""
    out = (home.parent / "up.out").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "reminder_pipeline.cli", "up"],
        env=env,
        cwd=tree or REPO_ROOT,
        stdin=subprocess.DEVNULL,
        stdout=out,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 300
        while "Dagster UI:" not in (home.parent / "up.out").read_text(errors="replace"):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(
                    f"up did not get ready (exit {proc.poll()}): "
                    + (home.parent / "up.out").read_text(errors="replace")[-2000:]
                )
            time.sleep(0.5)
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(120)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
        out.close()
        _reap()


def _reap() -> None:
    """Reap what was reparented to us (we are the subreaper) and has exited."""
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass


def measure(
    minutes: float, warmup: float, interval: float, tree: Path | None, keep: bool
) -> dict[str, object]:
    """Start the stack, measure it for ``minutes``, stop it; the figures."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise SystemExit("cannot become a child subreaper (Linux only)")
    workdir = Path(tempfile.mkdtemp(prefix="rp_idle_cpu_"))
    home = workdir / "home"
    label = str(tree) if tree else "this checkout"
    try:
        progress(f"starting up ({label}) under {home}")
        env = _env(home, tree)
        with _up(home, tree, env) as proc:
            progress(f"stack ready; warming up {warmup:.0f} s")
            time.sleep(warmup)
            pg_port = env["REMINDER_EMBEDDED_PG_PORT"]
            sessions_before = _pg_sessions(pg_port)
            load_before = os.getloadavg()
            meter = Meter(os.getpid())
            beats_before = _heartbeat_lines(home)
            busy0, all0 = _machine_busy()
            started = time.monotonic()
            end = started + minutes * 60
            next_line = started + 60
            while time.monotonic() < end:
                time.sleep(interval)
                meter.step()
                _reap()
                if proc.poll() is not None:
                    raise SystemExit(f"up exited during the measurement ({proc.returncode})")
                if time.monotonic() >= next_line:
                    so_far = meter.result()["total"] / (time.monotonic() - started) * 100
                    progress(
                        f"{(time.monotonic() - started) / 60:.0f} min: {so_far:.1f} % of a core"
                    )
                    next_line += 60
            elapsed = time.monotonic() - started
            busy1, all1 = _machine_busy()
            beats = _heartbeat_lines(home) - beats_before
            result = meter.result()
            servers = len(meter.code_servers)
            load_after = os.getloadavg()
            sessions_after = _pg_sessions(pg_port)
        cpus = os.cpu_count() or 1
        return {
            "tree": label,
            "seconds": round(elapsed, 1),
            "percent_of_one_core": {k: round(v / elapsed * 100, 2) for k, v in result.items()},
            "cpu_seconds_per_minute": round(result["total"] / elapsed * 60, 2),
            "no_heartbeat_lines": beats,
            "code_server_processes_seen": servers,
            "machine_busy_percent_of_all_cores": round((busy1 - busy0) / (all1 - all0) * 100, 1),
            "load_average_1min": [round(load_before[0], 2), round(load_after[0], 2)],
            "pg_new_sessions_per_minute": {
                name: round((count - sessions_before[name]) / elapsed * 60, 1)
                for name, count in sorted(sessions_after.items())
                if name in sessions_before and count > sessions_before[name]
            },
            "cpus": cpus,
        }
    finally:
        if keep:
            progress(f"kept {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)


def _print(result: dict[str, object]) -> None:
    percent = result["percent_of_one_core"]
    assert isinstance(percent, dict)
    print(f"stack: {result['tree']}, {result['seconds']} s measured")
    print(
        f"  total: {percent['total']:.1f} % of one core "
        f"({result['cpu_seconds_per_minute']} CPU-s a minute)"
    )
    for part, value in sorted(percent.items(), key=lambda kv: -kv[1]):
        if part != "total":
            print(f"    {part:<30} {value:6.2f} %")
    print(f"  '{HEARTBEAT_LINE}' lines: {result['no_heartbeat_lines']}")
    print(f"  code server processes seen: {result['code_server_processes_seen']}")
    sessions = result["pg_new_sessions_per_minute"]
    assert isinstance(sessions, dict)
    print(
        "  new PostgreSQL sessions a minute: "
        + (", ".join(f"{name} {count}" for name, count in sessions.items()) or "none read")
    )
    print(
        f"  machine busy meanwhile: {result['machine_busy_percent_of_all_cores']} % of "
        f"{result['cpus']} cores; load average {result['load_average_1min']} (start, end)"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.idle_cpu", description=__doc__)
    parser.add_argument("--minutes", type=float, default=5.0, help="measured minutes (5)")
    parser.add_argument("--warmup", type=float, default=60.0, help="seconds after ready (60)")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between samples")
    parser.add_argument("--tree", type=Path, help="run `up` from this checkout (PYTHONPATH)")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    parser.add_argument("--keep-home", action="store_true", help="keep the temp home (logs)")
    args = parser.parse_args(argv)
    tree = args.tree.resolve() if args.tree else None
    result = measure(args.minutes, args.warmup, args.interval, tree, args.keep_home)
    _print(result)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
