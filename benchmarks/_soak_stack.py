"""The soak's stack and its faults: embedded PostgreSQL (application + Dagster storage) with an
asynchronous streaming replica, a second embedded PostgreSQL for the consumer's shared de-dup
store (made by the shipped initdb script), the broker, ``dagster-daemon run`` with the shipped
schedules, and ``reminder-pipeline consume --dedup-url``, all on free ports in a temp dir; and the
code that injects each fault kind of ``_soak_plan.KINDS``.

The de-dup store has a server of its own so that "the de-dup database restarted" and "PostgreSQL
restarted" are different faults (in production they are different databases, often different
servers). A supervisor thread restarts the daemon or the consumer when either exits on its own
(what systemd or Kubernetes would do); those restarts are counted in the report.

Every process of the stack reaches the application's PostgreSQL through a fault proxy
(``reminder_pipeline_testkit.fault_proxy``, in this process): ``DATABASE_URL`` through one,
Dagster's storage URL through another, the soak's own calendar and checks through a third that is
never faulted. The proxies make the stuck peer, the slowdown and the cut commit, and are re-pointed
at the promoted replica in a failover, the way a DNS or virtual-IP switch would. Packet drops are
real: iptables in the network namespace the whole soak runs in
(``reminder_pipeline_testkit.netns``).
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
from sqlalchemy.engine import make_url

from reminder_pipeline.local.servers import EmbeddedBroker, EmbeddedPostgres, free_port
from reminder_pipeline_testkit.daemon import prepare_dagster, spawn_daemon
from reminder_pipeline_testkit.dedup_store import dedup_database
from reminder_pipeline_testkit.fault_proxy import FaultProxy, pg_url_via
from reminder_pipeline_testkit.held_snapshot import HeldSnapshot
from reminder_pipeline_testkit.replica import ReplicaPair
from reminder_pipeline_testkit.servers import Servers

from ._infra import progress
from ._soak_plan import PACKET_DROP_KINDS
from .peak import run_workers

#: (due rows still Pending, rows sent in the last 5 s): both > 0 while a drain is under way.
MID_DRAIN = """
SELECT count(*) FILTER (WHERE status = 'Pending' AND due_at <= now()),
       count(*) FILTER (WHERE status = 'Sent' AND sent_at > now() - interval '5 seconds')
  FROM event_reminders WHERE due_at > now() - interval '10 minutes'
