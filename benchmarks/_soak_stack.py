"""The soak's stack and its faults: embedded PostgreSQL (application + Dagster storage), a second
embedded PostgreSQL for the consumer's shared de-dup store (made by the shipped initdb script), the broker, ``dagster-daemon run``
with the shipped schedules, and ``reminder-pipeline consume --dedup-url``, all on free ports in a
temp dir; and the code that injects each fault kind of ``_soak_plan.KINDS``.

The de-dup store has a server of its own so that "the de-dup database restarted" and "PostgreSQL
restarted" are different faults (in production they are different databases, often different
servers). A supervisor thread restarts the daemon or the consumer when either exits on its own
(what systemd or Kubernetes would do); those restarts are counted in the report.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import psycopg

from reminder_pipeline.local.servers import EmbeddedBroker, EmbeddedPostgres, free_port

from ._infra import Servers, progress
from .consumer import dedup_database
from .peak import prepare_dagster, run_workers, spawn_daemon

#: (due rows still Pending, rows sent in the last 5 s): both > 0 while a drain is under way.
MID_DRAIN = """
SELECT count(*) FILTER (WHERE status = 'Pending' AND due_at <= now()),
       count(*) FILTER (WHERE status = 'Sent' AND sent_at > now() - interval '5 seconds')
  FROM event_reminders WHERE due_at > now() - interval '10 minutes'