"""


#: Due rows still Pending for a kill to count as mid-drain: more than a stray row a cancel holds,
#: so the worker dies with a burst's later batches still to go.
MID_DRAIN_PENDING = 20

#: The slowdown: added to every chunk in each direction, so ~200 ms per round trip.
SLOW_DELAY_S = 0.1

#: The silent faults are aimed at a tick (see Stack._aim_at_tick): they start this long before
#: it, and count as holding it only if they last this long after it (a run's work, its publish).
#: So is the long snapshot: held between two ticks, no dispatch would step over what it keeps.
TICK_AIMED_KINDS = frozenset(
    {
        "postgres_drop",
        "broker_drop",
        "dedup_drop",
        "postgres_stuck",
        "postgres_slow",
        "long_snapshot",
    }
)
TICK_LEAD_S = 2.0
TICK_AFTER_S = 8.0

#: The failover: its WAL stream stops this long before a tick; the primary then commits for at
#: most FAILOVER_HOLD_MAX_S, or until FAILOVER_AFTER_SENT_S after its first row Sent since.
FAILOVER_LEAD_S = 2.0
FAILOVER_HOLD_MAX_S = 20.0
FAILOVER_AFTER_SENT_S = 3.0

#: A regex no statement matches: arming it takes back a cut that found no COMMIT in time.
_NO_STATEMENT = rb"(?!)"


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
    """Starts, breaks and stops the soak's processes; every server on a free port.

    ``own_network``: the soak runs in a network namespace of its own, so packets may be dropped
    (never otherwise: the iptables rules would be the host's). ``replica``: start a streaming
    replica for the failover. ``tick_aim_s``: how long a silent fault may wait to hold a tick.
    """

    def __init__(
        self,
        workdir: Path,
        *,
        own_network: bool = False,
        replica: bool = False,
        tick_aim_s: float = 60.0,
    ) -> None:
        self.workdir = workdir
        self.own_network = own_network
        self.tick_aim_s = tick_aim_s
        # The application's PostgreSQL (with Dagster's storage): a primary and its replica when
        # a failover is planned, else one server.
        self.pair = ReplicaPair(workdir / "pg") if replica else None
        self._single = (
            None
            if replica
            else EmbeddedPostgres(data_dir=workdir / "pg" / "data", port=free_port())
        )
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

    @property
    def pg(self) -> EmbeddedPostgres:
        """The application's PostgreSQL server: the primary now."""
        if self.pair is not None:
            return self.pair.primary
        assert self._single is not None
        return self._single

    def start(self) -> None:
        if self.pair is not None:
            progress(f"soak: starting PostgreSQL on port {self.pg.port} and its replica")
            self.pair.start()  # the replica streaming when it returns
        else:
            progress(f"soak: starting PostgreSQL on port {self.pg.port}")
            self.pg.start()
        progress(f"soak: starting de-dup PostgreSQL on port {self.dedup_pg.port}")
        self.dedup_pg.start()
        progress(f"soak: starting the broker on port {self.broker.port}")
        bootstrap = self.broker.start()
        # The primary's own URL for setup (databases, migrations); the stack goes through proxies.
        self.srv = Servers(self.pg.url("postgres"), bootstrap, self.workdir, embedded=True)
        from reminder_pipeline.local.dagster_processes import dagster_storage_url
        from reminder_pipeline.messaging.kafka import ensure_topic

        ensure_topic(self.srv.kafka)
        # The shipped initdb script on the de-dup server: its database, table and narrow login.
        self.dedup_url = self._exit.enter_context(dedup_database(self.dedup_pg.url("postgres")))
        env, self.home, self.app_db, self.instance = prepare_dagster(self.srv, "soak")
        # The stack's databases through the proxies (started here, closed in stop()).
        self.app_proxy = self._proxy(postgres=True)
        self.dagster_proxy = self._proxy(postgres=True)
        self.harness_proxy = self._proxy(postgres=False)
        env["DATABASE_URL"] = pg_url_via(self.srv.url(self.app_db), self.app_proxy)
        env["DAGSTER_PG_URL"] = dagster_storage_url(
            pg_url_via(self.srv.url(self.srv.name("dagster")), self.dagster_proxy)
        )
        self.env = env
        self.app_dsn = (
            make_url(pg_url_via(self.srv.url(self.app_db), self.harness_proxy))
            .set(drivername="postgresql")
            .render_as_string(hide_password=False)
        )
        self.daemon = spawn_daemon(self.env, self.home)
        self.consumer = self._spawn_consumer()
        threading.Thread(target=self._supervise, name="soak-supervisor", daemon=True).start()

    def _proxy(self, *, postgres: bool) -> FaultProxy:
        proxy = FaultProxy(self.pg.port, postgres=postgres).start()
        self._exit.callback(proxy.close)
        return proxy

    @property
    def proxies(self) -> tuple[FaultProxy, ...]:
        return (self.app_proxy, self.dagster_proxy, self.harness_proxy)

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
        for server in (self.broker, self.dedup_pg, self.pair or self.pg):
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

    def inject(
        self, record: FaultRecord, down_s: float, deadline: float, variant: str = ""
    ) -> None:
        """Inject ``record.kind``; returns when the fault is over (server back, process
        restarted)."""
        if record.kind in TICK_AIMED_KINDS:
            self._aim_at_tick(down_s)
        record.started = time.time()
        if record.kind in PACKET_DROP_KINDS and not self.own_network:
            record.detail = "not injected: the soak is not in a network namespace of its own"
        elif record.kind == "cut_commit":
            self._cut_commit(record, variant, deadline)
        else:
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

    def _long_snapshot(self, record: FaultRecord, down: float, _deadline: float) -> None:
        """A REPEATABLE READ snapshot on the application's database, held ``down`` s while the
        load runs (a report, a nightly ``pg_dump``, a replica's ``hot_standby_feedback``): no row
        version or index entry dead since it began can be removed, every due scan steps over
        them; then released. Through the harness's proxy, which no fault touches."""
        snapshot = HeldSnapshot(self.app_dsn, application_name="soak-long-snapshot")
        seen = snapshot.take()
        record.injected = True
        state = None
        try:
            time.sleep(down)
            with contextlib.suppress(psycopg.Error):
                state = snapshot.state(self.app_dsn)
        finally:
            alive = snapshot.release()
        sent = "?"
        with (
            contextlib.suppress(psycopg.Error),
            psycopg.connect(self.app_dsn, autocommit=True, connect_timeout=10) as conn,
        ):
            row = conn.execute(
                "SELECT count(*) FROM event_reminders WHERE status = 'Sent'"
                " AND sent_at >= to_timestamp(%s)",
                (record.started,),
            ).fetchone()
            sent = f"{int(row[0]):,}" if row else "?"
        held = (
            f", its xmin {state['xmin_age']:,} transactions old at the release"
            if state and state.get("xmin_age") is not None
            else ""
        )
        record.detail = (
            f"a REPEATABLE READ snapshot (count(*) saw {seen:,} reminders) held {down:.1f} s"
            f"{held}; {sent} reminders sent meanwhile"
            + ("" if alive else "; its session had ended before the release")
        )

    # --- faults on the network -----------------------------------------------------------------

    def _aim_at_tick(self, down: float) -> None:
        """Start a silent fault so that a tick falls inside it: a dispatch run (its database
        connections, its publish) and the deliveries after it come only on each minute, and a
        fault between two ticks may touch nothing. When ``[now, now + down]`` holds no tick
        (with TICK_AFTER_S after it), wait until TICK_LEAD_S before the next one, if that wait is
        at most ``tick_aim_s`` (a full-scale run: always; a short one: seldom)."""
        to_tick = 60.0 - time.time() % 60.0
        if to_tick + TICK_AFTER_S <= down:
            return
        wait = to_tick - TICK_LEAD_S
        if 0 < wait <= self.tick_aim_s:
            time.sleep(wait)

    def _dropped(self, ports: list[int], record: FaultRecord, down: float, what: str) -> None:
        """Every packet to and from ``ports`` dropped for ``down`` seconds, then let through."""
        from reminder_pipeline_testkit.netns import drop_port, undrop_port

        try:
            for port in ports:
                drop_port(port)
            record.injected = True
            time.sleep(down)
        finally:
            for port in ports:
                with contextlib.suppress(Exception):
                    undrop_port(port)
        record.detail = f"{what} packets dropped both ways for {down:.1f} s (iptables)"

    def _postgres_drop(self, record: FaultRecord, down: float, _deadline: float) -> None:
        # The server's port and the proxies' (each client's side): no ACK anywhere, as when a
        # firewall or a moved address eats them; both the clients and the server see silence.
        ports = [self.pg.port, *(p.port for p in self.proxies)]
        self._dropped(ports, record, down, "PostgreSQL's")

    def _broker_drop(self, record: FaultRecord, down: float, _deadline: float) -> None:
        self._dropped([self.broker.port], record, down, "the broker's")

    def _dedup_drop(self, record: FaultRecord, down: float, _deadline: float) -> None:
        self._dropped([self.dedup_pg.port], record, down, "the de-dup store's")

    def _postgres_stuck(self, record: FaultRecord, down: float, _deadline: float) -> None:
        """``DATABASE_URL``'s peer keeps every socket open (its kernel ACKs) and answers
        nothing; a connection held meanwhile stays silent until its client gives up on it.

        Dagster's storage is left out: dagster-postgres talks psycopg2, whose only bounds are
        libpq's (keepalives, ``tcp_user_timeout``), and a peer that ACKs defeats them (tried:
        the daemon's run queue hung for good); the issue bounds the application's clients."""
        proxy = self.app_proxy
        try:
            proxy.set_mode("stuck")
            record.injected = True
            held = proxy.connections()
            time.sleep(down)
            held_at_end = proxy.connections()  # those made meanwhile are held as well
        finally:
            proxy.set_mode("pass")
        record.detail = (
            f"a stuck peer for {down:.1f} s ({held} connections held silent at its start, "
            f"{held_at_end} at its end)"
        )

    def _postgres_slow(self, record: FaultRecord, down: float, _deadline: float) -> None:
        targets = (self.app_proxy, self.dagster_proxy)
        try:
            for proxy in targets:
                proxy.set_mode("latency", delay=SLOW_DELAY_S)
            record.injected = True
            time.sleep(down)
        finally:
            for proxy in targets:
                proxy.set_mode("pass")
        record.detail = f"+{2 * SLOW_DELAY_S * 1000:.0f} ms per round trip for {down:.1f} s"

    def _failover(self, record: FaultRecord, down: float, deadline: float) -> None:
        """The primary's WAL stops shipping just before a tick, the tick's run commits on it
        (rows Sent, messages published, outbox rows marked), then the primary is SIGKILLed while
        its address goes quiet: every packet to the proxies' ports is dropped, as to a dead
        host's (connections are not closed, nobody is told). After ``down`` s the replica is
        promoted and the proxies re-pointed at it (a DNS or virtual-IP switch) and let through:
        the new primary has lost those commits."""
        from reminder_pipeline_testkit.netns import drop_port, undrop_port

        pair = self.pair
        if pair is None or pair.replica is None:
            record.detail = "no replica to fail over to"
            return
        # The schedule ticks on each minute: stop the stream ~2 s before one, when there is time.
        before_tick = (60.0 - time.time() % 60.0 - FAILOVER_LEAD_S) % 60.0
        if time.time() + before_tick + FAILOVER_HOLD_MAX_S + down < deadline:
            time.sleep(before_tick)
        stopped = record.started = time.time()  # the fault begins when its WAL stops shipping
        pair.stop_shipping()
        sent = self._hold_while_sending(stopped)
        # Not "stuck": a proxy that ACKs and never answers would hold Dagster's storage for good
        # (psycopg2 has only libpq's bounds, which an ACKing peer defeats); a dead host ACKs
        # nothing. The server's own port stays open: the kill's resets reach the proxies, which
        # then reset each client connection once its packets flow again.
        ports = [p.port for p in self.proxies]
        try:
            for port in ports:
                drop_port(port)
            unshipped = pair.kill_primary_unshipped(hold_s=0.0)
            record.injected = True
            time.sleep(down)
            promote_s = pair.promote()
        finally:
            for proxy in self.proxies:
                proxy.retarget(pair.primary.port)
            for port in ports:
                with contextlib.suppress(Exception):
                    undrop_port(port)
        record.detail = (
            f"WAL stopped shipping, {sent} rows Sent on the primary in "
            f"{unshipped.killed_at - stopped:.1f} s, primary SIGKILLed "
            f"({unshipped.lost_wal_bytes:,} bytes of WAL lost), its address silent {down:.1f} s, "
            f"replica promoted in {promote_s:.1f} s, proxies re-pointed"
        )

    def _hold_while_sending(self, since: float) -> int:
        """Until the primary has Sent rows since ``since`` and a few seconds more have passed
        (their messages published, outbox rows marked), at most FAILOVER_HOLD_MAX_S; returns
        how many rows it Sent meanwhile."""
        end = time.time() + FAILOVER_HOLD_MAX_S
        first_sent: float | None = None
        sent = 0
        with (
            contextlib.suppress(psycopg.Error),
            psycopg.connect(self.app_dsn, autocommit=True, connect_timeout=5) as conn,
        ):
            while time.time() < end:
                row = conn.execute(
                    "SELECT count(*) FROM event_reminders WHERE status = 'Sent'"
                    " AND sent_at >= to_timestamp(%s)",
                    (since,),
                ).fetchone()
                sent = int(row[0]) if row else 0
                if sent and first_sent is None:
                    first_sent = time.time()
                if first_sent is not None and time.time() - first_sent >= FAILOVER_AFTER_SENT_S:
                    break
                time.sleep(0.25)
        return sent

    def _cut_commit(self, record: FaultRecord, variant: str, deadline: float) -> None:
        """The next COMMIT on ``DATABASE_URL`` (a dispatch run's batch, relay mark or ledger)
        cut: its client's connection reset before the answer; the server commits or not."""
        commits = variant != "server_rolls_back"
        proxy = self.app_proxy
        before = proxy.cuts_done()
        proxy.cut_after(server_gets_it=commits)
        wait = max(0.0, deadline - time.time())
        if not proxy.wait_cuts(before + 1, wait):
            proxy.cut_after(_NO_STATEMENT, server_gets_it=False)  # disarmed
            record.detail = f"no COMMIT came through the proxy in {wait:.0f} s"
            return
        record.started = time.time()
        record.injected = True
        outcome = "the server committed" if commits else "the server rolled back"
        record.detail = f"a COMMIT cut before its answer reached the client; {outcome}"


def _signal_group(proc: subprocess.Popen, sig: signal.Signals) -> None:
    """``sig`` to the process group the child leads (started with ``start_new_session``)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)