"""


#: Due rows still Pending for a kill to count as mid-drain: more than a stray row a cancel holds,
#: so the worker dies with a burst's later batches still to go.
MID_DRAIN_PENDING = 20


@dataclass
class FaultRecord:
    """One injected (or attempted) fault: when it began and ended (epoch), and what happened."""

    kind: str
    planned_s: float
    started: float = 0.0
    ended: float = 0.0
    injected: bool = False
    detail: str = ""


@dataclass
class Notified:
    """The consumer's printed notifications: (arrival time, reminder id, recipient id)."""

    lines: list[tuple[float, str, str]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


def _parse(line: str) -> tuple[str, str] | None:
    """(reminder id, recipient id) of a StdoutSink line, else None."""
    parts = line.split()
    try:
        recipient = parts[parts.index("to") + 2]
        reminder = next(p for p in parts if p.startswith("reminder=")).split("=", 1)[1]
    except (ValueError, IndexError, StopIteration):
        return None
    return reminder, recipient


class Stack:
    """Starts, breaks and stops the soak's processes; every server on a free port."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.pg = EmbeddedPostgres(data_dir=workdir / "pg" / "data", port=free_port())
        self.dedup_pg = EmbeddedPostgres(data_dir=workdir / "dedup" / "data", port=free_port())
        self.broker = EmbeddedBroker(state_dir=workdir / "broker", port=free_port())
        self.notified = Notified()
        self.supervised_restarts = {"daemon": 0, "consumer": 0}
        self.daemon: subprocess.Popen | None = None
        self.consumer: subprocess.Popen | None = None
        self._lock = threading.RLock()  # no fault restarts a process while the supervisor does
        self._held: set[str] = set()  # processes a fault has taken down on purpose
        self._stopping = threading.Event()
        self._group = f"soak-{uuid.uuid4().hex[:8]}"
        self._exit = contextlib.ExitStack()

    # --- start / stop -------------------------------------------------------------------------

    def start(self) -> None:
        for name, pg in (("PostgreSQL", self.pg), ("de-dup PostgreSQL", self.dedup_pg)):
            progress(f"soak: starting {name} on port {pg.port}")
            pg.start()
        progress(f"soak: starting the broker on port {self.broker.port}")
        bootstrap = self.broker.start()
        self.srv = Servers(self.pg.url("postgres"), bootstrap, self.workdir, embedded=True)
        from reminder_pipeline.messaging.kafka import ensure_topic

        ensure_topic(self.srv.kafka)
        # The shipped initdb script on the de-dup server: its database, table and narrow login.
        self.dedup_url = self._exit.enter_context(dedup_database(self.dedup_pg.url("postgres")))
        env, self.home, self.app_db, self.instance = prepare_dagster(self.srv, "soak")
        self.env = env
        self.app_dsn = self.srv.dsn(self.app_db)
        self.daemon = spawn_daemon(self.env, self.home)
        self.consumer = self._spawn_consumer()
        threading.Thread(target=self._supervise, name="soak-supervisor", daemon=True).start()

    def stop(self) -> None:
        self._stopping.set()
        with self._lock:
            for proc in (self.consumer, self.daemon):
                if proc is not None and proc.poll() is None:
                    _signal_group(proc, signal.SIGTERM)
            for proc in (self.consumer, self.daemon):
                if proc is None:
                    continue
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    _signal_group(proc, signal.SIGKILL)
                    proc.wait(10)
        with contextlib.suppress(Exception):
            self.instance.dispose()  # type: ignore[attr-defined]
        with contextlib.suppress(Exception):
            self._exit.close()
        with contextlib.suppress(Exception):
            pid = self.broker.pid()
            if pid:
                os.kill(pid, signal.SIGCONT)  # never leave it stopped
        for server in (self.broker, self.dedup_pg, self.pg):
            with contextlib.suppress(Exception):
                server.stop()

    def _spawn_consumer(self) -> subprocess.Popen:
        exe = Path(sys.executable).with_name("reminder-pipeline")
        env = {
            **self.env,
            "REMINDER_PIPELINE_HOME": str(self.workdir / "consumer_home"),
            "REMINDER_CONSUMER_DEDUP_URL": self.dedup_url,  # not on the command line: a password
        }
        log = (self.workdir / "consumer.log").open("ab")
        proc = subprocess.Popen(
            [str(exe), "consume", "--group-id", self._group],
            env=env,
            stdout=subprocess.PIPE,
            stderr=log,
            start_new_session=True,
        )
        threading.Thread(target=self._read, args=(proc,), daemon=True).start()
        return proc

    def _read(self, proc: subprocess.Popen) -> None:
        assert proc.stdout is not None
        for raw in proc.stdout:
            parsed = _parse(raw.decode(errors="replace"))
            if parsed is not None:
                with self.notified.lock:
                    self.notified.lines.append((time.time(), *parsed))

    def _supervise(self) -> None:
        while not self._stopping.wait(1.0):
            with self._lock:
                if self._stopping.is_set():
                    return
                if "daemon" not in self._held and self.daemon and self.daemon.poll() is not None:
                    progress(f"soak: the daemon exited ({self.daemon.returncode}); restarting it")
                    self.supervised_restarts["daemon"] += 1
                    _signal_group(self.daemon, signal.SIGKILL)  # its code server, its runs
                    self.daemon = spawn_daemon(self.env, self.home)
                if (
                    "consumer" not in self._held
                    and self.consumer
                    and self.consumer.poll() is not None
                ):
                    progress(f"soak: the consumer exited ({self.consumer.returncode}); restarting")
                    self.supervised_restarts["consumer"] += 1
                    self.consumer = self._spawn_consumer()

    # --- faults -------------------------------------------------------------------------------

    def inject(self, record: FaultRecord, down_s: float, deadline: float) -> None:
        """Inject ``record.kind``; returns when the fault is over (server back, process restarted)."""
        record.started = time.time()
        getattr(self, f"_{record.kind}")(record, down_s, deadline)
        record.ended = time.time()

    def _worker_kill(self, record: FaultRecord, _down: float, deadline: float) -> None:
        """SIGKILL the dispatch run's worker between two batches of a drain: some rows due now
        already Sent, others still Pending (a burst takes several batches of 200)."""
        conn: psycopg.Connection | None = None
        try:
            while time.time() < deadline:
                daemon = self.daemon
                workers = run_workers(daemon.pid) if daemon else []
                if not workers:
                    time.sleep(0.2)
                    continue
                try:
                    if conn is None:
                        conn = psycopg.connect(self.app_dsn, autocommit=True, connect_timeout=5)
                    row = conn.execute(MID_DRAIN).fetchone()
                except psycopg.Error:
                    conn = None
                    time.sleep(0.5)
                    continue
                if row and row[0] >= MID_DRAIN_PENDING and row[1] > 0:
                    for worker in workers:
                        with contextlib.suppress(Exception):
                            worker.kill()
                    record.started = time.time()
                    record.injected = True
                    record.detail = (
                        f"{len(workers)} run worker(s) killed with {row[1]} rows just sent and "
                        f"{row[0]} due still Pending"
                    )
                    return
                time.sleep(0.02)
        finally:
            if conn is not None:
                conn.close()
        record.detail = "no run worker caught mid-drain before the deadline"

    def _daemon_kill(self, record: FaultRecord, down: float, _deadline: float) -> None:
        with self._lock:
            self._held.add("daemon")
            assert self.daemon is not None
            _signal_group(self.daemon, signal.SIGKILL)
            self.daemon.wait(30)
        record.injected = True
        time.sleep(down)
        with self._lock:
            self.daemon = spawn_daemon(self.env, self.home)
            self._held.discard("daemon")
        record.detail = f"daemon group SIGKILLed, restarted after {down:.1f} s"

    def _restart(self, pg: EmbeddedPostgres, mode: str, record: FaultRecord, down: float) -> None:
        pg.stop(mode)
        record.injected = True
        time.sleep(down)
        pg.start()
        record.detail = f"pg_ctl stop -m {mode}, {down:.1f} s down, started"

    def _postgres_restart_fast(self, record: FaultRecord, down: float, _deadline: float) -> None:
        self._restart(self.pg, "fast", record, down)

    def _postgres_restart_immediate(
        self, record: FaultRecord, down: float, _deadline: float
    ) -> None:
        self._restart(self.pg, "immediate", record, down)

    def _dedup_restart(self, record: FaultRecord, down: float, _deadline: float) -> None:
        self._restart(self.dedup_pg, "fast", record, down)

    def _broker_pause(self, record: FaultRecord, down: float, _deadline: float) -> None:
        pid = self.broker.pid()
        if pid is None:
            record.detail = "broker pid not found"
            return
        os.kill(pid, signal.SIGSTOP)
        record.injected = True
        try:
            time.sleep(down)
        finally:
            os.kill(pid, signal.SIGCONT)
        record.detail = f"SIGSTOP, SIGCONT after {down:.1f} s"

    def _consumer_kill(self, record: FaultRecord, down: float, _deadline: float) -> None:
        with self._lock:
            self._held.add("consumer")
            assert self.consumer is not None
            _signal_group(self.consumer, signal.SIGKILL)
            self.consumer.wait(30)
        record.injected = True
        time.sleep(down)
        with self._lock:
            self.consumer = self._spawn_consumer()
            self._held.discard("consumer")
        record.detail = f"SIGKILLed, restarted after {down:.1f} s"


def _signal_group(proc: subprocess.Popen, sig: signal.Signals) -> None:
    """``sig`` to the process group the child leads (started with ``start_new_session``)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)
